#!/usr/bin/env bash
# Build snapmesh's two images from the current tree, with no registry needed:
#
#   deploy/compose/build-images.sh [TAG]        (default: latest)
#
# 1. the base images (build-base.sh: debootstrap + docker import, reused when
#    present: snapmesh-base-slim without Java, snapmesh-base with it) unless
#    BASE_IMAGE names another base (e.g. python:3.11-slim-bookworm, for machines
#    that can pull it; RECONCILE_BASE_IMAGE then defaults to the same);
# 2. the wheels (fetch-wheels.sh: host cache, no PyPI from inside containers);
# 3. snapmesh:TAG (node, controller, app: lean) and snapmesh-reconcile:TAG
#    (+ Spark, Java), each tagged with the version in pyproject.toml too (the Helm
#    chart's default tag); prints each image's size.
# `make images` runs this; so does tests/deploy/test_compose.py.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TAG="${1:-latest}"
# Also tagged with the package's version: the Helm chart's default image tag is its appVersion.
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -n 1)"
BASE_IMAGE="${BASE_IMAGE:-snapmesh-base-slim:bookworm}"

if [ "$BASE_IMAGE" = snapmesh-base-slim:bookworm ]; then
    RECONCILE_BASE_IMAGE="${RECONCILE_BASE_IMAGE:-snapmesh-base:bookworm}"
    "$HERE/build-base.sh" "$BASE_IMAGE" "$RECONCILE_BASE_IMAGE"
fi
RECONCILE_BASE_IMAGE="${RECONCILE_BASE_IMAGE:-$BASE_IMAGE}"
"$HERE/fetch-wheels.sh"
for target in service reconcile; do
    name=snapmesh; [ "$target" = reconcile ] && name=snapmesh-reconcile
    start=$(date +%s)
    docker build -q -f "$HERE/Dockerfile" --target "$target" \
        --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg RECONCILE_BASE_IMAGE="$RECONCILE_BASE_IMAGE" \
        -t "$name:$TAG" "$ROOT" 2> >(grep -v -i -E 'deprecated|buildx|buildkit|^\s*$' >&2) >/dev/null
    [ -z "$VERSION" ] || [ "$VERSION" = "$TAG" ] || docker tag "$name:$TAG" "$name:$VERSION"
    size="$(docker image inspect --format '{{.Size}}' "$name:$TAG")"
    echo "build-images: $name:$TAG ($target) in $(( $(date +%s) - start ))s, $(( size / 1000000 )) MB"
done
