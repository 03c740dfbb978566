"""Who may call what: one table for every gRPC server of a TLS cluster.

A caller is known by the names its certificate gives (its subjectAltName). The
cluster file says who is who (`security.cluster_roles`): the node ids, the controller
(`controller`) and the client names (`[auth] clients`, by default `client`, the
certificate `snapmesh certs` makes for the CLI). Each RPC has one rule, and each
rule one code, indexed in docs/security.md ("Who may call what"):

- AUTH1 `CLIENT_WRITE`: a control-plane write (TriggerSnapshot, RestoreSnapshot,
  and any snapmesh call this table does not name) is for a client's certificate
  only, plus the token when the cluster has one. A certificate that names a node
  or the controller is never a client's, whatever else it names, so a node's key
  never triggers nor restores, with or without the token.
- AUTH2 `CONTROLLER`: the node control calls only the controller makes
  (StartSnapshot, AbortSnapshot, Fence, RestoreState) need the controller's
  certificate, and no token: nodes hold none, so the controller never sends it.
- AUTH3 `NODE`: reports (ReportState, ReportStateChunks) and channel streams
  (Channel) need a node's certificate. Which node depends on the request, so
  the servicer checks that part (`credentials.require_peer`).
- AUTH4 `ANY`: client traffic (Transfer, TransferBatch, Submit, SubmitBatch, Query), health and
  reflection: any certificate of the cluster's CA.
- AUTH5 `READ`: reads (Get*, List*, Watch*): any certificate of the CA; with
  `protect_reads` a client's or the controller's only, plus the token on a server
  that holds it (the controller; nodes hold none).

On a plaintext connection there is no certificate: the names are None and only
the token is checked (a plaintext cluster has none: `[auth]` needs `[tls]`).
Misuse of the table (a server without the cluster's roles) is the caller's bug,
not a refusal. Nothing here does I/O: `Gate.check` is a function of the method,
the names and the token presented; snapmesh/serving/credentials.py carries its
answer out.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

# The certificates `snapmesh certs` makes besides the nodes' (snapmesh.settings.config
# reads these names from here: a node id may be neither).
CLIENT_NAME = "client"
CONTROLLER_NAME = "controller"


class Rule(enum.Enum):
    """Who may call an RPC; the value is the rule's code (docs/security.md)."""

    CLIENT_WRITE = "AUTH1"
    CONTROLLER = "AUTH2"
    NODE = "AUTH3"
    ANY = "AUTH4"
    READ = "AUTH5"


_CONTROLLER = "/snapmesh.v1.Controller/"
_NODE = "/snapmesh.v1.Node/"

RULES: Mapping[str, Rule] = {
    _CONTROLLER + "TriggerSnapshot": Rule.CLIENT_WRITE,
    _CONTROLLER + "RestoreSnapshot": Rule.CLIENT_WRITE,
    _CONTROLLER + "GetSnapshot": Rule.READ,
    _CONTROLLER + "GetSnapshotChunks": Rule.READ,
    _CONTROLLER + "ListSnapshots": Rule.READ,
    _CONTROLLER + "WatchSnapshots": Rule.READ,
    _CONTROLLER + "GetCluster": Rule.READ,
    _CONTROLLER + "ReportState": Rule.NODE,
    _CONTROLLER + "ReportStateChunks": Rule.NODE,
    _NODE + "StartSnapshot": Rule.CONTROLLER,
    _NODE + "AbortSnapshot": Rule.CONTROLLER,
    _NODE + "Fence": Rule.CONTROLLER,
    _NODE + "RestoreState": Rule.CONTROLLER,
    _NODE + "RestoreStateChunks": Rule.CONTROLLER,
    _NODE + "Channel": Rule.NODE,
    _NODE + "Transfer": Rule.ANY,
    _NODE + "TransferBatch": Rule.ANY,
    _NODE + "Submit": Rule.ANY,
    _NODE + "SubmitBatch": Rule.ANY,
    # A client's read of the app: client traffic as Submit, not a READ, for what it shows
    # is what a Submit of a read command shows the same caller (an app's own data, not
    # the cluster's control plane), and a client that may Submit must not lose reads to
    # protect_reads, which guards snapshots and node state.
    _NODE + "Query": Rule.ANY,
    _NODE + "GetState": Rule.READ,
}
# gRPC's own services every server adds: a healthcheck presents whatever pair its
# container holds, and reflection only describes the API.
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1.ServerReflection/",
                 "/grpc.reflection.v1alpha.ServerReflection/")


def rule(method: str, rules: Mapping[str, Rule] = RULES) -> Rule:
    """The rule of `method` ("/package.Service/Method"). A snapmesh call the table
    does not name is a control-plane write (AUTH1): an admin call added without a
    row here is closed to nodes, never open to them by default."""
    found = rules.get(method)
    if found is not None:
        return found
    return Rule.ANY if method.startswith(OPEN_SERVICES) else Rule.CLIENT_WRITE


def parse_clients(value: object, node_ids: Iterable[str], error: Callable[[str, str], Exception]) -> tuple[str, ...]:
    """`[auth] clients`, checked: a non-empty array of certificate names, none a
    node id nor the controller's (`error(field, problem)` is raised otherwise)."""
    if not isinstance(value, list) or not value or not all(isinstance(name, str) and name for name in value):
        raise error("auth.clients", f"must be a non-empty array of certificate names, got {value!r}")
    if taken := sorted(set(value) & {CONTROLLER_NAME, *node_ids}):
        raise error("auth.clients", f"{taken[0]!r} is the controller's or a node's name: their certificates never write")
    return tuple(dict.fromkeys(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class Roles:
    """Who is who in one cluster, by the names certificates give."""

    nodes: frozenset[str]
    controller: str = CONTROLLER_NAME
    clients: frozenset[str] = frozenset({CLIENT_NAME})

    def is_client(self, names: Collection[str]) -> bool:
        """A client's certificate names a client and neither a node nor the controller."""
        named = set(names)
        return bool(named & self.clients) and not named & self.nodes and self.controller not in named

    def who(self, names: Collection[str]) -> str:
        """The caller, in words, for a refusal: the role its certificate gives, else its names."""
        named = set(names)
        if nodes := sorted(named & self.nodes):
            return f"the certificate of node {nodes[0]!r}"
        if self.controller in named:
            return f"the certificate of the controller ({self.controller!r})"
        if clients := sorted(named & self.clients):
            return f"the certificate of client {clients[0]!r}"
        return f"a certificate naming {', '.join(map(repr, sorted(named))) or 'nothing'}"

    def wanted(self, rule: Rule, protect_reads: bool) -> str:
        """Whose certificate `rule` asks for, in words."""
        clients = ", ".join(map(repr, sorted(self.clients)))
        if rule is Rule.CLIENT_WRITE:
            return f"a client's certificate ([auth] clients: {clients})"
        if rule is Rule.CONTROLLER:
            return f"the controller's certificate ({self.controller!r})"
        if rule is Rule.NODE:
            return "a node's certificate"
        if rule is Rule.READ and protect_reads:
            return f"a client's ({clients}) or the controller's certificate (protect_reads)"
        return "a certificate of the cluster's CA"

    def allows(self, rule: Rule, names: Collection[str], protect_reads: bool) -> bool:
        if rule is Rule.CLIENT_WRITE:
            return self.is_client(names)
        if rule is Rule.CONTROLLER:
            return self.controller in names
        if rule is Rule.NODE:
            return bool(set(names) & self.nodes)
        if rule is Rule.READ and protect_reads:
            return self.is_client(names) or self.controller in names
        return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    """A call the gate refuses: the gRPC status name and the message the caller gets."""

    code: str  # "PERMISSION_DENIED" (who) or "UNAUTHENTICATED" (the token)
    rule: Rule
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Gate:
    """One server's check: the cluster's roles, the token it holds (None: it asks
    for none) and whether reads are protected."""

    roles: Roles
    token: str | None = None
    protect_reads: bool = False
    rules: Mapping[str, Rule] = field(default_factory=lambda: RULES)

    def guards(self, method: str) -> bool:
        """False when `check` can never refuse `method` (no handler need be wrapped)."""
        found = rule(method, self.rules)
        return found is not Rule.ANY and not (found is Rule.READ and not self.protect_reads)

    def check(self, method: str, names: Collection[str] | None, presented: str | None) -> Refused | None:
        """None when the caller may call `method`. `names`: its certificate's
        subjectAltNames (None: plaintext, nothing to check); `presented`: the
        `authorization` header it sent (None: none). Who it is comes first: a
        node's certificate is refused even with the right token."""
        found = rule(method, self.rules)
        if names is not None and not self.roles.allows(found, names, self.protect_reads):
            return Refused(
                code="PERMISSION_DENIED", rule=found,
                message=f"{method}: refused to {self.roles.who(names)}, not "
                        f"{self.roles.wanted(found, self.protect_reads)} (rule {found.value})",
            )
        needs_token = found is Rule.CLIENT_WRITE or (found is Rule.READ and self.protect_reads)
        if not needs_token or self.token is None:
            return None
        if presented is not None and hmac.compare_digest(presented.encode(), f"Bearer {self.token}".encode()):
            return None
        why = "missing bearer token" if presented is None else "wrong bearer token"
        return Refused(code="UNAUTHENTICATED", rule=found,
                       message=f"{method}: {why} (send `authorization: Bearer <token>`)")
