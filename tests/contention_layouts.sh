#!/usr/bin/env bash
# The 12-rank two-server layouts that timed out under load (issue 20: rank 1
# waiting for rank 5 while rank 5 waited for rank 1; a rank blocked sending
# over UCX while its peer waited over shared memory) run again and again
# beside two busy-loop processes on this 2-core machine, every byte checked,
# under the default timeout. A deadlock would hang here (each run is bounded
# by `timeout`, which fails it); slowness only costs time, and the long
# waits are reported on stderr ("still waiting"), counted below.
set -u
BENCH=${1:?usage: contention_layouts.sh path/to/fg-bench [runs]}
RUNS=${2:-3}
TMP=$(mktemp -d)
busy=()
cleanup() { kill "${busy[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
for _ in 1 2; do
  timeout 900 bash -c 'while :; do :; done' &
  busy+=($!)
done
fails=0
for run in $(seq 1 "$RUNS"); do
  for layout in "2 6" "3 4"; do
    set -- $layout
    out="$TMP/$1x$2.$run"
    start=$(date +%s%N)
    FG_NO_MPIRUN=1 SERVER_NUM=2 TP=$1 DP=$2 timeout 400 "$BENCH" -c --m 8,33,130 --no-compare --no-limits \
      --time-ms 20 >"$out" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    rows=$(grep -c '| ok |' "$out")
    reports=$(grep -c 'still waiting' "$out")
    if [ "$rc" = 0 ] && [ "$rows" -gt 0 ] && ! grep -q 'failed' "$out"; then
      echo "ok: run $run, SERVER_NUM=2 TP=$1 DP=$2 under load: exit 0, $rows rows checked ok, ${ms} ms, $reports long-wait reports"
    else
      echo "FAILED: run $run, SERVER_NUM=2 TP=$1 DP=$2 under load: exit $rc after ${ms} ms"
      tail -30 "$out"
      fails=$((fails + 1))
    fi
  done
done
echo "contention_layouts: $fails failed"
[ "$fails" = 0 ]
