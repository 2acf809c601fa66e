"""The original script on CPU (examples/all_gather_matmul_multinode.py):
launched as the original, both backends side by side, its tables and verdicts."""
import os
import re
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "all_gather_matmul_multinode.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(env):
    full = dict(os.environ, MASTER_IP="127.0.0.1", PORT=str(free_port()), SERVER_NUM="1", SERVER_INDEX="0", **env)
    p = subprocess.run([sys.executable, EXAMPLE, "--quick"], env=full, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def test_both_backends_side_by_side_with_tables_and_verdicts():
    out = run({"TP": "1", "DP": "2"})
    for b in ["gloo", "fastgather"]:
        assert f"### AllGather [{b}] (fp32, hidden 3072, TP=1 DP=2)" in out, out
        assert f"### AllGather+MatMul [{b}] (fp16, hidden 3072, n=16)" in out, out
        verdicts = re.findall(rf"- \[{b}\] +[\d.]+ [KMG]?B per rank: all_gather [\d.]+ ms vs all_gather_matmul [\d.]+ ms -> (yes|no)", out)
        assert len(verdicts) == 4, out
    assert "| m | per-rank data | avg latency (ms) | effective bandwidth GB/s |" in out
    assert "### fastgather vs gloo, same sizes" in out
    assert out.count("ready (TP=1 DP=2") == 2, out


def test_tp_groups_of_dp_one_backend():
    out = run({"TP": "2", "DP": "2", "BACKEND": "fastgather"})
    assert "### AllGather [fastgather] (fp32, hidden 3072, TP=2 DP=2)" in out, out
    assert "[gloo]" not in out
    assert out.count("ready (TP=2 DP=2") == 4, out


def test_bad_backend_is_refused():
    full = dict(os.environ, BACKEND="nccl", PORT=str(free_port()))
    p = subprocess.run([sys.executable, EXAMPLE], env=full, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "BACKEND='nccl'" in p.stderr, p.stderr
