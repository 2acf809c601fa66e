#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine:
#   scripts/run.sh bench [fg-bench args]  install deps, build, run fg-bench
#   scripts/run.sh test                   install deps, build, run the tests
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(g++ cmake make pkg-config libgtest-dev libopenblas-dev libcli11-dev libfmt-dev nlohmann-json3-dev
          libopenmpi-dev openmpi-bin gnuplot-nox)

deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

build() {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)"
}

case "${1:-}" in
  bench)
    shift
    deps
    build
    exec ./build/tools/fg-bench/fg-bench "$@"
    ;;
  test)
    deps
    build
    # One test at a time: fault tests measure time-to-error on a 2-core machine.
    ctest --test-dir build --output-on-failure -j1
    ;;
  *)
    echo "usage: $0 bench [fg-bench args] | test" >&2
    exit 2
    ;;
esac
