#!/usr/bin/env bash
# snapmesh as a Docker Swarm stack (docs/deploy.md, "Run on Docker Swarm"). Run on a
# Swarm manager, from anywhere:
#
#   deploy/compose/swarm.sh deploy [STACK]          (default STACK: snapmesh)
#   deploy/compose/swarm.sh rm [STACK] [--volumes]
#   deploy/compose/swarm.sh label-self HOST         (this node's snapmesh.host label, e.g. h1)
#
# deploy: the first time, makes the certificates and the token (`snapmesh certs` in
# the image, into a private temporary dir), creates one Swarm secret per file
# (STACK-ca.pem, STACK-p1-key.pem, ...; the CA's key is not kept), copies the
# client's files (ca.pem, client.pem, client-key.pem, token) to SNAPMESH_TLS_EXPORT
# (default deploy/compose/tls/), and removes the dir. Then `docker stack deploy`
# of docker-stack.yml (+ docker-stack.monitoring.yml unless SNAPMESH_MONITORING=0)
# with the hosts' own images (--resolve-image never). Deploying again keeps the
# secrets. The stack files are generate.py's (--hosts N spreads the nodes over the
# hosts labelled snapmesh.host=h1..hN).
#
# rm: removes the stack and its secrets, waits until its containers and network are
# gone; --volumes removes its volumes too (the data: logs, snapshots).
#
# Variables: SNAPMESH_IMAGE (default snapmesh:latest), SNAPMESH_MONITORING (1),
# SNAPMESH_TLS_EXPORT, SNAPMESH_STACK_DIR (where the stack files are; default here),
# and the stack files' own (SNAPMESH_CONTROLLER_PORT, PROMETHEUS_IMAGE, ...).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
STACK_DIR="${SNAPMESH_STACK_DIR:-$HERE}"
IMAGE="${SNAPMESH_IMAGE:-snapmesh:latest}"
LABEL=org.snapmesh.stack

usage() { sed -n '2,9p' "$0" >&2; exit 2; }
die() { echo "swarm.sh: $*" >&2; exit "${2:-1}"; }

need_manager() {
    command -v docker >/dev/null 2>&1 || die "docker is not installed" 2
    local state
    state="$(docker info --format '{{.Swarm.LocalNodeState}} {{.Swarm.ControlAvailable}}' 2>/dev/null)" ||
        die "no Docker engine answers (docker info failed)" 2
    [ "$state" = "active true" ] || die "this Docker engine is not a Swarm manager (docker swarm init, or run on the manager)" 2
}

make_secrets() {  # stack
    local stack="$1" tmp name export_dir
    if docker secret inspect "$stack-ca.pem" >/dev/null 2>&1; then
        echo "swarm.sh: the secrets of $stack exist: kept"
        return 0
    fi
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/snapmesh-swarm-certs.XXXXXX")"
    # shellcheck disable=SC2064  # expand now: remove this dir whatever happens
    trap "rm -rf '$tmp'" EXIT
    docker run --rm --user "$(id -u):$(id -g)" --network none \
        -v "$tmp:/out" -v "$STACK_DIR/cluster.toml:/etc/snapmesh/cluster.toml:ro" \
        "$IMAGE" certs --config /etc/snapmesh/cluster.toml --tls-dir /out >/dev/null
    rm -f "$tmp/ca-key.pem"
    for file in "$tmp"/*; do
        name="$(basename "$file")"
        docker secret create --label "$LABEL=$stack" "$stack-$name" "$file" >/dev/null
    done
    export_dir="${SNAPMESH_TLS_EXPORT:-$HERE/tls}"
    mkdir -p "$export_dir"
    cp "$tmp/ca.pem" "$tmp/client.pem" "$tmp/client-key.pem" "$tmp/token" "$export_dir/"
    chmod 0600 "$export_dir/client-key.pem" "$export_dir/token"
    rm -rf "$tmp"
    trap - EXIT
    echo "swarm.sh: made the certificates and the token of $stack as Swarm secrets; the client's files are in $export_dir"
}

deploy() {  # stack
    local stack="$1" files=(-c docker-stack.yml)
    need_manager
    [ -f "$STACK_DIR/docker-stack.yml" ] || die "no $STACK_DIR/docker-stack.yml (deploy/compose/generate.py writes it)" 2
    make_secrets "$stack"
    [ "${SNAPMESH_MONITORING:-1}" = 0 ] || files+=(-c docker-stack.monitoring.yml)
    (cd "$STACK_DIR" && SNAPMESH_STACK="$stack" SNAPMESH_IMAGE="$IMAGE" \
        docker stack deploy --resolve-image never --prune "${files[@]}" "$stack")
}

remove() {  # stack [--volumes]
    local stack="$1" volumes="${2:-}" deadline
    need_manager
    docker stack rm "$stack" >/dev/null 2>&1 || true
    deadline=$(( $(date +%s) + 120 ))
    while [ -n "$(docker ps -aq --filter "label=com.docker.stack.namespace=$stack")" ] ||
          [ -n "$(docker network ls -q --filter "label=com.docker.stack.namespace=$stack")" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || die "the containers or network of $stack are still there after 120 s"
        sleep 1
    done
    docker secret ls -q --filter "label=$LABEL=$stack" | xargs -r docker secret rm >/dev/null
    if [ "$volumes" = --volumes ]; then
        docker volume ls -q --filter "label=com.docker.stack.namespace=$stack" | xargs -r docker volume rm >/dev/null
    fi
    echo "swarm.sh: removed $stack${volumes:+ and its volumes}"
}

case "${1:-}" in
    deploy) [ $# -le 2 ] || usage; deploy "${2:-snapmesh}" ;;
    rm) [ $# -le 3 ] || usage
        if [ "${2:-}" = --volumes ]; then remove snapmesh --volumes; else remove "${2:-snapmesh}" "${3:-}"; fi ;;
    label-self) [ $# -eq 2 ] || usage; need_manager
        docker node update --label-add "snapmesh.host=$2" "$(docker info --format '{{.Swarm.NodeID}}')" >/dev/null ;;
    *) usage ;;
esac
