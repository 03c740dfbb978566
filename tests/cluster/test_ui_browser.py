"""The snapshot page (`snapmesh ui`) in a real headless Chromium.

One 4-node cluster (real processes, the supervisor) under load for the whole module,
`snapmesh ui` as its own process against it (plaintext; a TLS cluster's page is
checked over plain HTTP at the end), and Debian's chromium driven by Selenium through
Debian's chromedriver (`make browser` / `snapmesh.ui.browser.install()` install them
with apt-get when missing, as the dashboard test does with Prometheus). Screenshots go
to test-artifacts/ui/ (or $SNAPMESH_ARTIFACTS/ui/).

The tests run in file order and share the cluster: the last one stops its controller.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from support.cluster_helpers import controller_stub
from support.polling import wait_for
from snapmesh.bank.workload import WorkloadParams, run_workload
from snapmesh.settings.config import write_cluster
from snapmesh.load.background import BackgroundLoad
from snapmesh.settings.security import write_certs
from snapmesh.processes.supervisor import Cluster
from snapmesh.ui import browser as B
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

DEADLINE_S = 8.0  # long enough to look at a snapshot held IN_PROGRESS, short enough to see it FAIL
INTERVAL_S = 3600  # the controller's --interval: shown, never reached while the module runs
KEEP = 500  # the controller's --keep
ARTIFACTS = Path(os.environ.get("SNAPMESH_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts")) / "ui"


def start_ui(controller: str, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "snapmesh.cli", "ui", "--controller", controller, "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    line = proc.stdout.readline()
    assert line.startswith("ui: http://127.0.0.1:"), line + proc.stderr.read()
    return proc, line.split()[1]


def stop_ui(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, proc.stderr.read()


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture(scope="module")
def browser():
    B.install()
    driver = B.chrome(1400, 1000)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("ui-cluster")
    config = write_cluster(data_dir / "cluster.toml", nodes=4, data_dir=data_dir, deadline=DEADLINE_S)
    # Settings the page must show as the controller runs with them (GetCluster): an interval
    # too long to fire during the module, and a retention that keeps every file here.
    with Cluster(config, controller_args=["--interval", str(INTERVAL_S), "--keep", str(KEEP)]) as cluster:
        # Snapshots with money in flight first: the workload's burst at each trigger.
        out = io.StringIO()
        summary = run_workload(cluster.controller_address,
                               WorkloadParams(duration=3.2, snapshot_every=0.6, seed=24, burst=30), out=out)
        assert summary.exit_code == 0, out.getvalue()
        proc, url = start_ui(cluster.controller_address, "--data-dir", str(data_dir))
        channel, stub = controller_stub(cluster.controller_address)
        try:
            with BackgroundLoad.for_cluster(cluster, callers=1, interval=0.05):  # under load from here on
                yield dict(cluster=cluster, url=url, stub=stub, ui=proc, summary=summary, log=out.getvalue())
        finally:
            channel.close()
            if proc.poll() is None:
                stop_ui(proc)


def shot(driver, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


# The page replaces its content every 2 s: each read is one script, so it sees one version.
def cells(driver, selector: str) -> list[dict]:
    """Every element matching `selector`: its data-* attributes and its cells' (or its own) text."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(function(e){"
        " return {data: Object.assign({}, e.dataset), text: e.textContent,"
        "         cells: Array.from(e.children).map(function(c){ return c.textContent; })}; })", selector)


def text(driver, element_id: str) -> str | None:
    return driver.execute_script("var e = document.getElementById(arguments[0]); return e ? e.textContent : null",
                                 element_id)


def history(driver) -> dict[str, str]:
    return {r["data"]["snapshotId"]: r["data"]["status"] for r in cells(driver, "#history tr[data-snapshot-id]")}


def listed(stub) -> dict[str, str]:
    snaps = stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=5).snapshots
    return {s.snapshot_id: pb.Snapshot.Status.Name(s.status) for s in snaps}


def test_the_history_lists_the_controllers_snapshots_with_their_statuses(env, browser):
    browser.get(env["url"])
    expected = listed(env["stub"])
    assert len(expected) >= 3
    assert history(browser) == expected
    counts = {name: int(text(browser, f"count-{name}")) for name in ("COMPLETE", "FAILED")}
    assert counts == {name: list(expected.values()).count(name) for name in ("COMPLETE", "FAILED")}
    assert "Traceback" not in browser.page_source
    # The summary: the end-to-end durations of the COMPLETE ones, as the controller's stats say.
    snaps = env["stub"].ListSnapshots(pb.ListSnapshotsRequest(), timeout=5).snapshots
    took = sorted(s.stats.end_to_end_duration_ms for s in snaps if s.status == pb.Snapshot.COMPLETE)
    [duration_row] = [r["cells"] for r in cells(browser, "#summary tr") if r["cells"][0] == "end-to-end duration"]
    assert duration_row[1:] == [f"{took[math.ceil(len(took) / 2) - 1]:.1f} ms", f"{took[-1]:.1f} ms", f"{took[-1]:.1f} ms"]
    # The timeline: one box per snapshot, oldest first, coloured by status.
    oldest_first = sorted(snaps, key=lambda s: s.started_at.ToNanoseconds())
    boxes = browser.execute_script(
        "return Array.from(document.querySelectorAll('#timeline .strip a')).map(a => a.className)")
    assert boxes == [pb.Snapshot.Status.Name(s.status) for s in oldest_first], boxes
    shot(browser, "overview")


def test_the_configuration_and_the_node_view_are_the_controllers_and_the_nodes(env, browser):
    browser.get(env["url"])
    settings = {r["data"]["setting"]: r["text"] for r in cells(browser, "#configuration dd")}
    told = env["stub"].GetCluster(pb.GetClusterRequest(), timeout=5)
    assert settings == {
        "app": "bank", "mode": "classic", "deadline": f"{DEADLINE_S:g} s", "interval": f"every {INTERVAL_S} s",
        "retention": f"the files of the newest {KEEP} COMPLETE", "epoch": str(told.epoch),
        "concurrency limit": f"{told.settings.max_concurrent_snapshots} in progress"}, settings
    assert told.settings.deadline_s == DEADLINE_S and told.settings.interval_s == INTERVAL_S
    cluster = env["cluster"]
    rows = {r["data"]["node"]: r["cells"] for r in cells(browser, "#node-view tr[data-node]")}
    assert {n: c[:4] for n, c in rows.items()} == {
        n.id: [n.id, n.address, "yes", str(told.epoch)] for n in cluster.config.nodes}
    # Every node reported to the workload's snapshots: its last report names one of them.
    snaps = {s.snapshot_id for s in env["stub"].ListSnapshots(pb.ListSnapshotsRequest(), timeout=5).snapshots}
    for node, row in rows.items():
        assert row[4].endswith(")") and row[4].split("(")[-1].rstrip(")") in snaps, (node, row)
    # The timeline: every bar spans its snapshot's duration on one axis (widths in proportion).
    bars = browser.execute_script(
        "return Array.from(document.querySelectorAll('#timeline .strip a')).map(function(a){"
        " return [a.dataset.snapshotId, Number(a.dataset.durationMs), a.getBoundingClientRect().width,"
        "         a.parentElement.getBoundingClientRect().width]; })")
    assert len(bars) >= 3
    finished = [b for b in bars if b[1] > 0]
    longest = max(finished, key=lambda b: b[1])
    assert longest[2] > 3  # drawn to scale: the longest one is wider than the minimum sliver
    ticks = cells(browser, "#timeline .axis span")
    assert len(ticks) == 5 and all(t["text"].count(":") == 2 for t in ticks)
    shot(browser, "configuration")


def test_a_snapshots_page_links_its_neighbours_and_export_and_shows_its_restore_command(env, browser):
    ordered = sorted(env["summary"].complete, key=lambda s: s.started_at.ToNanoseconds())
    assert len(ordered) >= 3
    middle = ordered[1]
    browser.get(f"{env['url']}snapshot/{middle.snapshot_id}")
    command = text(browser, "restore-command")
    assert command == f"snapmesh restore --controller {env['cluster'].controller_address} {middle.snapshot_id}"
    assert text(browser, "restore-refused") is None  # COMPLETE and conserved: the controller would take it
    # previous/next: the snapshots started just before and after it, whatever else the controller listed
    listed_ = sorted(env["stub"].ListSnapshots(pb.ListSnapshotsRequest(), timeout=5).snapshots,
                     key=lambda s: (s.started_at.ToNanoseconds(), s.snapshot_id))
    at = [s.snapshot_id for s in listed_].index(middle.snapshot_id)
    # (links read by one script each: the page replaces its content every 2 s)
    def follow(link_id: str) -> None:
        browser.get(browser.execute_script("return document.getElementById(arguments[0]).href", link_id))

    assert text(browser, "previous").endswith(listed_[at - 1].snapshot_id)
    follow("next")
    assert listed_[at + 1].snapshot_id in text(browser, "snapshot")
    follow("previous")
    assert middle.snapshot_id in text(browser, "snapshot")
    # Its export: the file the controller wrote, byte for byte.
    href = browser.execute_script("return document.getElementById('export').href")
    code, body = http_get(href)
    exported = env["cluster"].data_dir / "snapshots" / f"{middle.snapshot_id}.json"
    assert code == 200 and body == exported.read_text(encoding="utf-8")
    assert http_get(f"{env['url']}snapshot/no-such-id/export.json")[0] == 404


def test_a_snapshot_with_money_in_flight_lists_those_transfers_and_the_totals_add_up(env, browser):
    with_flight = [s for s in env["summary"].complete if any(c.in_flight for c in s.channels)]
    assert with_flight, "the burst left no money in flight at any cut:\n" + env["log"]
    s = max(with_flight, key=lambda s: sum(len(c.in_flight) for c in s.channels))
    browser.get(f"{env['url']}snapshot/{s.snapshot_id}")
    shown = [tuple(r["cells"][:3]) for r in cells(browser, "#in-flight tr.transfer")]
    expected = [(c.src, c.dst, str(t.amount)) for c in s.channels for t in c.in_flight]
    assert shown == expected
    balances = sum(n.balance for n in s.nodes)
    moving = sum(t.amount for c in s.channels for t in c.in_flight)
    assert balances + moving == s.expected_total
    line = text(browser, "conservation")
    assert line == (f"balances {balances} + in flight {moving} = total {s.expected_total}; "
                    f"expected {s.expected_total}: CONSERVED")
    node_balances = {r["data"]["node"]: int(r["cells"][1]) for r in cells(browser, "#nodes tr[data-node]")}
    assert node_balances == {n.node_id: n.balance for n in s.nodes}
    wait_for(lambda: browser.execute_script(
        "var i = document.querySelector('img.trace'); return i && i.complete && i.naturalWidth > 0"),
        timeout=20, what="the picture", interval=0.2)
    shot(browser, "in-flight")


def test_the_page_updates_itself_when_a_new_snapshot_finishes(env, browser):
    browser.get(env["url"])
    browser.execute_script("window.notReloaded = true")
    before = history(browser)
    done = env["stub"].TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=30)
    assert done.status == pb.Snapshot.COMPLETE and done.snapshot_id not in before
    wait_for(lambda: history(browser).get(done.snapshot_id) == "COMPLETE",
             timeout=15, what="the new snapshot on the page", interval=0.2)
    assert browser.execute_script("return window.notReloaded === true"), "the page was reloaded"


def test_a_snapshot_held_in_progress_names_the_paused_node_and_its_open_channels_then_fails_with_a_reason(env, browser):
    cluster, stub = env["cluster"], env["stub"]
    cluster.pause_node("p3")
    try:
        started = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=10)
        assert started.status == pb.Snapshot.IN_PROGRESS
        browser.get(f"{env['url']}snapshot/{started.snapshot_id}")

        # p3 never records and never sends its markers, nor logs the ones sent to it; every
        # other channel's marker arrives. The page refreshes itself until the logs say so.
        into_p3 = {f"{n}->p3" for n in ("p1", "p2", "p4")}
        out_of_p3 = {f"p3->{n}" for n in ("p1", "p2", "p4")}
        seen = {}

        def stuck() -> bool:
            seen["nodes"] = [li["data"].get("node") for li in cells(browser, "#stuck-nodes li")]
            seen["channels"] = {li["data"].get("channel") for li in cells(browser, "#stuck-channels li")}
            return seen["nodes"] == ["p3"] and seen["channels"] == into_p3 | out_of_p3

        try:
            wait_for(stuck, timeout=DEADLINE_S - 2, interval=0.2,
                     what="p3 and its channels as the only ones the snapshot waits for")
        except AssertionError as error:
            raise AssertionError(f"{error}; the page said {seen}") from None
        assert "IN_PROGRESS" in text(browser, "status")
        assert "from the nodes' transfer logs" in text(browser, "stuck")
        shot(browser, "stuck")
        code, overview = http_get(env["url"])  # the overview counts it while it is held
        assert code == 200 and "id='count-IN_PROGRESS'>1</b>" in overview, overview[:3000]
        failed = wait_for(lambda: (s := stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=started.snapshot_id),
                                                         timeout=5)).status == pb.Snapshot.FAILED and s,
                          timeout=DEADLINE_S + 10, what="the snapshot to fail at its deadline", interval=0.2)
    finally:
        cluster.resume_node("p3")
    assert failed.reason
    wait_for(lambda: "FAILED" in (text(browser, "status") or ""), timeout=10, what="the page to show FAILED", interval=0.2)
    assert text(browser, "reason") == failed.reason
    browser.get(env["url"])
    assert history(browser)[failed.snapshot_id] == "FAILED"
    [row] = cells(browser, f"#history tr[data-snapshot-id='{failed.snapshot_id}'] td.reason")
    assert row["text"] == failed.reason
    # ... and on screen: the history fits its section and the window (1400 px), no scrolling sideways.
    right, section, page, window = browser.execute_script(
        "var c = document.querySelector(arguments[0]), s = document.getElementById('history');"
        "return [c.getBoundingClientRect().right, s.getBoundingClientRect().right,"
        "        document.documentElement.scrollWidth, document.documentElement.clientWidth]",
        f"#history tr[data-snapshot-id='{failed.snapshot_id}'] td.reason")
    assert right <= section and page <= window, (right, section, page, window)
    assert failed.reason in text(browser, "latest-failed")
    shot(browser, "failed")


def test_an_unknown_snapshot_id_gives_a_not_found_page_and_404(env, browser):
    url = f"{env['url']}snapshot/no-such-snapshot"
    code, body = http_get(url)
    assert code == 404 and "Snapshot not found" in body and "no-such-snapshot" in body
    browser.get(url)
    assert text(browser, "problem").startswith("Snapshot not found")
    assert browser.execute_script("return document.getElementById('live').dataset.status") == "404"


def test_the_controller_down_gives_a_clear_message_not_a_stack_trace(env, browser):
    browser.get(env["url"])
    browser.execute_script("window.notReloaded = true")
    env["cluster"].stop_controller()
    # The open page says so at its next refresh; a fresh load answers 503.
    wait_for(lambda: text(browser, "problem"), timeout=20, what="the live page to report the controller down", interval=0.2)
    assert "The controller does not answer" in text(browser, "problem")
    assert browser.execute_script("return window.notReloaded === true")
    code, body = http_get(env["url"])
    assert code == 503 and "The controller does not answer" in body and env["cluster"].controller_address in body
    assert "Traceback" not in body and "File \"" not in body
    browser.get(env["url"])
    shot(browser, "controller-down")
    assert env["ui"].poll() is None, "the page server must survive the controller going away"


def test_a_tls_clusters_page_carries_no_token(tmp_path):
    config = write_cluster(tmp_path / "cluster.toml", nodes=2, data_dir=tmp_path)
    from snapmesh.settings import config as cluster_config

    tls_dir = tmp_path / "tls"
    write_certs(cluster_config.load(config), tls_dir, token="sekrit-token-24")
    with Cluster(config, tls_dir=tls_dir) as cluster:
        channel, stub = controller_stub(cluster.controller_address, cluster.client_identity)
        with channel:
            done = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=30)
            restored = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=done.snapshot_id), timeout=60)
            assert restored.status == pb.Restore.RESTORED, restored.reason
            assert stub.GetCluster(pb.GetClusterRequest(), timeout=5).last_restore == restored
        proc, url = start_ui(cluster.controller_address, "--tls-dir", str(tls_dir))  # no --data-dir: the API only
        try:
            pages = [http_get(url), http_get(f"{url}snapshot/{done.snapshot_id}")]
        finally:
            stop_ui(proc)
    # The last restore, from the controller's answer (GetCluster's last_restore), not its journal.
    assert (f"last restore: <span id='last-restore'>snapshot <a href='/snapshot/{done.snapshot_id}'>"
            f"{done.snapshot_id}</a> into epoch {restored.epoch}: RESTORED at ") in pages[0][1], pages[0][1]
    for code, body in pages:
        assert code == 200 and done.snapshot_id in body
        assert "sekrit-token-24" not in body and "token" not in body.lower().replace("no token", "")
        assert "<form" not in body and "<button" not in body  # read-only: nothing to press


def test_an_app_snapshots_page_and_snapshot_get_show_what_its_describe_returns(tmp_path, browser, monkeypatch):
    """The token ring (examples/token_ring.py) on a real cluster: the page and `snapshot get`
    load it from the snapshot's app spec, as a user's PYTHONPATH has it, and show its
    invariant's verdict and its describe (where the token is) in place of the money lines."""
    import grpc

    from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

    examples = Path(__file__).resolve().parents[2] / "examples"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(examples), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(examples))
    from token_ring import where_tokens_are

    from snapmesh.protocol.appstate import view_of

    config = write_cluster(tmp_path / "cluster.toml", nodes=3, data_dir=tmp_path)
    with Cluster(config, env=env, app="token_ring:app") as cluster:
        holder = cluster.config.node("p1").address  # the smallest id holds the token first
        with grpc.insecure_channel(holder) as channel:
            reply = pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=b"pass"), timeout=10)
        assert reply.reply == b"passed to p2", reply
        channel, stub = controller_stub(cluster.controller_address)
        with channel:
            done = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p3", wait=True), timeout=30)
        assert done.status == pb.Snapshot.COMPLETE and done.app.spec == "token_ring:app", done
        token = json.dumps(where_tokens_are(view_of(done)), separators=(", ", ": "))
        assert token in ('["at p2"]', '["in flight p1->p2 (seq 1)"]'), token
        proc, url = start_ui(cluster.controller_address, "--data-dir", str(tmp_path), env=env)
        try:
            browser.get(f"{url}snapshot/{done.snapshot_id}")
            [verdict] = [r["cells"] for r in cells(browser, "#invariants tr[data-invariant]")]
            assert verdict == ["one token", "ok"]
            assert [r["cells"] for r in cells(browser, "#described tr[data-key]")] == [["token", token]]
            assert text(browser, "conservation") is None  # the bank's line is not an app's
            states = {r["data"]["node"]: r["cells"][1] for r in cells(browser, "#nodes tr[data-node]")}
            assert states == {n.node_id: str(len(n.state)) for n in done.nodes}  # state bytes, not a balance
            shot(browser, "app-token-ring")
        finally:
            stop_ui(proc)
        got = subprocess.run([sys.executable, "-m", "snapmesh.cli", "snapshot", "get", done.snapshot_id,
                              "--controller", cluster.controller_address],
                             capture_output=True, text=True, timeout=60, env=env)
    assert got.returncode == 0, got.stderr
    assert "one token  ok" in got.stdout and f"token  {token}" in got.stdout, got.stdout
