"""A script written for torch_npu and HCCL runs unedited on fastgather
(python -m fastgather.npu_script), its ranks started with torch's mp.spawn."""
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("tp,dp", [(1, 2), (2, 2)])
def test_original_script_runs_unedited(tp, dp):
    env = dict(os.environ, TP=str(tp), DP=str(dp), SERVER_NUM="1", SERVER_INDEX="0", MASTER_IP="127.0.0.1",
               PORT=str(free_port()))
    p = subprocess.run([sys.executable, "-m", "fastgather.npu_script", os.path.join(HERE, "npu_original.py")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for r in range(tp * dp):
        for m in [8, 32]:
            assert f"rank {r}: m={m} all_gather and npu_all_gather_base_mm ok on cpu" in p.stdout, p.stdout


def test_without_the_shim_the_script_cannot_run():
    """The script really needs what the shim gives (no torch_npu here)."""
    p = subprocess.run([sys.executable, os.path.join(HERE, "npu_original.py")], env=dict(os.environ, PORT="1"),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "torch_npu" in p.stderr, p.stderr[-2000:]


def test_a_missing_script_is_named():
    p = subprocess.run([sys.executable, "-m", "fastgather.npu_script", "/nonexistent.py"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "no such script" in p.stderr, p.stderr
