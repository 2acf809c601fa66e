"""Hugging Face transformers' tensor parallelism and DeepSpeed's AutoTP inference on fastgather,
the README's recipes (tools/llm-bench/hf_generate.py follows them): the same greedy tokens as gloo."""
import json
import os
import subprocess
import sys

import pytest

from engines_common import TOOLS, free_port, tiny_model  # noqa: F401  (a fixture)

pytest.importorskip("transformers")


def generate(model, engine, backend):
    p = subprocess.run([sys.executable, str(TOOLS / "hf_generate.py"), model, "--engine", engine, "--backend", backend,
                        "--tp", "2", "--dtype", "float32"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    lines = {l.split(" ", 1)[0]: json.loads(l.split(" ", 1)[1]) for l in p.stdout.splitlines()
             if l.startswith(("TOKENS ", "ALLREDUCE "))}
    assert len(lines["TOKENS"]) == 4 and all(len(t) == 16 for t in lines["TOKENS"])
    return lines["TOKENS"], lines.get("ALLREDUCE")


def test_hf_tp2_on_fastgather_gives_gloos_tokens(tiny_model):
    fg, _ = generate(tiny_model, "hf", "fastgather")
    assert len({tuple(t) for t in fg}) > 1
    assert fg == generate(tiny_model, "hf", "gloo")[0]


def test_deepspeed_autotp_on_fastgather_gives_gloos_tokens(tiny_model):
    pytest.importorskip("deepspeed")
    fg, fg_calls = generate(tiny_model, "deepspeed", "fastgather")
    plain, plain_calls = generate(tiny_model, "deepspeed", "gloo")
    assert fg == plain
    # Every per-layer sum on fastgather's direct operator: none through torch.distributed or
    # DeepSpeed's own shared-memory op (which served them on gloo, fp32 on this CPU).
    assert fg_calls["calls"] > 0 and set(fg_calls) == {"calls"}, fg_calls
    assert plain_calls["calls"] == fg_calls["calls"] and len(plain_calls) == 2, plain_calls


def serve_rank(rank, world, port, q):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        import deepspeed
        import deepspeed.comm as ds_comm
        import torch
        import torch.distributed as dist

        import fastgather
        deepspeed.init_distributed(dist_backend="fastgather")
        fastgather.serve_deepspeed()
        fastgather.serve_deepspeed()  # twice: harmless
        gloo = dist.new_group(list(range(world)), backend="gloo")
        through = []
        plain_all_reduce = dist.all_reduce

        def counted(*a, **k):
            through.append(1)
            return plain_all_reduce(*a, **k)

        dist.all_reduce = counted
        if hasattr(torch.ops, "deepspeed"):
            torch.ops.deepspeed = None  # DeepSpeed's shared-memory op: any use fails
        xs = [torch.arange(24.0).reshape(4, 6) * (r + 1) + r for r in range(world)]
        for dtype in (torch.float32, torch.bfloat16):
            t = xs[rank].to(dtype, copy=True)
            ds_comm.inference_all_reduce(t)
            expected = sum(x.to(dtype).float() for x in xs).to(dtype)
            assert torch.equal(t, expected), (dtype, t, expected)
        assert not through, "a SUM on the fastgather world went through torch.distributed"
        # Another reduction, and another group's sum, go where they went before: torch.distributed.
        t = xs[rank].clone()
        ds_comm.inference_all_reduce(t, op=ds_comm.ReduceOp.MAX)
        assert torch.equal(t, xs[-1]) and len(through) == 1
        t = xs[rank].to(torch.bfloat16)
        ds_comm.inference_all_reduce(t, group=gloo)
        assert len(through) == 2
        q.put((rank, "ok"))
    except BaseException:  # noqa: BLE001  (reported to the parent)
        import traceback
        q.put((rank, traceback.format_exc()))


def test_serve_deepspeed_sums_fastgather_groups_on_the_direct_operator():
    pytest.importorskip("deepspeed")
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=serve_rank, args=(r, 2, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results == {0: "ok", 1: "ok"}, "\n".join(str(v) for v in results.values())
