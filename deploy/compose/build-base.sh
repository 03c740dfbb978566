#!/usr/bin/env bash
# Build the base images snapmesh's Dockerfile starts from, on a machine that can
# pull no image from any registry: debootstrap a minimal Debian bookworm and
# `docker import` two images of it:
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
# kept. Debian is debootstrapped once: JAVA_IMAGE is IMAGE's root before slimming
# plus its extra packages, installed by apt-get in a chroot from the same package
# list (a second debootstrap unpacked and configured the whole base again: a minute
# or more). Downloaded packages are cached (SNAPMESH_DEBOOTSTRAP_CACHE, default
# ~/.cache/snapmesh/debootstrap), so a rebuild costs no second download.
# Needs root (debootstrap, chroot, mount), Docker, and Debian's apt mirror. Set
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
# What JAVA_IMAGE has beyond IMAGE, installed into a copy of IMAGE's root.
JAVA_EXTRA="$(comm -13 <(tr , '\n' <<<"$PACKAGES" | sort) <(tr , '\n' <<<"$JAVA_PACKAGES" | sort) | paste -sd ' ')"

have_current_image() {  # image packages
    local got
    got="$(docker image inspect --format '{{ index .Config.Labels "org.snapmesh.base.packages" }}' "$1" 2>/dev/null)" || return 1
    [ "$got" = "${SUITE}:$2" ]
}

needed() {  # image packages
    if [ "${SNAPMESH_BASE_REBUILD:-0}" != 1 ] && have_current_image "$1" "$2"; then
        echo "build-base: $1 is up to date"
        return 1
    fi
}

ROOTS=()
cleanup() {
    local root
    for root in "${ROOTS[@]+"${ROOTS[@]}"}"; do
        ! mountpoint -q "$root/proc" || umount "$root/proc" || true
        rm -rf --one-file-system "$root" "$root.log"
    done
}
trap cleanup EXIT

new_root() {  # -> NEW_ROOT, a fresh directory, removed on exit
    NEW_ROOT="$(mktemp -d "${TMPDIR:-/tmp}/snapmesh-rootfs.XXXXXX")"
    ROOTS+=("$NEW_ROOT")
}

bootstrap() {  # rootfs packages
    local rootfs="$1" packages="$2" start
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "build-base: installing debootstrap"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    fi
    mkdir -p "$CACHE"
    echo "build-base: debootstrap $SUITE ($packages) into $rootfs (a few minutes the first time)"
    start=$(date +%s)
    debootstrap --variant=minbase --cache-dir="$CACHE" --include="$packages" "$SUITE" "$rootfs" "$MIRROR" \
        >"$rootfs.log" 2>&1 || { tail -n 40 "$rootfs.log"; exit 1; }
    echo "build-base: debootstrap done in $(( $(date +%s) - start ))s"
}

add_packages() {  # rootfs packages (space-separated): apt-get, in a chroot, from debootstrap's package list
    local rootfs="$1" packages="$2" start had_resolv=1
    echo "build-base: apt-get install $packages into $rootfs"
    start=$(date +%s)
    [ -e "$rootfs/etc/resolv.conf" ] || { had_resolv=0; cp /etc/resolv.conf "$rootfs/etc/resolv.conf"; }
    # The cached packages first, so only what is new is downloaded; what is, goes to the cache.
    find "$CACHE" -maxdepth 1 -name '*.deb' -exec cp -l -n -t "$rootfs/var/cache/apt/archives/" {} + 2>/dev/null \
        || find "$CACHE" -maxdepth 1 -name '*.deb' -exec cp -n -t "$rootfs/var/cache/apt/archives/" {} +
    mount -t proc proc "$rootfs/proc"  # the JVM's post-install steps (ca-certificates-java) read it
    # shellcheck disable=SC2086  # one word a package
    chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages \
        >"$rootfs.log" 2>&1 || { umount "$rootfs/proc"; tail -n 40 "$rootfs.log"; exit 1; }
    umount "$rootfs/proc"
    find "$rootfs/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -exec cp -n -t "$CACHE/" {} +
    [ "$had_resolv" = 1 ] || rm -f "$rootfs/etc/resolv.conf"
    echo "build-base: apt-get install done in $(( $(date +%s) - start ))s"
}

import() {  # rootfs image packages
    local rootfs="$1" image="$2" packages="$3"
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
    echo "build-base: built $image"
}

slim=0; java=0
! needed "$IMAGE" "$PACKAGES" || slim=1
! needed "$JAVA_IMAGE" "$JAVA_PACKAGES" || java=1
[ "$slim$java" != 00 ] || exit 0
start=$(date +%s)
new_root; root="$NEW_ROOT"
bootstrap "$root" "$PACKAGES"
if [ "$java" = 1 ]; then
    new_root; java_root="$NEW_ROOT"
    cp -a "$root/." "$java_root/"
    add_packages "$java_root" "$JAVA_EXTRA"
fi
[ "$slim" = 0 ] || import "$root" "$IMAGE" "$PACKAGES"
[ "$java" = 0 ] || import "$java_root" "$JAVA_IMAGE" "$JAVA_PACKAGES"
echo "build-base: done in $(( $(date +%s) - start ))s"
