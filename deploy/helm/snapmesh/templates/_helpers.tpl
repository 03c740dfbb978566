{{/* Names: the release name, or <release>-snapmesh. */}}
{{- define "snapmesh.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "snapmesh.nodes" -}}{{ include "snapmesh.fullname" . }}-node{{- end -}}
{{- define "snapmesh.nodesService" -}}{{ include "snapmesh.fullname" . }}-nodes{{- end -}}
{{- define "snapmesh.ui" -}}{{ include "snapmesh.fullname" . }}-ui{{- end -}}
{{- define "snapmesh.controller" -}}{{ include "snapmesh.fullname" . }}-controller{{- end -}}
{{- define "snapmesh.tlsSecret" -}}{{ default (printf "%s-tls" (include "snapmesh.fullname" .)) .Values.tls.existingSecret }}{{- end -}}
{{- define "snapmesh.tokenSecret" -}}{{ default (printf "%s-token" (include "snapmesh.fullname" .)) .Values.auth.existingSecret }}{{- end -}}

{{- define "snapmesh.labels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "snapmesh.commonLabels" . }}
{{- end -}}

{{- define "snapmesh.commonLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A pod template's labels: (dict "ctx" $ "component" "node") */}}
{{- define "snapmesh.podLabels" -}}
{{ include "snapmesh.commonLabels" .ctx }}
{{- with .ctx.Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{ include "snapmesh.selectorLabels" . }}
{{- end -}}

{{- define "snapmesh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ default (include "snapmesh.fullname" .) .Values.serviceAccount.name }}
{{- else -}}
{{ default "default" .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{/* Who runs a pod: the ServiceAccount, its token mounted only when asked. */}}
{{- define "snapmesh.podIdentity" -}}
serviceAccountName: {{ include "snapmesh.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automount }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "node") */}}
{{- define "snapmesh.selectorLabels" -}}
app.kubernetes.io/name: {{ default .ctx.Chart.Name .ctx.Values.nameOverride }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image: (dict "image" .Values.image "ctx" $); an empty tag is the chart's appVersion. */}}
{{- define "snapmesh.image" -}}{{ printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}{{- end -}}

{{/* The image of the pods that run or show the app: app.image (a user's, built FROM
snapmesh's with their module) when its repository is set, else image. */}}
{{- define "snapmesh.appImage" -}}
{{- $image := ternary .Values.app.image .Values.image (ne .Values.app.image.repository "") -}}
{{ include "snapmesh.image" (dict "image" $image "ctx" .) }}
{{- end -}}
{{- define "snapmesh.appPullPolicy" -}}
{{ ternary .Values.app.image.pullPolicy .Values.image.pullPolicy (ne .Values.app.image.repository "") }}
{{- end -}}

{{/* The app every process is given (nothing for the bank): the nodes, the controller, the page, reconcile. */}}
{{- define "snapmesh.appEnv" -}}
{{- if .Values.app.module }}
- name: SNAPMESH_APP
  value: {{ .Values.app.module | quote }}
- name: SNAPMESH_APP_PARAMS
  value: {{ toJson .Values.app.params | quote }}
{{- end }}
{{- end -}}

{{/* A node's id is node-<ordinal of its pod>. */}}
{{- define "snapmesh.nodeIds" -}}
{{- range $i := until (int .Values.nodes.replicas) }}node-{{ $i }} {{ end -}}
{{- end -}}

{{/* The cluster file: the one source of node ids, DNS names and ports. */}}
{{- define "snapmesh.clusterToml" -}}
{{- $nodes := include "snapmesh.nodes" . -}}
{{- $svc := include "snapmesh.nodesService" . -}}
# Rendered by the snapmesh Helm chart from its values. In the pods
# SNAPMESH_DATA_DIR=/data (the pod's volume) and SNAPMESH_BIND_HOST=0.0.0.0.
data_dir = "/data"
initial_balance = {{ int .Values.cluster.initialBalance }}
snapshot_mode = {{ .Values.cluster.snapshotMode | quote }}
channel_bound = {{ int .Values.cluster.channelBound }}
segment_records = {{ int .Values.cluster.segmentRecords }}
nodes = [
{{- range $i := until (int .Values.nodes.replicas) }}
    { id = "node-{{ $i }}", host = "{{ $nodes }}-{{ $i }}.{{ $svc }}", port = {{ int $.Values.nodes.port }}, metrics_port = {{ int $.Values.nodes.metricsPort }} },
{{- end }}
]

[controller]
host = {{ include "snapmesh.controller" . | quote }}
port = {{ int .Values.controller.port }}
metrics_port = {{ int .Values.controller.metricsPort }}
snapshot_deadline_s = {{ .Values.cluster.snapshotDeadlineSeconds }}
{{- end -}}

{{/*
The projected TLS volume of a pod: CA, the certificate and key of each name in
.names, and the token; laid out as `snapmesh certs` writes them (SNAPMESH_TLS_DIR).
(dict "ctx" $ "names" (list ...) ["volume" "tls"] ["noToken" true]): .volume names it
(default tls); noToken leaves the token out (a pod that only reads).
*/}}
{{- define "snapmesh.tlsVolume" -}}
{{- $ctx := .ctx -}}
- name: {{ default "tls" .volume }}
  projected:
    defaultMode: 0440
    sources:
{{- if eq $ctx.Values.tls.source "certManager" }}
{{- range $i, $name := .names }}
      - secret:
          name: {{ include "snapmesh.fullname" $ctx }}-tls-{{ $name }}
          items:
            {{- if eq $i 0 }}
            - {key: ca.crt, path: ca.pem}
            {{- end }}
            - {key: tls.crt, path: {{ $name }}.pem}
            - {key: tls.key, path: {{ $name }}-key.pem}
{{- end }}
{{- else }}
      - secret:
          name: {{ include "snapmesh.tlsSecret" $ctx }}
          items:
            - {key: ca.pem, path: ca.pem}
            {{- range $name := .names }}
            - {key: {{ $name }}.pem, path: {{ $name }}.pem}
            - {key: {{ $name }}-key.pem, path: {{ $name }}-key.pem}
            {{- end }}
{{- end }}
{{- if not .noToken }}
      - secret:
          name: {{ include "snapmesh.tokenSecret" $ctx }}
          items:
            - {key: token, path: token}
{{- end }}
{{- end -}}

{{/* The environment every snapmesh server shares. */}}
{{- define "snapmesh.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef: {fieldPath: metadata.name}
- name: SNAPMESH_DATA_DIR
  value: /data
- name: SNAPMESH_BIND_HOST
  value: 0.0.0.0
- name: SNAPMESH_HEALTH_PORT
  value: {{ .Values.healthPort | quote }}
{{- if .Values.tls.enabled }}
- name: SNAPMESH_TLS_DIR
  value: /tls
{{- end }}
{{- include "snapmesh.appEnv" . }}
{{- end -}}

{{/* Kubelet gRPC probes on the health port: (dict "ctx" $ "service" "snapmesh.v1.Node") */}}
{{- define "snapmesh.probes" -}}
{{- $p := .ctx.Values.probes -}}
startupProbe:
  grpc: {port: {{ int .ctx.Values.healthPort }}}
  periodSeconds: {{ $p.startup.periodSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
  timeoutSeconds: {{ $p.startup.timeoutSeconds }}
readinessProbe:
  grpc: {port: {{ int .ctx.Values.healthPort }}, service: {{ .service }}}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
livenessProbe:
  grpc: {port: {{ int .ctx.Values.healthPort }}}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
{{- end -}}

{{- define "snapmesh.podAnnotations" -}}
{{- with .ctx.Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
checksum/cluster: {{ include "snapmesh.clusterToml" .ctx | sha256sum }}
{{- if .ctx.Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .metricsPort | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* Values the schema cannot check alone; fails with the reason. */}}
{{- define "snapmesh.validate" -}}
{{- /* The 0.1 chart's snake_case names: the schema lets them through so the hint can name the new one. */ -}}
{{- range $old, $new := dict "snapshot_mode" "snapshotMode" "channel_bound" "channelBound" "segment_records" "segmentRecords" -}}
{{- if hasKey $.Values.cluster $old -}}
{{- fail (printf "cluster.%s was renamed cluster.%s (values are camelCase since chart 0.2.0): set cluster.%s instead" $old $new $new) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.ingress.enabled (not .Values.ui.enabled) -}}
{{- fail "ingress.enabled: the Ingress is the page's, and ui.enabled is false" -}}
{{- end -}}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) -}}
{{- fail "ingress.enabled: ingress.hosts names no host (e.g. [{host: snapmesh.example.com}])" -}}
{{- end -}}
{{- $ports := list (int .Values.nodes.port) (int .Values.nodes.metricsPort) (int .Values.healthPort) -}}
{{- if ne (len (uniq $ports)) 3 -}}
{{- fail (printf "nodes.port (%v), nodes.metricsPort (%v) and healthPort (%v) must differ" .Values.nodes.port .Values.nodes.metricsPort .Values.healthPort) -}}
{{- end -}}
{{- $cports := list (int .Values.controller.port) (int .Values.controller.metricsPort) (int .Values.healthPort) -}}
{{- if ne (len (uniq $cports)) 3 -}}
{{- fail (printf "controller.port (%v), controller.metricsPort (%v) and healthPort (%v) must differ" .Values.controller.port .Values.controller.metricsPort .Values.healthPort) -}}
{{- end -}}
{{- if and .Values.tls.enabled (eq .Values.tls.source "existingSecret") (not .Values.tls.existingSecret) -}}
{{- fail "tls.source is existingSecret but tls.existingSecret names no Secret" -}}
{{- end -}}
{{- if and .Values.tls.existingSecret (ne .Values.tls.source "existingSecret") -}}
{{- fail (printf "tls.existingSecret is set but tls.source is %q: set tls.source=existingSecret" .Values.tls.source) -}}
{{- end -}}
{{- if and .Values.rescale.snapshot (not .Values.app.module) -}}
{{- fail "rescale.snapshot: the native bank has no rescale; run the bank as an app (app.module=snapmesh.services.app.bank:app) to rescale it" -}}
{{- end -}}
{{- /* A running snapshot cluster changes its node count only by a rescale of a snapshot. */ -}}
{{- if .Release.IsUpgrade -}}
{{- $sts := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "snapmesh.nodes" .) -}}
{{- if and $sts (ne (int $sts.spec.replicas) (int .Values.nodes.replicas)) (not .Values.rescale.snapshot) -}}
{{- fail (printf "nodes.replicas: the release runs %d nodes and this upgrade asks for %d. The node count is the cluster's topology: every channel, log and snapshot names the nodes, so another count is a rescale: stop the release with a snapshot (snapmesh snapshot trigger --stop), then upgrade with --set nodes.replicas=%d --set rescale.snapshot=<its id> (docs/deploy.md, Rescaling). Or keep nodes.replicas=%d." (int $sts.spec.replicas) (int .Values.nodes.replicas) (int .Values.nodes.replicas) (int $sts.spec.replicas)) -}}
{{- end -}}
{{- if and $sts (gt (int .Values.nodes.replicas) (int $sts.spec.replicas)) .Values.tls.enabled (eq .Values.tls.source "job") -}}
{{- fail (printf "nodes.replicas: growing from %d to %d nodes needs certificates for the new nodes, and the install's certificates Job made them for node-0..node-%d only: use tls.source=certManager (one Certificate per node) or an existingSecret that holds them (docs/deploy.md, Rescaling)." (int $sts.spec.replicas) (int .Values.nodes.replicas) (sub (int $sts.spec.replicas) 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
