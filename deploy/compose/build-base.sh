#!/usr/bin/env bash
# Build the base image snapmesh's Dockerfile starts from, on a machine that can
# pull no image from any registry: debootstrap a minimal Debian bookworm with
# Python 3.11, venv and a Java 17 runtime (for the Spark reconciliation job),
# then `docker import` it.
#
#   deploy/compose/build-base.sh [IMAGE]      (default: snapmesh-base:bookworm)
#
# Idempotent: when IMAGE exists and was built from the same package list it
# does nothing. Needs root (debootstrap), Docker, and Debian's apt mirror.
# Set SNAPMESH_BASE_REBUILD=1 to rebuild anyway. Users who can pull images do
# not need this: the Dockerfile's default base is python:3.11-slim-bookworm.
set -euo pipefail

IMAGE="${1:-${SNAPMESH_BASE_IMAGE:-snapmesh-base:bookworm}}"
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# procps: Spark's launch scripts call ps; ca-certificates: for users who add https.
PACKAGES="python3,python3-venv,openjdk-17-jre-headless,procps,ca-certificates"
LABEL="org.snapmesh.base.packages=${SUITE}:${PACKAGES}"

have_current_image() {
    local got
    got="$(docker image inspect --format '{{ index .Config.Labels "org.snapmesh.base.packages" }}' "$IMAGE" 2>/dev/null)" || return 1
    [ "$got" = "${SUITE}:${PACKAGES}" ]
}

if [ "${SNAPMESH_BASE_REBUILD:-0}" != 1 ] && have_current_image; then
    echo "build-base: $IMAGE is up to date"
    exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    echo "build-base: installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

ROOTFS="$(mktemp -d "${TMPDIR:-/tmp}/snapmesh-rootfs.XXXXXX")"
cleanup() { rm -rf --one-file-system "$ROOTFS"; }
trap cleanup EXIT

echo "build-base: debootstrap $SUITE into $ROOTFS (a few minutes the first time)"
start=$(date +%s)
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" \
    >"$ROOTFS.log" 2>&1 || { tail -n 40 "$ROOTFS.log"; rm -f "$ROOTFS.log"; exit 1; }
rm -f "$ROOTFS.log"

# Slim it: apt lists, caches, docs and man pages are not needed at run time.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
       "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/usr/share/doc/* \
       "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*
# Same apt sources as the public image, so `apt-get install` works in derived images.
cat >"$ROOTFS/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
EOF

tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change "LABEL $LABEL" \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    - "$IMAGE" >/dev/null
echo "build-base: built $IMAGE in $(( $(date +%s) - start ))s"
