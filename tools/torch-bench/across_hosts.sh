#!/usr/bin/env bash
# torch_bench.py --exchanges across two hosts: two network namespaces joined
# by a veth pair (addresses of their own, as two machines; they share a host
# name and a boot id, as containers and cloned VMs do), half the ranks in
# each. gloo goes over TCP on the veth link, fastgather over shared memory
# within each host and UCX (TCP on the same link) between them. Needs root
# (ip netns); run from the repository root after the build:
#
#   sudo tools/torch-bench/across_hosts.sh [--ranks 4] [--rounds 3] [--ops ...]
#
# Every argument is torch_bench.py's; --ranks must be even (default 4). The
# table is rank 0's; KEEP=dir keeps every rank's output there.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
PYPATH=${PYPATH:-$ROOT/build/python}
RANKS=4
ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) RANKS=$2; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
if [ $((RANKS % 2)) != 0 ] || [ "$RANKS" -lt 2 ]; then echo "--ranks must be even (half on each host)" >&2; exit 2; fi
A=fgtbA$$ B=fgtbB$$ VA=fgtba$$ VB=fgtbb$$
IP_A=10.232.$((RANDOM % 200 + 20)).1
IP_B=${IP_A%.1}.2
TMP=$(mktemp -d)
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap "cp -r $TMP $KEEP; cleanup" EXIT
ip netns add "$A"
ip netns add "$B"
ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$A"
ip link set "$VB" netns "$B"
ip -n "$A" addr add "$IP_A/24" dev "$VA"
ip -n "$B" addr add "$IP_B/24" dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up
ip -n "$B" link set "$VB" up
PORT=$((29000 + RANDOM % 900))
half=$((RANKS / 2))
for r in $(seq 0 $((RANKS - 1))); do
  ns=$A dev=$VA
  if [ "$r" -ge "$half" ]; then ns=$B dev=$VB; fi
  (ip netns exec "$ns" env PYTHONPATH="$PYPATH" GLOO_SOCKET_IFNAME="$dev" \
     "$PY" "$ROOT/tools/torch-bench/torch_bench.py" --exchanges --ranks "$RANKS" --rank "$r" --master "$IP_A" \
     --port "$PORT" "${ARGS[@]}" >"$TMP/rank$r.out" 2>&1
   echo $? >"$TMP/rank$r.rc") &
done
wait
fails=0
for r in $(seq 0 $((RANKS - 1))); do
  if [ "$(cat "$TMP/rank$r.rc")" != 0 ]; then
    echo "rank $r exited $(cat "$TMP/rank$r.rc"):" >&2
    tail -20 "$TMP/rank$r.out" >&2
    fails=1
  fi
done
echo "torch_bench.py --exchanges, $RANKS ranks on two hosts (network namespaces on a veth link), $half on each"
cat "$TMP/rank0.out"
exit $fails
