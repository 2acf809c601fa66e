#!/usr/bin/env bash
# Two real hosts on one machine: two network namespaces joined by a veth
# pair, each with an address of its own. fg-bench runs server 0 in one and
# server 1 in the other, as on two machines (they share a host name and a
# boot id, as containers and cloned VMs do). Checks: every byte right with 3
# members of the group on each host (the hierarchical relay), the transport
# not taken for loopback, and a failure on either side (a size mismatch)
# making both exit non-zero. Skipped, with the reason, where namespaces
# cannot be made (not root, no iproute2).
set -u
BENCH=${1:?usage: netns_two_hosts.sh path/to/fg-bench [python3 path/to/build/python]}
PY=${2:-} PYPATH=${3:-}
WORKERS=$(cd "$(dirname "$0")" && pwd)/python/workers.py
A=fgA$$ B=fgB$$ VA=fgva$$ VB=fgvb$$
IP_A=10.231.$((RANDOM % 200 + 20)).1
IP_B=${IP_A%.1}.2
cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; rm -rf "$TMP"; }
TMP=$(mktemp -d)
trap cleanup EXIT
if ! command -v ip >/dev/null || ! ip netns add "$A" 2>"$TMP/why"; then
  echo "SKIPPED: cannot create network namespaces here: $(cat "$TMP/why" 2>/dev/null)"
  exit 0
fi
ip netns add "$B" && ip link add "$VA" type veth peer name "$VB" &&
  ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" &&
  ip -n "$A" addr add "$IP_A/24" dev "$VA" && ip -n "$B" addr add "$IP_B/24" dev "$VB" &&
  ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up &&
  ip -n "$A" link set lo up && ip -n "$B" link set lo up || { echo "FAILED: setting up the veth pair"; exit 1; }

fails=0
# run NAME TP DP "ARGS OF SERVER 0" "ARGS OF SERVER 1": both servers at once
run() {
  local name=$1 tp=$2 dp=$3 port=$((29700 + RANDOM % 200))
  local common=(env FG_NO_MPIRUN=1 SERVER_NUM=2 MASTER_IP="$IP_A" PORT=$port FG_TIMEOUT_MS=10000 TP=$tp DP=$dp
                FG_TOKEN="$TOKEN")
  # shellcheck disable=SC2086
  (ip netns exec "$A" "${common[@]}" SERVER_INDEX=0 timeout 300 "$BENCH" $4 >"$TMP/$name.0.out" 2>&1
   echo $? >"$TMP/$name.0.rc") &
  # shellcheck disable=SC2086
  (ip netns exec "$B" "${common[@]}" SERVER_INDEX=1 timeout 300 "$BENCH" $5 >"$TMP/$name.1.out" 2>&1
   echo $? >"$TMP/$name.1.rc") &
  wait
}
rc() { cat "$TMP/$1.$2.rc"; }
check() {  # check NAME CONDITION WHAT
  if eval "$2"; then
    echo "ok: $1: $3"
  else
    echo "FAILED: $1: $3"
    fails=$((fails + 1))
    for s in 0 1; do echo "--- server $s (exit $(rc "$1" $s))"; tail -25 "$TMP/$1.$s.out"; done
  fi
}

ARGS="-c --m 8,32 --hidden 3072 --time-ms 20 --no-compare --no-limits"
# The job's secret, set on both servers as the README's recipe does.
TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
# 3 members of the group on each host: hierarchical from 96 KB per rank.
run relay 1 6 "$ARGS" "$ARGS"
check relay '[ "$(rc relay 0)" = 0 ] && [ "$(rc relay 1)" = 0 ]' "TP=1 DP=6 across two hosts: both servers exit 0"
check relay '[ "$(grep -c "| ok |" "$TMP/relay.0.out")" = 6 ] && ! grep -q "failed" "$TMP/relay.0.out"' \
  "every row checked ok (both forms, the fused op)"
check relay '! grep -q "UCX_NET_DEVICES=lo" "$TMP/relay.0.out"' "two hosts are not taken for one (no loopback device)"
check relay '! grep -q "FG_TOKEN is not set" "$TMP/relay.0.out"' "with FG_TOKEN set, no warning"
# 2 groups of 2, each spanning the hosts (direct).
run groups 2 2 "$ARGS" "$ARGS"
check groups '[ "$(rc groups 0)" = 0 ] && [ "$(rc groups 1)" = 0 ] && [ "$(grep -c "| ok |" "$TMP/groups.0.out")" = 6 ]' \
  "TP=2 DP=2 across two hosts, every row ok"
# The second host disagrees on the size: both sides fail, and say so in their exit status.
TOKEN=  # and without a secret: rank 0 warns that anyone who reaches the port may join
run mismatch 1 4 "$ARGS" "${ARGS/--hidden 3072/--hidden 1024}"
check mismatch 'grep -q "FG_TOKEN is not set" "$TMP/mismatch.0.out"' "without FG_TOKEN, rank 0 warns"
check mismatch '[ "$(rc mismatch 0)" != 0 ] && [ "$(rc mismatch 1)" != 0 ]' "a mismatch makes both servers exit non-zero"
check mismatch 'grep -q "Mismatch" "$TMP/mismatch.0.out" "$TMP/mismatch.1.out"' "and the mismatch is named"
# From PyTorch: two ranks per host, the world gloo, a fastgather group across the hosts (shared
# memory within each, UCX between them): the gathers, the sums, the uneven gather, both fused ops.
if [ -n "$PY" ]; then
  port=$((29900 + RANDOM % 90))
  for r in 0 1 2 3; do
    ns=$A dev=$VA; [ $r -ge 2 ] && ns=$B dev=$VB
    (ip netns exec "$ns" env PYTHONPATH="$PYPATH" FG_TEST_MASTER="$IP_A" GLOO_SOCKET_IFNAME="$dev" \
       timeout 300 "$PY" "$WORKERS" across_hosts $r 4 $port \
       >"$TMP/torch.$r.out" 2>&1; echo $? >"$TMP/torch.$r.rc") &
  done
  wait
  check torch '[ "$(rc torch 0)$(rc torch 1)$(rc torch 2)$(rc torch 3)" = 0000 ]' \
    "torch.distributed, 2 ranks on each of two hosts: every byte right over UCX"
  if [ "$(rc torch 0)$(rc torch 1)$(rc torch 2)$(rc torch 3)" != 0000 ]; then
    for r in 2 3; do echo "--- torch rank $r (exit $(rc torch $r))"; tail -25 "$TMP/torch.$r.out"; done
  fi
fi
echo "netns_two_hosts: $fails failed"
[ "$fails" = 0 ]
