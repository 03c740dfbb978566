#!/usr/bin/env bash
# Build the base images snapmesh's Dockerfile starts from, on a machine that can
# pull no image from any registry: debootstrap a minimal Debian bookworm and
# `docker import` it, twice:
#
#   IMAGE       python3 (3.11), venv, ca-certificates: the service image's base
#               (node, controller, app never need Java);
#   JAVA_IMAGE  the same plus a Java 17 runtime and procps: the reconcile
#               image's base (Spark).
#
#   deploy/compose/build-base.sh [IMAGE [JAVA_IMAGE]]
#       (default: snapmesh-base-slim:bookworm snapmesh-base:bookworm)
#
# Idempotent: an image that exists and was built from the same package list is
# kept. Downloaded packages are cached (SNAPMESH_DEBOOTSTRAP_CACHE, default
# ~/.cache/snapmesh/debootstrap), so the second image costs no second download.
# Needs root (debootstrap), Docker, and Debian's apt mirror. Set
# SNAPMESH_BASE_REBUILD=1 to rebuild anyway. Users who can pull images do not
# need this: the Dockerfile's default base is python:3.11-slim-bookworm.
set -euo pipefail

IMAGE="${1:-snapmesh-base-slim:bookworm}"
JAVA_IMAGE="${2:-snapmesh-base:bookworm}"
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${SNAPMESH_DEBOOTSTRAP_CACHE:-$HOME/.cache/snapmesh/debootstrap}"
PACKAGES="python3,python3-venv,ca-certificates"
# procps: Spark's launch scripts call ps.
JAVA_PACKAGES="python3,python3-venv,openjdk-17-jre-headless,procps,ca-certificates"

have_current_image() {  # image packages
    local got
    got="$(docker image inspect --format '{{ index .Config.Labels "org.snapmesh.base.packages" }}' "$1" 2>/dev/null)" || return 1
    [ "$got" = "${SUITE}:$2" ]
}

bootstrap() {  # image packages
    local image="$1" packages="$2" rootfs start
    if [ "${SNAPMESH_BASE_REBUILD:-0}" != 1 ] && have_current_image "$image" "$packages"; then
        echo "build-base: $image is up to date"
        return 0
    fi
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "build-base: installing debootstrap"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    fi
    mkdir -p "$CACHE"
    rootfs="$(mktemp -d "${TMPDIR:-/tmp}/snapmesh-rootfs.XXXXXX")"
    # shellcheck disable=SC2064  # expand now: the trap must remove this rootfs
    trap "rm -rf --one-file-system '$rootfs' '$rootfs.log'" EXIT
    echo "build-base: debootstrap $SUITE ($packages) into $rootfs (a few minutes the first time)"
    start=$(date +%s)
    debootstrap --variant=minbase --cache-dir="$CACHE" --include="$packages" "$SUITE" "$rootfs" "$MIRROR" \
        >"$rootfs.log" 2>&1 || { tail -n 40 "$rootfs.log"; exit 1; }

    # Slim it: apt lists, caches, docs and man pages are not needed at run time.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
           "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/usr/share/doc/* \
           "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
    # Same apt sources as the public image, so `apt-get install` works in derived images.
    cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
SOURCES

    tar --numeric-owner -C "$rootfs" -c . | docker import \
        --change "LABEL org.snapmesh.base.packages=${SUITE}:${packages}" \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' \
        - "$image" >/dev/null
    rm -rf --one-file-system "$rootfs" "$rootfs.log"
    trap - EXIT
    echo "build-base: built $image in $(( $(date +%s) - start ))s"
}

bootstrap "$IMAGE" "$PACKAGES"
bootstrap "$JAVA_IMAGE" "$JAVA_PACKAGES"
