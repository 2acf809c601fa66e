"""Rank bodies for the torch backend tests: each runs in its own process,
started by test_torch_backend.py as `python3 workers.py NAME RANK WORLD PORT [ARG...]`.
The world group is gloo (the reference); fastgather serves new_group.
Exit status 0 means every check held; otherwise the failure is on stderr."""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import fastgather

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool]


def pattern(rank, dtype, shape, salt=0):
    """Deterministic per-rank data: every rank can compute every other rank's."""
    g = torch.Generator().manual_seed(1000 * rank + salt)
    n = 1
    for d in shape:
        n *= d
    raw = torch.randint(0, 120, (n,), generator=g, dtype=torch.int64)
    if dtype == torch.bool:
        return (raw % 2 == 1).reshape(shape)
    return raw.to(dtype).reshape(shape)


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8) if a.dtype != torch.bool else a,
                                                                      b.contiguous().view(torch.uint8) if b.dtype != torch.bool else b)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def groups(world, tp, dp, backend):
    """The original layout: tp groups of dp ranks, group k = k, k+tp, ...; every rank creates every group."""
    mine = None
    for k in range(tp):
        ranks = list(range(k, world, tp))
        g = dist.new_group(ranks, backend=backend)
        if dist.get_rank() in ranks:
            mine = (g, ranks)
    return mine


def gloo_or_none(fn):
    """gloo's answer, or None where gloo cannot (it lacks some dtypes and ops)."""
    try:
        return fn()
    except RuntimeError:
        return None


def ops(rank, world, tp, dp):
    fg, ranks = groups(world, tp, dp, "fastgather")
    gl, _ = groups(world, tp, dp, "gloo")
    n = len(ranks)
    gloo_compared = set()
    for dtype in DTYPES:
        for shape in [(0,), (1,), (7,), (33, 5), (8, 3072)]:
            x = pattern(rank, dtype, shape)
            expected = [pattern(r, dtype, shape) for r in ranks]
            # list form, fresh outputs
            outs = [torch.empty(shape, dtype=dtype) for _ in range(n)]
            work = dist.all_gather(outs, x, group=fg, async_op=True)
            check(work.is_completed(), "async all_gather work should be complete")
            check(work.wait(), "wait() should return True")
            fut = work.get_future().wait()
            check(all(same_bytes(a, b) for a, b in zip(fut, outs)), "the future holds the outputs")
            for r, (o, e) in enumerate(zip(outs, expected)):
                check(same_bytes(o, e), f"all_gather {dtype} {shape}: block of group rank {r} differs")
            # gloo beside it, where it can (it divides by zero on empty tensors, and lacks some dtypes).
            ref = [torch.empty(shape, dtype=dtype) for _ in range(n)]
            if x.numel() > 0 and gloo_or_none(lambda: (dist.all_gather(ref, x, group=gl), True)[1]):
                check(all(same_bytes(a, b) for a, b in zip(outs, ref)), f"{dtype} {shape}: differs from gloo")
                gloo_compared.add(dtype)
            # tensor form
            flat = torch.empty((n * shape[0],) + tuple(shape[1:]), dtype=dtype)
            dist.all_gather_into_tensor(flat, x, group=fg)
            check(same_bytes(flat, torch.cat(expected)), f"all_gather_into_tensor {dtype} {shape}")
            # broadcast from the last member
            b = x.clone()
            dist.broadcast(b, src=ranks[-1], group=fg)
            check(same_bytes(b, expected[-1]), f"broadcast {dtype} {shape}")
    # Non-contiguous input and outputs.
    base = pattern(rank, torch.float32, (6, 10))
    x = base.t()  # (10, 6), not contiguous
    outs = [torch.empty((6, 10), dtype=torch.float32).t() for _ in range(n)]
    dist.all_gather(outs, x, group=fg)
    for r, o in zip(ranks, outs):
        check(same_bytes(o.contiguous(), pattern(r, torch.float32, (6, 10)).t().contiguous()), "non-contiguous list form")
    wide = torch.empty((n * 10, 12), dtype=torch.float32)[:, ::2]  # (n*10, 6), strided
    dist.all_gather_into_tensor(wide, x, group=fg)
    check(same_bytes(wide.contiguous(), torch.cat([pattern(r, torch.float32, (6, 10)).t() for r in ranks])),
          "non-contiguous tensor form")
    dist.barrier(group=fg)
    check(fastgather.transport(fg) == "shared memory", fastgather.transport(fg))
    check(torch.float32 in gloo_compared and torch.int64 in gloo_compared, f"gloo compared only {gloo_compared}")
    if rank == 0:
        print(f"compared with gloo byte for byte: {sorted(str(d) for d in gloo_compared)}", file=sys.stderr)


def errors(rank, world):
    fg = dist.new_group(list(range(world)), backend="fastgather", timeout=datetime.timedelta(seconds=20))
    # Mismatched shapes: every rank raises, naming the ranks and sizes.
    shape = (4, 8) if rank == 0 else (5, 8)
    x = torch.zeros(shape)
    outs = [torch.empty(shape) for _ in range(world)]
    try:
        dist.all_gather(outs, x, group=fg)
        raise AssertionError("mismatched shapes did not raise")
    except RuntimeError as e:
        msg = str(e)
        check("Mismatch" in msg and "128 bytes" in msg and "160 bytes" in msg, f"message should name both sizes: {msg}")
    # Mismatched dtypes.
    x = torch.zeros(4, dtype=torch.float32 if rank == 0 else torch.int32)
    try:
        dist.all_gather([torch.empty_like(x) for _ in range(world)], x, group=fg)
        raise AssertionError("mismatched dtypes did not raise")
    except RuntimeError as e:
        check("Mismatch" in str(e) and "fp32" in str(e) and "int32" in str(e), str(e))
    # The group is still usable.
    x = torch.full((3,), float(rank))
    outs = [torch.empty(3) for _ in range(world)]
    dist.all_gather(outs, x, group=fg)
    check([o[0].item() for o in outs] == [float(r) for r in range(world)], "group unusable after a mismatch")
    # Every other op names itself and the way out.
    for name, call in [("allreduce", lambda: dist.all_reduce(torch.zeros(2), group=fg)),
                       ("reduce_scatter", lambda: dist.reduce_scatter(torch.zeros(2), [torch.zeros(2)] * world, group=fg)),
                       ("send", lambda: dist.send(torch.zeros(2), dst=(rank + 1) % world, group=fg))]:
        try:
            call()
            raise AssertionError(f"{name} did not raise")
        except RuntimeError as e:
            check(name in str(e) and "gloo" in str(e) and "new_group" in str(e), f"{name}: {e}")
    # Wrong local arguments are refused before any communication, on the rank that passed them.
    try:
        dist.all_gather_into_tensor(torch.empty(world * 4 + 1), torch.zeros(4), group=fg)
        raise AssertionError("a wrong output size did not raise")
    except RuntimeError as e:
        check("all_gather_into_tensor" in str(e), str(e))
    dist.barrier(group=fg)


def dead_peer(rank, world):
    fg = dist.new_group(list(range(world)), backend="fastgather", timeout=datetime.timedelta(seconds=5))
    x = torch.zeros(16)
    dist.all_gather([torch.empty(16) for _ in range(world)], x, group=fg)
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)  # dies without a word
    t0 = time.monotonic()
    try:
        dist.all_gather([torch.empty(16) for _ in range(world)], x, group=fg)
        raise AssertionError("a dead peer did not raise")
    except RuntimeError as e:
        took = time.monotonic() - t0
        check(took < 5.0, f"raised after {took:.1f} s, beyond the 5 s timeout")
        check("PeerLost" in str(e) or "Timeout" in str(e), str(e))
        print(f"rank {rank}: dead peer raised after {took * 1000:.0f} ms: {e}", file=sys.stderr)
    os._exit(0)  # the gloo world has lost a member too: leave without its shutdown


TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def fused(rank, world, tp, dp):
    fg, ranks = groups(world, tp, dp, "fastgather")
    n_ranks = len(ranks)
    hcom = fastgather.get_comm_name(fg, rank)
    for dtype in [torch.float16, torch.bfloat16, torch.float32]:
        for m, k, n in [(1, 16, 4), (5, 64, 16), (64, 3072, 16)]:
            def make(r):
                g = torch.Generator().manual_seed(7 * r + m)
                return (torch.rand((m, k), generator=g, dtype=torch.float64) - 0.5).to(dtype)
            g = torch.Generator().manual_seed(99)
            x2 = (torch.rand((k, n), generator=g, dtype=torch.float64) - 0.5).to(dtype)
            bias = (torch.rand((n,), generator=g, dtype=torch.float64) - 0.5).to(dtype)
            x1 = make(rank)
            for b in [None, bias]:
                out, gathered = fastgather.all_gather_base_mm(x1, x2, hcom, n_ranks, bias=b)
                full = torch.cat([make(r) for r in ranks])
                check(same_bytes(gathered, full), f"gather_out {dtype} m={m} k={k}")
                ref = full.double() @ x2.double() + (b.double() if b is not None else 0)
                check(out.dtype == dtype and out.shape == (m * n_ranks, n), f"output {out.dtype} {tuple(out.shape)}")
                err = (out.double() - ref).abs().max().item()
                scale = max(ref.abs().max().item(), 1.0)
                check(err <= TOL[dtype] * scale * (k ** 0.5), f"{dtype} m={m} k={k}: max error {err} (scale {scale})")
            out2, empty = fastgather.all_gather_base_mm(x1, x2, fg, n_ranks, gather_output=False)
            check(empty.numel() == 0 and torch.equal(out2, fastgather.all_gather_base_mm(x1, x2, hcom, n_ranks)[0]),
                  "gather_output=False: empty gather_out, same output")
    x1 = torch.zeros(2, 8, dtype=torch.float16)
    for bad, args, kwargs in [("k", (x1, torch.zeros(9, 4, dtype=torch.float16), hcom, n_ranks), {}),
                              ("world_size", (x1, torch.zeros(8, 4, dtype=torch.float16), hcom, n_ranks + 1), {}),
                              ("gather_index", (x1, torch.zeros(8, 4, dtype=torch.float16), hcom, n_ranks), {"gather_index": 1}),
                              ("comm_turn", (x1, torch.zeros(8, 4, dtype=torch.float16), hcom, n_ranks), {"comm_turn": 1}),
                              ("int32", (x1.int(), torch.zeros(8, 4, dtype=torch.int32), hcom, n_ranks), {}),
                              ("bias", (x1, torch.zeros(8, 4, dtype=torch.float16), hcom, n_ranks), {"bias": torch.zeros(5, dtype=torch.float16)}),
                              ("no fastgather group", (x1, torch.zeros(8, 4, dtype=torch.float16), "nope", n_ranks), {})]:
        try:
            fastgather.all_gather_base_mm(*args, **kwargs)
            raise AssertionError(f"bad {bad} was accepted")
        except RuntimeError as e:
            check(bad.split()[0] in str(e) or "fastgather" in str(e), f"{bad}: {e}")
    dist.barrier(group=fg)


def symmetric(rank, world):
    """Inputs from fastgather.empty: read in place by the peers, every byte right, both forms,
    each input overwritten as soon as its call returns; bool and odd shapes; the heap's error."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    for dtype in [torch.float32, torch.float16, torch.int64, torch.bool]:
        for shape in [(1,), (33, 5), (8, 3072), (700, 1031)]:
            x = fastgather.empty(fg, shape, dtype)
            check(x.shape == shape and x.dtype == dtype, f"{x.shape} {x.dtype}")
            x.copy_(pattern(rank, dtype, shape))
            outs = [torch.empty(shape, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, x, group=fg)
            x.zero_()  # a peer still reading would see this
            check(all(same_bytes(o, pattern(r, dtype, shape)) for r, o in enumerate(outs)), f"list {dtype} {shape}")
            x.copy_(pattern(rank, dtype, shape, salt=1))
            flat = torch.empty((world * shape[0],) + tuple(shape[1:]), dtype=dtype)
            dist.all_gather_into_tensor(flat, x, group=fg)
            x.zero_()
            check(same_bytes(flat, torch.cat([pattern(r, dtype, shape, salt=1) for r in range(world)])),
                  f"tensor {dtype} {shape}")
    try:
        fastgather.empty(fg, (1 << 40,), torch.uint8)
        check(False, "a 1 TiB tensor from the heap did not raise")
    except RuntimeError as e:
        check("FG_SYMMETRIC_BYTES" in str(e), str(e))
    dist.barrier(group=fg)


def import_twice(rank, world):
    import importlib
    importlib.reload(fastgather)
    fg = dist.new_group(list(range(world)), backend="fastgather")
    dist.barrier(group=fg)


def world_backend(rank, world):
    """fastgather as the world's backend (init_process_group("fastgather")), with TP groups inside."""
    check(dist.get_backend() == "fastgather", dist.get_backend())
    x = pattern(rank, torch.float32, (5, 7))
    outs = [torch.empty(5, 7) for _ in range(world)]
    dist.all_gather(outs, x)
    check(all(same_bytes(o, pattern(r, torch.float32, (5, 7))) for r, o in enumerate(outs)), "world all_gather")
    flat = torch.empty(world * 5, 7)
    dist.all_gather_into_tensor(flat, x)
    check(same_bytes(flat, torch.cat([pattern(r, torch.float32, (5, 7)) for r in range(world)])), "world tensor form")
    if world % 2 == 0:
        g, ranks = groups(world, 2, world // 2, "fastgather")
        outs = [torch.empty(5, 7) for _ in ranks]
        dist.all_gather(outs, x, group=g)
        check(all(same_bytes(o, pattern(r, torch.float32, (5, 7))) for r, o in zip(ranks, outs)), "TP group")
    dist.barrier()


def across_hosts(rank, world):
    """Ranks on different hosts (network namespaces): UCX between them, every byte right."""
    fg = dist.new_group(list(range(world)), backend="fastgather", timeout=datetime.timedelta(seconds=30))
    check("UCX" in fastgather.transport(fg), fastgather.transport(fg))
    for dtype in [torch.float32, torch.bfloat16, torch.int64, torch.bool]:
        for shape in [(7,), (8, 3072), (512, 3072)]:
            x = pattern(rank, dtype, shape)
            outs = [torch.empty(shape, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, x, group=fg)
            check(all(same_bytes(o, pattern(r, dtype, shape)) for r, o in enumerate(outs)), f"{dtype} {shape}")
            flat = torch.empty((world * shape[0],) + tuple(shape[1:]), dtype=dtype)
            dist.all_gather_into_tensor(flat, x, group=fg)
            check(same_bytes(flat, torch.cat([pattern(r, dtype, shape) for r in range(world)])), f"tensor {dtype} {shape}")
    x1 = pattern(rank, torch.float16, (16, 64))
    x2 = torch.ones(64, 8, dtype=torch.float16)
    out, gathered = fastgather.all_gather_base_mm(x1, x2, fg, world)
    full = torch.cat([pattern(r, torch.float16, (16, 64)) for r in range(world)])
    check(same_bytes(gathered, full), "fused gather_out")
    check(torch.equal(out.double(), (full.double() @ x2.double()).half().double()), "fused output")
    print(f"rank {rank}: {fastgather.transport(fg)}", file=sys.stderr)


def main():
    name, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    args = [int(a) for a in sys.argv[5:]]
    backend = "fastgather" if name == "world_backend" else "gloo"
    master = os.environ.get("FG_TEST_MASTER", "127.0.0.1")  # another host's address in the netns test
    dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    globals()[name](rank, world, *args)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
