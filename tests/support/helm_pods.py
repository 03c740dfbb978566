"""Run the Helm chart's rendered pods as Docker containers (no Kubernetes API server
can run on this machine). tests/deploy/test_helm_pods.py drives it.

What a kubelet and the cluster's DNS would do, from the rendered objects only:

* a StatefulSet's pod N (a Deployment's pod) is a container with hostname `<sts>-N`
  (`<deployment>-<hash>`), the pod
  template's command, args, env, user and security context (read-only root file
  system, capabilities dropped, no privilege escalation) and resource limits;
* its names: `<pod>.<svc>` for the headless Service named by `serviceName`
  that selects it, and `<svc>` for every other Service that selects it, as network
  aliases on one private network (a Service whose port is not its target port
  cannot be played this way and is refused);
* volumes: a ConfigMap or projected Secret volume is a directory holding exactly
  the items the pod asks for (a missing key fails, as it would keep the pod
  from starting), an emptyDir a fresh directory, each claim of
  `volumeClaimTemplates` (and each `persistentVolumeClaim` of a Job, by name)
  one Docker volume;
* env: `value`, `fieldRef` (metadata.name, metadata.namespace) and
  `secretKeyRef`;
* a pod's init containers run to completion in order, then its containers (an
  emptyDir, `medium: Memory` too, is one directory they all share, kept across a
  restart of the container as the pod keeps it);
* probes: the kubelet's gRPC health check, plaintext, on the probe's port and
  service, is `snapmesh health` inside the container with no TLS dir.

The Secret the certificate hook Job would create with kubectl (no API server
here) is the manifest its own init containers write; its `kubectl apply`
container is not run. The Service that would reach the controller from outside
(`kubectl port-forward`) is a port published on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from support.polling import WaitTimedOut, wait_for

LABEL = "snapmesh.helm-test"


class PlanError(AssertionError):
    """The rendered objects cannot run as they are (a name, key or claim that does not resolve)."""


def docker(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        said = result.stderr.strip() or result.stdout.strip()[-3000:]  # a command may say why on stdout alone
        raise AssertionError(f"docker {' '.join(args[:3])} ... exited {result.returncode}: {said}")
    return result


def _quantity_memory(text: str) -> str:
    units = {"Ki": "k", "Mi": "m", "Gi": "g"}
    for suffix, docker_unit in units.items():
        if text.endswith(suffix):
            return text[: -len(suffix)] + docker_unit
    return text


def _quantity_cpu(text: str) -> str:
    return str(int(text[:-1]) / 1000) if text.endswith("m") else text


@dataclass
class Pod:
    name: str
    spec: dict
    labels: dict
    hostname: str
    subdomain: str | None
    claims: dict[str, str] = field(default_factory=dict)  # volume name -> claim name


class PodRunner:
    """One private network, its containers and volumes; `close()` removes them all."""

    def __init__(self, objects: list[dict], workdir: Path, namespace: str = "default") -> None:
        self.objects = objects
        self.workdir = workdir
        self.namespace = namespace
        self.id = f"smhelm-{uuid.uuid4().hex[:8]}"
        self.network = self.id
        self.secrets: dict[str, dict[str, bytes]] = {}
        for obj in self._kind("Secret"):
            self.secrets[obj["metadata"]["name"]] = {k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}
        self.volumes: dict[str, str] = {}  # claim name -> docker volume
        self.containers: dict[str, str] = {}  # pod name -> container name
        self.published: dict[str, int] = {}
        self._network_made = False

    # ---------------------------------------------------------------- objects

    def _kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict:
        for obj in self._kind(kind):
            if obj["metadata"]["name"] == name:
                return obj
        raise PlanError(f"no {kind} named {name!r} among the rendered objects")

    def statefulset_pods(self, name: str) -> list[Pod]:
        sts = self.get("StatefulSet", name)
        template = sts["spec"]["template"]
        pods = []
        for ordinal in range(sts["spec"]["replicas"]):
            pod_name = f"{name}-{ordinal}"
            templates = sts["spec"].get("volumeClaimTemplates", [])
            claims = {c["metadata"]["name"]: f"{c['metadata']['name']}-{pod_name}" for c in templates}
            pods.append(Pod(pod_name, template["spec"], template["metadata"].get("labels", {}), pod_name,
                            sts["spec"]["serviceName"], claims))
        return pods

    def deployment_pods(self, name: str) -> list[Pod]:
        """A Deployment's replicas, named as its ReplicaSet would (`<name>-<hash>`)."""
        deployment = self.get("Deployment", name)
        template = deployment["spec"]["template"]
        pods = []
        for _ in range(deployment["spec"].get("replicas", 1)):
            pod_name = f"{name}-{uuid.uuid4().hex[:10]}"
            pods.append(Pod(pod_name, template["spec"], template["metadata"].get("labels", {}), pod_name, None))
        return pods

    def job_pod(self, name: str) -> Pod:
        job = self.get("Job", name)
        template = job["spec"]["template"]
        return Pod(f"{name}-{uuid.uuid4().hex[:5]}", template["spec"], template["metadata"].get("labels", {}),
                   f"{name}-pod", None)

    def aliases(self, pod: Pod) -> list[str]:
        """The DNS names the cluster would give this pod."""
        names = []
        for svc in self._kind("Service"):
            selector = svc["spec"].get("selector") or {}
            if not selector or any(pod.labels.get(k) != v for k, v in selector.items()):
                continue
            svc_name = svc["metadata"]["name"]
            container_ports = {p["name"]: p["containerPort"] for c in pod.spec["containers"] for p in c.get("ports", [])}
            for port in svc["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                target = container_ports.get(target) if isinstance(target, str) else target
                if target is None:
                    raise PlanError(f"Service {svc_name}: targetPort {port.get('targetPort')!r} is no port of pod {pod.name}")
                if target != port["port"]:
                    raise PlanError(f"Service {svc_name}: port {port['port']} -> {target} cannot be played by a network alias")
            names.append(svc_name)
            if svc["spec"].get("clusterIP") == "None" and svc_name == pod.subdomain:
                names.append(f"{pod.hostname}.{svc_name}")
        return names

    # ---------------------------------------------------------------- volumes

    def _dir(self, *parts: str, mode: int = 0o755) -> Path:
        path = self.workdir.joinpath(self.id, *parts)
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, mode)
        return path

    def _write_items(self, directory: Path, data: dict[str, bytes], items: list[dict] | None, what: str,
                     mode: int, gid: int | None) -> None:
        chosen = items if items is not None else [{"key": k, "path": k} for k in data]
        for item in chosen:
            if item["key"] not in data:
                raise PlanError(f"{what}: no key {item['key']!r} (keys: {sorted(data)})")
            target = directory / item["path"]
            target.write_bytes(data[item["key"]])
            os.chmod(target, item.get("mode", mode))
            if gid is not None:
                os.chown(target, 0, gid)

    def _volume_mounts(self, pod: Pod, container: dict) -> list[str]:
        gid = pod.spec.get("securityContext", {}).get("fsGroup")
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        args = []
        for mount in container.get("volumeMounts", []):
            if "subPath" in mount:
                raise PlanError(f"{pod.name}: subPath is not played")
            name, readonly = mount["name"], ",readonly" if mount.get("readOnly") else ""
            if name in pod.claims:
                args += ["--mount", f"type=volume,src={self.claim_volume(pod.claims[name])},dst={mount['mountPath']}{readonly}"]
                continue
            if name not in volumes:
                raise PlanError(f"{pod.name}: volumeMount {name!r} names no volume")
            volume = volumes[name]
            if "persistentVolumeClaim" in volume:
                src = self.claim_volume(volume["persistentVolumeClaim"]["claimName"], create=False)
                readonly = ",readonly" if mount.get("readOnly") or volume["persistentVolumeClaim"].get("readOnly") else ""
                args += ["--mount", f"type=volume,src={src},dst={mount['mountPath']}{readonly}"]
                continue
            args += ["--mount", f"type=bind,src={self._materialize(pod, volume, gid)},dst={mount['mountPath']}{readonly}"]
        return args

    def _materialize(self, pod: Pod, volume: dict, gid: int | None) -> str:
        name = volume["name"]
        directory = self._dir("pods", pod.name, name)
        if "emptyDir" in volume:
            os.chmod(directory, 0o1777)
        elif "configMap" in volume:
            cm = self.get("ConfigMap", volume["configMap"]["name"])
            data = {k: v.encode() for k, v in cm["data"].items()}
            self._write_items(directory, data, volume["configMap"].get("items"), f"ConfigMap {cm['metadata']['name']}",
                              volume["configMap"].get("defaultMode", 0o644), gid)
        elif "secret" in volume:
            secret_name = volume["secret"]["secretName"]
            self._write_items(directory, self._secret(secret_name), volume["secret"].get("items"), f"Secret {secret_name}",
                              volume["secret"].get("defaultMode", 0o644), gid)
        elif "projected" in volume:
            mode = volume["projected"].get("defaultMode", 0o644)
            for source in volume["projected"]["sources"]:
                if "secret" in source:
                    secret_name = source["secret"]["name"]
                    self._write_items(directory, self._secret(secret_name), source["secret"].get("items"),
                                      f"Secret {secret_name}", mode, gid)
                elif "configMap" in source:
                    cm = self.get("ConfigMap", source["configMap"]["name"])
                    self._write_items(directory, {k: v.encode() for k, v in cm["data"].items()}, source["configMap"].get("items"),
                                      f"ConfigMap {cm['metadata']['name']}", mode, gid)
                else:
                    raise PlanError(f"{pod.name}: projected source {sorted(source)} is not played")
        else:
            raise PlanError(f"{pod.name}: volume {name!r} of kind {sorted(volume)} is not played")
        return str(directory)

    def _secret(self, name: str) -> dict[str, bytes]:
        if name not in self.secrets:
            raise PlanError(f"no Secret {name!r} (known: {sorted(self.secrets)})")
        return self.secrets[name]

    def claim_volume(self, claim: str, create: bool = True) -> str:
        if claim not in self.volumes:
            if not create:
                raise PlanError(f"no PersistentVolumeClaim {claim!r} (claims: {sorted(self.volumes)})")
            volume = f"{self.id}-{claim}"
            docker("volume", "create", "--label", f"{LABEL}={self.id}", volume)
            self.volumes[claim] = volume
        return self.volumes[claim]

    # ---------------------------------------------------------------- containers

    def _env(self, pod: Pod, container: dict) -> list[str]:
        args = []
        for var in container.get("env", []):
            if "value" in var:
                value = var["value"]
            elif "fieldRef" in var.get("valueFrom", {}):
                path = var["valueFrom"]["fieldRef"]["fieldPath"]
                value = {"metadata.name": pod.name, "metadata.namespace": self.namespace}.get(path)
                if value is None:
                    raise PlanError(f"{pod.name}: fieldRef {path} is not played")
            elif "secretKeyRef" in var.get("valueFrom", {}):
                ref = var["valueFrom"]["secretKeyRef"]
                data = self._secret(ref["name"])
                if ref["key"] not in data:
                    raise PlanError(f"{pod.name}: env {var['name']}: Secret {ref['name']} has no key {ref['key']!r}")
                value = data[ref["key"]].decode()
            else:
                raise PlanError(f"{pod.name}: env {var['name']} is not played")
            if "$(" in str(value):
                raise PlanError(f"{pod.name}: env {var['name']}: $(VAR) expansion is not played")
            args += ["--env", f"{var['name']}={value}"]
        return args

    def _security(self, pod: Pod, container: dict) -> list[str]:
        psc = pod.spec.get("securityContext", {})
        sc = container.get("securityContext", {})
        args = []
        uid, gid = sc.get("runAsUser", psc.get("runAsUser")), sc.get("runAsGroup", psc.get("runAsGroup"))
        if uid is not None:
            args += ["--user", f"{uid}:{gid if gid is not None else uid}"]
        if psc.get("fsGroup") is not None:
            args += ["--group-add", str(psc["fsGroup"])]
        if sc.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        for cap in sc.get("capabilities", {}).get("drop", []):
            args += ["--cap-drop", cap]
        if sc.get("privileged"):
            args.append("--privileged")
        limits = container.get("resources", {}).get("limits", {})
        if "memory" in limits:
            args += ["--memory", _quantity_memory(str(limits["memory"]))]
        if "cpu" in limits:
            args += ["--cpus", _quantity_cpu(str(limits["cpu"]))]
        return args

    def _ensure_network(self) -> None:
        if not self._network_made:
            docker("network", "create", "--label", f"{LABEL}={self.id}", self.network)
            self._network_made = True

    def _run_args(self, pod: Pod, container: dict, name: str, aliases: list[str], publish: dict[int, int]) -> list[str]:
        self._ensure_network()
        args = ["--name", name, "--label", f"{LABEL}={self.id}", "--hostname", pod.hostname, "--network", self.network]
        for alias in aliases:
            args += ["--network-alias", alias]
        for container_port, host_port in publish.items():
            args += ["--publish", f"127.0.0.1:{host_port}:{container_port}"]
        args += self._security(pod, container) + self._env(pod, container) + self._volume_mounts(pod, container)
        command, rest = container.get("command"), list(container.get("args", []))
        if command:
            args += ["--entrypoint", command[0], container["image"], *command[1:], *rest]
        else:
            args += [container["image"], *rest]
        return args

    def start(self, pod: Pod, publish: dict[int, int] | None = None) -> str:
        """Run a long-running pod's init containers to completion, in order (one that
        fails is an AssertionError with its logs, as it would keep the pod from starting),
        then start its one container; returns the container name."""
        for init in pod.spec.get("initContainers", []):
            code, logs = self._run_to_completion(pod, init, timeout=120)
            if code != 0:
                raise AssertionError(f"pod {pod.name}: init container {init['name']} exited {code}:\n{logs}")
        [container] = pod.spec["containers"]
        name = f"{self.id}-{pod.name}"
        docker("run", "-d", *self._run_args(pod, container, name, self.aliases(pod), publish or {}))
        self.containers[pod.name] = name
        return name

    def run_job(self, pod: Pod, skip: tuple[str, ...] = (), timeout: float = 300) -> list[tuple[str, int, str]]:
        """A Job's pod: init containers in order, then the containers; each one's (name, exit code, logs)."""
        results = []
        for container in [*pod.spec.get("initContainers", []), *pod.spec["containers"]]:
            if container["name"] in skip:
                continue
            code, logs = self._run_to_completion(pod, container, timeout=timeout)
            results.append((container["name"], code, logs))
            if code != 0:
                break
        return results

    def _run_to_completion(self, pod: Pod, container: dict, timeout: float) -> tuple[int, str]:
        """One container of the pod run until it exits, then removed: its exit code and logs."""
        name = f"{self.id}-{pod.name}-{container['name']}"
        docker("run", "-d", *self._run_args(pod, container, name, [], {}))
        try:
            code = int(docker("wait", name, timeout=timeout).stdout.strip())
            logs = docker("logs", name, check=False)
        finally:  # -v: the image's VOLUME /data gives each run an anonymous volume
            docker("rm", "-f", "-v", name, check=False)
        return code, logs.stdout + logs.stderr

    def job_dir(self, pod: Pod, volume: str) -> Path:
        return self.workdir / self.id / "pods" / pod.name / volume

    def add_secret_manifest(self, path: Path) -> str:
        secret = json.loads(path.read_text())
        assert secret["kind"] == "Secret", secret.get("kind")
        name = secret["metadata"]["name"]
        if name not in self.secrets:
            raise PlanError(f"the manifest fills Secret {name!r}, which the chart does not render")
        # `kubectl apply` of the manifest onto the rendered, empty Secret.
        self.secrets[name] = {**self.secrets[name], **{k: base64.b64decode(v) for k, v in secret["data"].items()}}
        return name

    def play_cert_manager(self) -> list[str]:
        """What cert-manager would do with the rendered Certificates: one CA (the
        chart's self-signed Issuer chain), and for each leaf Certificate a Secret
        `spec.secretName` with tls.crt, tls.key (its privateKey settings) and ca.crt."""
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        from snapmesh.settings import devcerts

        ca_key, ca_cert = devcerts.make_ca("cert-manager stand-in CA")
        ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
        usages = {"server auth": ExtendedKeyUsageOID.SERVER_AUTH, "client auth": ExtendedKeyUsageOID.CLIENT_AUTH}
        made = []
        now = datetime.datetime.now(datetime.timezone.utc)
        for cert_obj in self._kind("Certificate"):
            spec = cert_obj["spec"]
            if spec.get("isCA"):
                continue
            private = spec.get("privateKey", {})
            if (private.get("algorithm"), private.get("size")) != ("ECDSA", 256):
                raise PlanError(f"Certificate {cert_obj['metadata']['name']}: privateKey {private} is not played")
            key = ec.generate_private_key(ec.SECP256R1())
            names = [x509.DNSName(n) for n in spec.get("dnsNames", [])]
            names += [x509.IPAddress(ipaddress.ip_address(a)) for a in spec.get("ipAddresses", [])]
            cert = (
                x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, spec["commonName"])]))
                .issuer_name(ca_cert.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.ExtendedKeyUsage([usages[u] for u in spec.get("usages", []) if u in usages]),
                               critical=False)
                .sign(ca_key, hashes.SHA256())
            )
            key_format = (serialization.PrivateFormat.PKCS8 if private.get("encoding") == "PKCS8"
                          else serialization.PrivateFormat.TraditionalOpenSSL)
            self.secrets[spec["secretName"]] = {
                "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
                "tls.key": key.private_bytes(serialization.Encoding.PEM, key_format, serialization.NoEncryption()),
                "ca.crt": ca_pem,
            }
            made.append(spec["secretName"])
        return made

    # ---------------------------------------------------------------- the kubelet's side

    def probe(self, pod_name: str, which: str = "readinessProbe") -> bool:
        """The pod's gRPC probe as the kubelet runs it: plaintext, on its port and service."""
        pod_spec = self._pod_spec(pod_name)
        grpc_probe = pod_spec["containers"][0][which]["grpc"]
        cmd = ["exec", "--env", "SNAPMESH_TLS_DIR=", self.containers[pod_name], "snapmesh", "health",
               f"127.0.0.1:{grpc_probe['port']}", "--timeout", "2"]
        if grpc_probe.get("service"):
            cmd += ["--service", grpc_probe["service"]]
        return docker(*cmd, check=False, timeout=30).returncode == 0

    def _pod_spec(self, pod_name: str) -> dict:
        for sts in self._kind("StatefulSet"):
            if re.fullmatch(re.escape(sts["metadata"]["name"]) + r"-\d+", pod_name):
                return sts["spec"]["template"]["spec"]
        raise PlanError(f"no StatefulSet makes pod {pod_name}")

    def wait_ready(self, pods: list[str], timeout: float = 120) -> None:
        waiting = list(pods)

        def all_ready() -> bool:
            waiting[:] = [p for p in waiting if not self.probe(p)]
            for pod in waiting:
                state = docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", self.containers[pod]).stdout.split()
                if state[0] == "exited":
                    raise AssertionError(f"pod {pod} exited {state[1]}:\n{self.logs(pod)}")
            return not waiting

        try:
            wait_for(all_ready, timeout=timeout, interval=1, what=f"pods {pods} ready")
        except WaitTimedOut:
            logs = "\n".join(self.logs(p) for p in waiting)
            raise AssertionError(f"not ready after {timeout:.0f} s: {waiting}\n{logs}") from None

    def logs(self, pod_name: str) -> str:
        result = docker("logs", "--tail", "40", self.containers[pod_name], check=False)
        return f"--- {pod_name}\n{result.stdout}{result.stderr}"

    def close(self) -> None:
        """Remove every container, volume and network this runner made (also after a failure)."""
        found = docker("ps", "-aq", "--filter", f"label={LABEL}={self.id}", check=False).stdout.split()
        if found:
            docker("rm", "-f", "-v", *found, check=False)
        volumes = docker("volume", "ls", "-q", "--filter", f"label={LABEL}={self.id}", check=False).stdout.split()
        if volumes:
            docker("volume", "rm", "-f", *volumes, check=False)
        docker("network", "rm", self.network, check=False)
        shutil.rmtree(self.workdir / self.id, ignore_errors=True)

    def leftovers(self) -> list[str]:
        return (docker("ps", "-aq", "--filter", f"label={LABEL}={self.id}", check=False).stdout.split()
                + docker("volume", "ls", "-q", "--filter", f"label={LABEL}={self.id}", check=False).stdout.split()
                + docker("network", "ls", "-q", "--filter", f"name=^{self.network}$", check=False).stdout.split())
