#!/usr/bin/env bash
# Installs the build into a fresh prefix and builds a small program of
# another project against it three ways: find_package with the shared and
# with the static library, and pkg-config; each one runs (2 ranks).
set -euo pipefail
BUILD=${1:?usage: run.sh BUILD_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cmake --install "$BUILD" --prefix "$TMP/prefix" >/dev/null
LIBDIR=$(ls -d "$TMP"/prefix/lib* | head -1)
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
port=$((30100 + RANDOM % 500))
for flavour in fastgather fastgather_static; do
  cmake -S "$HERE" -B "$TMP/build-$flavour" -DCMAKE_PREFIX_PATH="$TMP/prefix" -DFG_FLAVOUR=$flavour >/dev/null
  cmake --build "$TMP/build-$flavour" >/dev/null
  PORT=$((port++)) "$TMP/build-$flavour/consumer"
  echo "ok: find_package(fastgather) -> fastgather::$flavour"
done
if [ "$(ldd "$TMP/build-fastgather/consumer" | grep -c libfastgather)" != 1 ]; then
  echo "FAILED: the shared flavour is not linked to libfastgather.so"; exit 1
fi
PKG_CONFIG_PATH="$LIBDIR/pkgconfig" pkg-config --exists fastgather
# shellcheck disable=SC2046
g++ -std=c++20 -o "$TMP/consumer-pc" "$HERE/main.cpp" $(PKG_CONFIG_PATH="$LIBDIR/pkgconfig" pkg-config --cflags --libs fastgather)
PORT=$((port++)) "$TMP/consumer-pc"
echo "ok: pkg-config fastgather"
echo "consumer: 3 passed, 0 failed"
