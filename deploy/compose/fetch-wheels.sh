#!/usr/bin/env bash
# Put every Python wheel the images need into deploy/compose/wheels/ (inside the
# Docker build context, ignored by git), so the image build installs them with
# `pip install --no-index` and never reaches PyPI from a container.
#
#   deploy/compose/fetch-wheels.sh
#
# Wheels are downloaded on the host for CPython 3.11 / manylinux x86_64 into a
# cache outside the repository (SNAPMESH_WHEEL_CACHE, default
# ~/.cache/snapmesh/wheels) and copied from there; pyspark is published only as
# a source archive, so its wheel is built here once (~40 s) and cached.
# Users who can reach PyPI from `docker build` may skip this: with an empty
# wheels/ directory the Dockerfile falls back to PyPI.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${SNAPMESH_WHEEL_CACHE:-$HOME/.cache/snapmesh/wheels}"
OUT="$HERE/wheels"
if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi
PIP=("$PY" -m pip --disable-pip-version-check -q)
PLATFORM_ARGS=(--only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 --abi abi3 --abi none
               --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
               --platform manylinux2014_x86_64 --platform any)

mkdir -p "$CACHE" "$OUT"

# pip download is cheap when everything is already in the cache dir (no
# network when the files are present and --no-index resolves them).
resolve() {  # requirements file -> wheels in $CACHE
    if "${PIP[@]}" download --no-index --find-links "$CACHE" -d "$CACHE" "${PLATFORM_ARGS[@]}" -r "$1" >/dev/null 2>&1; then
        return 0
    fi
    echo "fetch-wheels: downloading $(basename "$1") wheels into $CACHE"
    "${PIP[@]}" download -d "$CACHE" "${PLATFORM_ARGS[@]}" -r "$1"
}

resolve "$HERE/requirements-service.txt"
resolve "$HERE/requirements-build.txt"

# pyspark: an sdist only. Build its wheel (pure Python) once; py4j has a wheel.
pyspark_pin="$(grep -E '^pyspark==' "$HERE/requirements-reconcile.txt")"
pyspark_version="${pyspark_pin#pyspark==}"
if ! ls "$CACHE"/pyspark-"$pyspark_version"-*.whl >/dev/null 2>&1; then
    echo "fetch-wheels: building the $pyspark_pin wheel (~40 s the first time)"
    "${PIP[@]}" wheel --no-deps -w "$CACHE" "$pyspark_pin"
fi
grep -vE '^(pyspark==|#|$)' "$HERE/requirements-reconcile.txt" >"$CACHE/.reconcile-rest.txt"
resolve "$CACHE/.reconcile-rest.txt"

# Link (or copy) exactly what each requirement file resolves to into the build
# context: wheels/service/ for the service image and the builder's tools
# (requirements-build.txt: they stay in the builder stage), wheels/reconcile/
# for what the reconcile image adds. Wheels already there are kept, stale ones removed.
place() {  # dir requirements...
    local dir="$1" whl wanted; shift
    mkdir -p "$dir"
    for whl in "$CACHE"/*.whl; do
        [ -e "$dir/$(basename "$whl")" ] || ln "$whl" "$dir/" 2>/dev/null || cp "$whl" "$dir/"
    done
    local reqs=(); for r in "$@"; do reqs+=(-r "$r"); done
    wanted="$("${PIP[@]}" download --no-index --find-links "$dir" -d "$dir" "${PLATFORM_ARGS[@]}" "${reqs[@]}" -v 2>&1 \
        | sed -nE 's#^.*(File was already downloaded|Saved) (.*\.whl).*$#\2#p' | xargs -rn1 basename)"
    [ -n "$wanted" ] || { echo "fetch-wheels: could not resolve $* from $dir" >&2; exit 1; }
    for whl in "$dir"/*.whl; do
        grep -qxF "$(basename "$whl")" <<<"$wanted" || rm -f "$whl"
    done
}
place "$OUT/service" "$HERE/requirements-service.txt" "$HERE/requirements-build.txt"
place "$OUT/reconcile" "$HERE/requirements-reconcile.txt"
echo "fetch-wheels: $(ls "$OUT"/service/*.whl | wc -l) service and $(ls "$OUT"/reconcile/*.whl | wc -l) reconcile wheels in $OUT"
