#!/usr/bin/env bash
# Move the data of a compose stack made before each process had volumes of its own
# (one volume, <project>_snapmesh-data, shared by every service) to this layout:
# each node's files (<node>.log*.jsonl, its lock and reports) to <project>_<node>-data,
# the controller's (snapshots/, controller/) to <project>_controller-data.
#
#   deploy/compose/migrate-data.sh [PROJECT]    (default: $COMPOSE_PROJECT_NAME, else
#                                                "compose", the directory's name)
#
# Run it once with the stack down, before `up`. It does nothing when there is no old
# volume, or when <project>_controller-data exists (moved already, or a stack of this
# layout). The old volume is left as it was: remove it yourself once the stack runs.
# The node ids are read from cluster.toml beside this script. The EC2 user data runs it.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PROJECT="${1:-${COMPOSE_PROJECT_NAME:-compose}}"
IMAGE="${SNAPMESH_IMAGE:-snapmesh:latest}"
OLD="${PROJECT}_snapmesh-data"

if ! docker volume inspect "$OLD" >/dev/null 2>&1; then
    echo "migrate-data: no volume $OLD: nothing to move"
    exit 0
fi
if docker volume inspect "${PROJECT}_controller-data" >/dev/null 2>&1; then
    echo "migrate-data: ${PROJECT}_controller-data exists: nothing to move"
    exit 0
fi

copy() {  # volume what (a shell glob relative to the old volume)
    local volume="${PROJECT}_$1"
    # Labelled as compose labels the volumes it makes, so that compose takes it as its own.
    docker volume create --label "com.docker.compose.project=$PROJECT" \
        --label "com.docker.compose.volume=$1" "$volume" >/dev/null
    docker run --rm --user 0 --network none --entrypoint /bin/sh \
        -v "$OLD:/old:ro" -v "$volume:/new" "$IMAGE" \
        -c "cd /old && for f in $2; do [ -e \"\$f\" ] && cp -a \"\$f\" /new/; done; chown 10001:10001 /new"
    echo "migrate-data: $OLD ($2) -> $volume"
}

nodes="$(sed -nE 's/^ *\{ id = "([^"]+)".*/\1/p' "$HERE/cluster.toml")"
[ -n "$nodes" ] || { echo "migrate-data: no node ids in $HERE/cluster.toml" >&2; exit 1; }
for node in $nodes; do
    copy "$node-data" "$node.*"
done
# Last: its volume is the mark that the move is done.
copy controller-data "snapshots controller"
