"""snapmesh.app, the app contract: load_app's one-line errors, Context, the checks, the
test harness's rules (A2 replay, A4 refusal, A6 restore), and the bank through the contract.

Pure and fast: no process, no network. A seeded run names its seed when it fails.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap

import pytest

from snapmesh.app import (
    App, AppError, Context, NodeInfo, Refused, STATUS_CODES, View, check_invariants, load_app, new_machine, validate_machine,
)
from snapmesh.app.testing import Cluster, InvariantBroken, run, sql_violations
from snapmesh.services.app import bank

MESH = [(a, b) for a in ("p1", "p2", "p3") for b in ("p1", "p2", "p3") if a != b]


class Echo:
    """A minimal machine: a command b"dst:text" sends text to dst; it keeps what it received, in order."""

    def __init__(self, info: NodeInfo):
        self.seen: list[str] = []

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        dst, _, text = command.decode().partition(":")
        ctx.send(dst, text.encode())
        return b"ok"

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        self.seen.append(f"{src}:{payload.decode()}")

    def snapshot(self) -> bytes:
        return json.dumps(self.seen).encode()

    def restore(self, state: bytes) -> None:
        self.seen = json.loads(state)


ECHO = App(name="echo", new=Echo)


# ---- load_app: one clear line for every bad --app


@pytest.fixture
def app_dir(tmp_path, monkeypatch):
    """A working directory for user modules; sys.path and sys.modules are put back afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("usermod_"):
            del sys.modules[name]


def write(directory, name, source):
    (directory / f"{name}.py").write_text(textwrap.dedent(source))


GOOD = """
from snapmesh.app import App
class M:
    def __init__(self, info): pass
    def on_command(self, command, ctx): return b""
    def on_message(self, src, payload, ctx): pass
    def snapshot(self): return b""
    def restore(self, state): pass
app = App(name="good", new=M)
not_an_app = 42
"""


def test_a_module_in_the_working_directory_loads(app_dir):
    write(app_dir, "usermod_good", GOOD)
    assert load_app("usermod_good:app").name == "good"


def test_the_built_ins_resolve():
    assert load_app("bank").name == "bank"
    assert load_app("kvshard").name == "kvshard"
    assert load_app("snapmesh.services.app.kvshard:app") is load_app("kvshard")
    # the name cluster files used before services/ shipped inside snapmesh still loads the same app
    assert load_app("services.app.kvshard:app") is load_app("kvshard")


def test_services_import_only_as_snapmesh_services():
    # one import path: a second one would load each server module twice, each copy with its own state
    with pytest.raises(ImportError, match="import snapmesh.services, not services"):
        __import__("services")


@pytest.mark.parametrize(
    "spec, source, expected",
    [
        ("usermod_missing:app", None, "no module named 'usermod_missing' in the working directory"),
        ("usermod_dep:app", "import usermod_not_there\n", "module 'usermod_dep' does not import: ModuleNotFoundError"),
        ("usermod_raises:app", "x = 1\nraise RuntimeError('no config')\n",
         "module 'usermod_raises' does not import: RuntimeError: no config (usermod_raises.py:2)"),
        ("usermod_syntax:app", "def f(:\n", "module 'usermod_syntax' does not import: SyntaxError"),
        ("usermod_good:nope", GOOD, "module 'usermod_good' has no attribute 'nope'"),
        ("usermod_good:not_an_app", GOOD, "not_an_app is a int, not a snapmesh.app.App"),
        ("usermod_bad_app:app", "from snapmesh.app import App\napp = App(name='x', new=3)\n",
         "new must be callable"),
        ("token_ring.py", None, "a path is not a module; run from its directory with --app token_ring:app"),
        ("examples/token_ring.py", None,
         "a path is not a module; give --app token_ring:app with PYTHONPATH=examples (or run from examples"),
        ("usermod_good", None, "expected module:attr or a built-in (bank, kvshard)"),
    ],
)
def test_a_bad_app_is_one_clear_line(app_dir, spec, source, expected):
    if source is not None:
        write(app_dir, spec.partition(":")[0], source)
    with pytest.raises(AppError) as caught:
        load_app(spec)
    message = str(caught.value)
    assert expected in message and message.startswith(f"--app {spec}: ")
    assert "\n" not in message, message


def test_new_that_raises_and_a_machine_without_a_method_are_one_line():
    def broken(info):
        raise KeyError("holder")

    with pytest.raises(AppError, match=r"^app 'x': new\(\) for node p1 raised KeyError: 'holder' \(test_app_contract"):
        new_machine(App(name="x", new=broken), NodeInfo(node_id="p1", peers_out=(), peers_in=()))

    class NoRestore(Echo):
        restore = None

    info = NodeInfo(node_id="p2", peers_out=(), peers_in=())
    with pytest.raises(AppError, match=r"node p2: the machine \(NoRestore\) has no method restore\(\)"):
        validate_machine(NoRestore(info), info)
    validate_machine(Echo(info), info)


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"name": ""}, "name must be a non-empty str"),
        ({"invariants": {"x": "not callable"}}, "invariants['x'] must be callable"),
        ({"views": []}, "views must be a mapping"),
        ({"sql_invariants": {"q": len}}, "sql_invariants['q'] must be a SQL string"),
        ({"describe": 5}, "describe must be callable or None"),
    ],
)
def test_an_app_is_checked_when_made(fields, expected):
    with pytest.raises(AppError) as caught:
        App(**{"name": "x", "new": Echo, **fields})
    assert expected in str(caught.value)


# ---- NodeInfo, Context, Refused


def test_node_info_is_read_only():
    params = {"holder": "p1"}
    info = NodeInfo(node_id="p1", peers_out=["p2"], peers_in=["p3"], params=params)
    params["holder"] = "p9"  # a copy was taken
    assert info.params["holder"] == "p1" and info.peers_out == ("p2",)
    with pytest.raises(TypeError):
        info.params["holder"] = "p2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.node_id = "p2"


def test_context_collects_sends_in_order():
    ctx = Context("p1", ["p2", "p3"])
    ctx.send("p3", b"a")
    ctx.send("p2", b"b")
    ctx.send("p3", b"")
    assert ctx.sends == [("p3", b"a"), ("p2", b"b"), ("p3", b"")]


@pytest.mark.parametrize(
    "dst, payload, expected",
    [
        ("p1", b"x", "node p1: ctx.send to itself"),
        ("p9", b"x", "node p1: ctx.send to 'p9', not a peer it sends to (peers_out: p2, p3)"),
        ("p2", "x", "node p1: ctx.send('p2', ...) needs bytes, got str"),
        ("p2", bytearray(b"x"), "needs bytes, got bytearray"),
    ],
)
def test_context_send_misuse_is_an_app_error(dst, payload, expected):
    ctx = Context("p1", ["p2", "p3"])
    with pytest.raises(AppError) as caught:
        ctx.send(dst, payload)
    assert expected in str(caught.value)
    assert ctx.sends == []


def test_refuse_raises_refused_with_a_status_name():
    with pytest.raises(Refused) as caught:
        Context("p1", []).refuse("FAILED_PRECONDITION", "no token here")
    assert (caught.value.code, caught.value.text) == ("FAILED_PRECONDITION", "no token here")
    with pytest.raises(ValueError, match="unknown status code 'NOPE'; valid: ABORTED, .*FAILED_PRECONDITION"):
        Refused("NOPE", "x")
    with pytest.raises(ValueError):
        Refused("OK", "a refusal is not OK")


def test_the_status_names_are_grpcs():
    import grpc

    assert STATUS_CODES == {code.name for code in grpc.StatusCode} - {"OK"}


# ---- check_invariants


def test_check_invariants_turns_a_broken_check_into_a_problem():
    def crashes(view):
        return 1 / 0

    app = App(name="x", new=Echo, invariants={
        "holds": lambda view: [], "fails": lambda view: ["two tokens"], "crashes": crashes,
        "returns a tuple": lambda view: (), "returns None": lambda view: None,
    })
    results = check_invariants(app, View(snapshot_id="s", states={}, in_flight=[]))
    assert results["holds"] == [] and results["fails"] == ["two tokens"]
    assert results["crashes"] == ["the check raised ZeroDivisionError: division by zero (test_app_contract.py:"
                                  f"{crashes.__code__.co_firstlineno + 1})"]
    assert results["returns a tuple"] == ["the check returned tuple, not a list of problems"]
    assert results["returns None"] == ["the check returned NoneType, not a list of problems"]


# ---- the harness keeps the contract's rules


def test_each_channel_is_fifo_and_a_cut_holds_the_queued_messages():
    cluster = Cluster(ECHO, MESH)
    for text in ("a", "b", "c"):
        cluster.command("p1", f"p2:{text}".encode())
    cluster.command("p3", b"p2:z")
    view = cluster.view()
    assert [(s, d, q, p) for s, d, q, p in view.in_flight] == [
        ("p1", "p2", 1, b"a"), ("p1", "p2", 2, b"b"), ("p1", "p2", 3, b"c"), ("p3", "p2", 1, b"z")]
    cluster.deliver("p3", "p2")
    cluster.drain()
    assert json.loads(cluster.snapshot("p2")) == ["p3:z", "p1:a", "p1:b", "p1:c"]


def test_a_restore_is_a_fresh_machine_then_the_in_flight_messages_in_order():
    cluster = Cluster(ECHO, MESH)
    cluster.command("p1", b"p2:kept")
    cluster.drain()
    cluster.command("p1", b"p2:in-flight-1")
    cluster.command("p1", b"p2:in-flight-2")
    cut = cluster.view("s1")
    cluster.command("p1", b"p2:after the cut")
    cluster.drain()
    cluster.restore(cut)
    assert json.loads(cluster.snapshot("p2")) == ["p1:kept", "p1:in-flight-1", "p1:in-flight-2"]
    assert cluster.pending() == []


def test_a_refused_step_leaves_the_state_unchanged_whatever_the_app_changed():
    class Sloppy(Echo):
        def on_command(self, command, ctx):
            self.seen.append("half done")
            if command == b"x":
                ctx.refuse("INVALID_ARGUMENT", "too late")
            raise RuntimeError("later still")

    cluster = Cluster(App(name="sloppy", new=Sloppy), MESH)
    before = cluster.snapshot("p1")
    with pytest.raises(Refused, match="too late"):
        cluster.command("p1", b"x")
    with pytest.raises(RuntimeError, match="later still"):
        cluster.command("p1", b"y")
    assert cluster.snapshot("p1") == before  # as the node does (apphost.H4)
    with pytest.raises(AppError, match="ctx.send to itself"):  # an error before any change passes through as it is
        Cluster(ECHO, MESH).command("p1", b"p1:to itself")


def test_replay_finds_a_machine_that_is_not_deterministic():
    calls = iter(range(1_000))

    class Flaky(Echo):
        def on_message(self, src, payload, ctx):
            super().on_message(src, payload, ctx)
            if next(calls) % 2 == 0:  # state outside the machine: a replay takes the other branch
                ctx.send(src, b"echo")

    cluster = Cluster(App(name="flaky", new=Flaky), MESH)
    cluster.command("p1", b"p2:one")
    cluster.deliver("p1", "p2")  # the first run sends an echo back
    with pytest.raises(AppError, match=r"node p2: replay of log position 0 \(message\) sent \[\], "
                                       r"the log holds \[\('p1', b'echo'\)\]: not deterministic"):
        cluster.replay("p2")
    Cluster(ECHO, MESH).replay("p1")  # a deterministic machine replays clean


def test_snapshot_must_return_bytes():
    class Stringy(Echo):
        def snapshot(self):
            return "[]"

    with pytest.raises(AppError, match="node p1: snapshot\\(\\) returned str, not bytes"):
        Cluster(App(name="stringy", new=Stringy), MESH)


# ---- the bank, through the contract


def transfer(to, amount):
    return json.dumps({"to": to, "amount": amount}).encode()


@pytest.mark.parametrize(
    "command, code, text",
    [
        (transfer("p2", 1001), "FAILED_PRECONDITION", "insufficient funds: p1 has 1000, asked 1001"),
        (transfer("p1", 5), "INVALID_ARGUMENT", "no channel p1 -> p1"),
        (transfer("p2", 0), "INVALID_ARGUMENT", "amount must be a positive integer"),
        (transfer("p2", True), "INVALID_ARGUMENT", "amount must be a positive integer"),
        (b"not json", "INVALID_ARGUMENT", "a command is JSON"),
        (b'{"to": "p2"}', "INVALID_ARGUMENT", "a transfer is"),
    ],
)
def test_the_bank_refuses_what_the_native_bank_refuses(command, code, text):
    cluster = Cluster(bank.app, MESH)
    with pytest.raises(Refused) as caught:
        cluster.command("p1", command)
    assert caught.value.code == code and text in caught.value.text
    assert cluster.snapshot("p1") == b"1000"


def test_the_bank_moves_money_as_decimal_ascii():
    cluster = Cluster(bank.app, MESH, params={"initial_balance": 50})
    assert json.loads(cluster.command("p1", transfer("p2", 20))) == {"balance": 30}
    view = cluster.view("s1")
    assert view.states == {"p1": b"30", "p2": b"50", "p3": b"50"}
    assert list(view.in_flight) == [("p1", "p2", 1, b"20")]
    assert bank.app.describe(view) == {"balances": {"p1": 30, "p2": 50, "p3": 50}, "in_flight": {"p1->p2": 20},
                                       "total": 150, "expected_total": 150}
    assert json.loads(cluster.command("p3", b'{"op": "balance"}')) == {"balance": 50}


@pytest.mark.parametrize("seed", range(8))
def test_the_bank_is_conserved_at_every_cut(seed):
    cluster = Cluster(bank.app, MESH, params={"initial_balance": 100, "max_amount": 40})
    stats = run(cluster, seed=seed, steps=300, replay_share=0.02, restore_share=0.02)
    assert stats.commands and stats.delivered, stats


def test_conserved_catches_money_made_or_lost_and_so_does_its_sql():
    cluster = Cluster(bank.app, MESH)
    cluster.command("p1", transfer("p2", 7))
    good = cluster.view("good")
    made = dataclasses.replace(good, snapshot_id="made", in_flight=[*good.in_flight, ("p3", "p1", 1, b"5")])
    lost = dataclasses.replace(good, snapshot_id="lost", in_flight=[])
    assert check_invariants(bank.app, good) == {"conserved": []}
    assert check_invariants(bank.app, made) == {
        "conserved": ["balances 2993 + in flight 12 = 3005, not the total 3000"]}
    assert check_invariants(bank.app, lost)["conserved"] == ["balances 2993 + in flight 0 = 2993, not the total 3000"]
    with_total = dataclasses.replace(good, params={"total": 2000})
    assert check_invariants(bank.app, with_total)["conserved"] != []
    assert sorted(sql_violations(bank.app, [good, made, lost])["conserved"]) == [("lost", 3000, 2993), ("made", 3000, 3005)]


def test_a_doctored_bank_state_is_a_problem_not_a_crash():
    view = View(snapshot_id="s", states={"p1": b"-5", "p2": b"1000"}, in_flight=[])
    [problem] = check_invariants(bank.app, view)["conserved"]
    assert problem.startswith("the check raised ValueError: the state of p1 is not decimal ASCII: b'-5' (bank.py:")


def test_a_failing_run_names_its_seed():
    def never(view):
        return ["never holds"]

    app = dataclasses.replace(bank.app, invariants={"never": never})
    with pytest.raises(InvariantBroken, match=r"^seed 41, step 0: \{'never': \['never holds'\]\}"):
        run(Cluster(app, MESH), seed=41, steps=5)
