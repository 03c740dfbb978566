"""`snapmesh ui [--controller HOST:PORT] [--listen 127.0.0.1:8080] [--tls-dir DIR] [--data-dir DIR] [--window-bytes N]`

A read-only web page over the controller's gRPC API: the snapshots' overview,
history, summary statistics and timeline, and one snapshot's nodes, phases,
channels with their in-flight transfers, where it is stuck (IN_PROGRESS), and
its space-time picture (with --data-dir). It binds to loopback by default.

With a TLS cluster (--tls-dir, default $SNAPMESH_TLS_DIR) the page server holds
the client certificate and token and sends them to the controller itself: no
token ever appears in a URL or a page. The page has no control action.

Routes: `/` (`?page=N` of the history; `?last=N`: the snapshots the summary and the
timeline cover, default 50), `/snapshot/ID`, `/snapshot/ID/trace.svg`,
`/snapshot/ID/export.json` (a finished snapshot's proto JSON export), `/healthz`.
An unknown snapshot id answers 404 with a "not found" page; a controller that
does not answer, 503 with a page that says so (the page keeps retrying). The
picture is drawn only for a snapshot the controller answers COMPLETE, one at a
time (503 with Retry-After while another is drawn), from at most --window-bytes
of each node's log around its cut.

DNS rebinding: a request whose Host header names neither an IP address nor the
listen address (for loopback also `localhost`; for 0.0.0.0 or :: this machine's
names), nor a name given with --allow-host, is refused with 421 and nothing else.

Exit 0 after SIGINT/SIGTERM, 2 for bad arguments or an address it cannot bind.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from snapmesh.checking import described
from snapmesh.settings import target
from snapmesh.settings.appsettings import PARAMS_ENV, env_params
from snapmesh.settings.argparsing import parse_args
from snapmesh.trace.logs import WINDOW_BYTES
from snapmesh.ui import model, pages
from snapmesh.ui.source import Busy, ControllerDown, NotFound, Source

DEFAULT_LISTEN = "127.0.0.1:8080"
PER_PAGE = 20
LAST_N = 50  # snapshots in the summary statistics and the timeline strip
MIN_WINDOW_BYTES = 64 * 1024  # less would cut most pictures to their cut line alone


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh ui: {message}\n")


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT -> (host, port); ValueError naming the text otherwise."""
    host, sep, port = text.rpartition(":")
    try:
        if not sep or not host:
            raise ValueError
        number = int(port)
        if not 0 <= number <= 65535:
            raise ValueError
    except ValueError:
        raise ValueError(f"{text!r} is not HOST:PORT") from None
    return host.strip("[]"), number


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _window_bytes(text: str) -> int:
    if not text.isdigit() or int(text) < MIN_WINDOW_BYTES:
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes >= {MIN_WINDOW_BYTES}, got {text!r}")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snapmesh ui", description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("--controller", metavar="HOST:PORT", help=target.CONTROLLER_HELP)
    parser.add_argument("--listen", type=_address, default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"where the page is served (default {DEFAULT_LISTEN}: loopback only; port 0: a free one)")
    parser.add_argument("--tls-dir", metavar="DIR", help="client certificate and token of a TLS cluster "
                        "(default: $SNAPMESH_TLS_DIR, else --data-dir's tls/, else plaintext)")
    parser.add_argument("--data-dir", type=Path, metavar="DIR",
                        help="the cluster's data dir: node logs (where a snapshot is stuck, its picture) and the "
                        "controller's journal (the last restore); its cluster.toml names the controller (default: none)")
    parser.add_argument("--window-bytes", type=_window_bytes, default=WINDOW_BYTES, metavar="N",
                        help="of each node's log, the bytes a snapshot's picture is drawn from, around its cut "
                        f"(default {WINDOW_BYTES}: a segment can be hundreds of MiB, the page reads this much of it)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="a further name the page may be reached by (a proxy's, a container service's): the Host "
                        "header must name an IP address, the listen address or one of these, against DNS rebinding "
                        "(repeatable; default: none)")
    return parser


class UiServer(ThreadingHTTPServer):
    daemon_threads = True
    # The listen backlog (socketserver's default is 5): a burst of visitors past it has
    # its connections dropped and retried by the client's TCP (1 s, 3 s, 7 s later).
    request_queue_size = 128
    app_params: dict = {}  # the app's params for its describe ($SNAPMESH_APP_PARAMS in a deployment)

    def __init__(self, address: tuple[str, int], source: Source, allow_hosts: tuple[str, ...] = ()) -> None:
        self.source = source
        super().__init__(address, _Handler)
        self.host_names = host_names(address[0], self.server_address[0], allow_hosts)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"


def host_names(listen: str, bound: str, allowed: tuple[str, ...] = ()) -> frozenset[str]:
    """The names a Host header may give (an IP address is always right: a rebinding
    page can only send its own DNS name): the listen name, `localhost` on loopback,
    this machine's names on a wildcard address, and `allowed`."""
    names = {listen.lower(), *(name.lower() for name in allowed)}
    try:
        address = ipaddress.ip_address(bound)
    except ValueError:
        address = None
    if address is not None and address.is_loopback:
        names.add("localhost")
    if address is not None and address.is_unspecified:
        names.update({"localhost", socket.gethostname().lower(), socket.getfqdn().lower()})
    return frozenset(names)


def host_problem(header: str | None, names: frozenset[str]) -> str:
    """Why a Host header is refused ("" when it is not)."""
    if not header:
        return "no Host header"
    name = header.strip().lower()
    if name.startswith("["):  # [v6]:port
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.rstrip(".")
    try:
        ipaddress.ip_address(name)
        return ""
    except ValueError:
        pass
    if name in names:
        return ""
    return (f"Host {header!r} is not an address of this page ({', '.join(sorted(names))}, or an IP address): "
            "refused against DNS rebinding; snapmesh ui --allow-host NAME allows another name")


class _Handler(BaseHTTPRequestHandler):
    server: UiServer
    server_version = "snapmesh-ui"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass  # quiet: one line per refresh would drown the demo's output

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if refused := host_problem(self.headers.get("Host"), self.server.host_names):
            return self._send(HTTPStatus.MISDIRECTED_REQUEST, (refused + "\n").encode(), "text/plain; charset=utf-8")
        url = urlsplit(self.path)
        partial = self.headers.get("X-Snapmesh-Partial") == "1"
        snapshot_id = ""
        try:
            if url.path == "/healthz":
                return self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
            if url.path == "/":
                return self._page("snapmesh snapshots", self._index(parse_qs(url.query)), partial)
            if url.path.startswith("/snapshot/"):
                rest = url.path[len("/snapshot/"):]
                if rest.endswith("/trace.svg"):
                    snapshot_id = unquote(rest[: -len("/trace.svg")])
                    return self._trace(snapshot_id)
                if rest.endswith("/export.json"):
                    snapshot_id = unquote(rest[: -len("/export.json")])
                    return self._export(snapshot_id)
                snapshot_id = unquote(rest)
                return self._page(f"snapshot {snapshot_id}", self._detail(snapshot_id), partial)
            return self._page("not found", pages.problem("Not found", f"there is no page {url.path}"), partial,
                              HTTPStatus.NOT_FOUND)
        except NotFound:
            if url.path.endswith(("/trace.svg", "/export.json")):
                return self._send(HTTPStatus.NOT_FOUND, f"no snapshot {snapshot_id!r}\n".encode(),
                                  "text/plain; charset=utf-8")
            return self._page("snapshot not found", pages.problem(
                "Snapshot not found", f"the controller knows no snapshot {snapshot_id!r}"), partial, HTTPStatus.NOT_FOUND)
        except ControllerDown as exc:
            return self._page("controller down", pages.problem(
                "The controller does not answer", f"{exc}. This page retries every few seconds."), partial,
                HTTPStatus.SERVICE_UNAVAILABLE)
        except Exception as exc:  # a bug must not show a stack trace either; say what it was
            return self._page("error", pages.problem("The page could not be made", f"{type(exc).__name__}: {exc}"),
                              partial, HTTPStatus.INTERNAL_SERVER_ERROR)

    def _index(self, query: dict[str, list[str]]) -> str:
        source = self.server.source
        def number(name: str, default: int, top: int) -> int:
            try:
                return min(max(1, int(query.get(name, [str(default)])[0])), top)
            except ValueError:
                return default

        page, last_n = number("page", 1, 10**9), number("last", LAST_N, 10_000)
        snapshots = source.snapshots()
        cluster = source.cluster()
        restore, note = source.last_restore(cluster)
        return pages.index(snapshots, cluster=cluster, node_epochs=source.node_epochs(cluster), restore=restore,
                           restore_note=note,
                           page=page, per_page=PER_PAGE, last_n=last_n, now=time.time())

    def _detail(self, snapshot_id: str) -> str:
        source = self.server.source
        snapshot = source.snapshot(snapshot_id)
        cluster = source.cluster()
        node_ids = [n.node_id for n in cluster.nodes]
        stuck, stuck_note = None, ""
        if snapshot.status == model.IN_PROGRESS:
            records, stuck_note = source.log_records(node_ids, snapshot_id)
            stuck = model.stuck(snapshot, node_ids, [(c.src, c.dst) for c in cluster.channels], time.time(), records)
        svg, trace_note = None, "drawn once the snapshot is COMPLETE"
        about = described.describe(snapshot, params=self.server.app_params)
        if snapshot.status == model.COMPLETE:
            try:
                svg, trace_note = source.trace_svg(snapshot_id, described.caption(about))
            except Busy:
                trace_note = "another picture is being drawn: this one comes with one of the next refreshes"
        return pages.detail(snapshot, node_ids=node_ids, stuck=stuck, stuck_note=stuck_note, has_trace=svg is not None,
                            trace_note=trace_note, now=time.time(),
                            neighbours=model.neighbours(source.snapshots(), snapshot_id),
                            restore=model.restore_command(snapshot, source.controller, source.tls_dir),
                            described=about)

    def _export(self, snapshot_id: str) -> None:
        """The snapshot's export: the file in the data dir's snapshots/ when the page has
        it (byte for byte), else the controller's answer printed the same way."""
        snapshot = self.server.source.snapshot(snapshot_id)  # NotFound for an id the controller does not know
        if not snapshot.HasField("finished_at"):
            return self._send(HTTPStatus.NOT_FOUND, f"snapshot {snapshot_id} is {model.status_name(snapshot)}: it is "
                              "exported once it finishes\n".encode(), "text/plain; charset=utf-8")
        body = self.server.source.export(snapshot)
        return self._send(HTTPStatus.OK, body, "application/json",
                          disposition=f"inline; filename=\"{snapshot_id}.json\"")

    def _trace(self, snapshot_id: str) -> None:
        """The picture of a snapshot the controller answers COMPLETE (NotFound and
        ControllerDown go to do_GET's answers)."""
        source = self.server.source
        snapshot = source.snapshot(snapshot_id)
        if snapshot.status != model.COMPLETE:
            return self._send(HTTPStatus.NOT_FOUND, f"snapshot {snapshot_id} is {model.status_name(snapshot)}: its "
                              f"picture is drawn once it is COMPLETE\n".encode(), "text/plain; charset=utf-8")
        try:
            about = described.describe(snapshot, params=self.server.app_params)
            svg, note = source.trace_svg(snapshot_id, described.caption(about))
        except Busy as exc:
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, f"{exc}\n".encode(), "text/plain; charset=utf-8",
                              retry_after=1)
        if svg is None:
            return self._send(HTTPStatus.NOT_FOUND, (note + "\n").encode(), "text/plain; charset=utf-8")
        # Drawn once per snapshot: the browser may keep it (the live refresh re-renders the page).
        return self._send(HTTPStatus.OK, svg.encode(), "image/svg+xml", cache="private, max-age=3600")

    def _page(self, title: str, main: str, partial: bool, code: HTTPStatus = HTTPStatus.OK) -> None:
        html = main if partial else pages.layout(title, main, controller=self.server.source.controller, status=code)
        self._send(code, html.encode(), "text/html; charset=utf-8")

    def _send(self, code: HTTPStatus, body: bytes, content_type: str, cache: str = "no-store",
              retry_after: int | None = None, disposition: str = "") -> None:
        self.send_response(code)
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        if disposition:
            self.send_header("Content-Disposition", disposition)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; "
                         "script-src 'unsafe-inline'; img-src 'self'")
        self.end_headers()
        self.wfile.write(body)


def serve(source: Source, listen: tuple[str, int], allow_hosts: tuple[str, ...] = ()) -> UiServer:
    """A bound server (not yet serving): `serve_forever` it. `snapmesh cluster up`
    runs this command as a process of its own (snapmesh.processes.page)."""
    return UiServer(listen, source, allow_hosts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.data_dir is not None and not args.data_dir.is_dir():
        print(f"snapmesh ui: --data-dir {args.data_dir} is not a directory", file=sys.stderr)
        return 2
    try:  # --controller, $SNAPMESH_CONTROLLER, --data-dir's cluster.toml, the default (snapmesh.settings.target)
        found = target.find(args.controller, args.data_dir, args.tls_dir)
    except target.TargetError as exc:
        print(f"snapmesh ui: {exc}", file=sys.stderr)
        return 2
    try:  # a deployment's container is given the app's params as its nodes are
        params = env_params(os.environ, lambda problem: ValueError(f"${PARAMS_ENV}: {problem}")) or {}
    except ValueError as exc:
        print(f"snapmesh ui: {exc}", file=sys.stderr)
        return 2
    source = Source(found.address, found.identity, args.data_dir, args.window_bytes)
    try:
        server = serve(source, args.listen, tuple(args.allow_host))
        server.app_params = params
    except OSError as exc:
        source.close()
        print(f"snapmesh ui: cannot listen on {args.listen[0]}:{args.listen[1]}: {exc.strerror or exc}", file=sys.stderr)
        return 2

    def stop(signum, frame) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    print(f"ui: {server.url}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        source.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
