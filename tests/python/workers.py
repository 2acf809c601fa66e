"""Rank bodies for the torch backend tests: each runs in its own process,
started by test_torch_backend.py as `python workers.py NAME RANK WORLD PORT [ARG...]`.
The world group is gloo (the reference); fastgather serves new_group.
Exit status 0 means every check held; otherwise the failure is on stderr."""
import datetime
import os
import signal
import sys
import time
import warnings

import torch
import torch.distributed as dist

import fastgather

# torch 2.13 calls all_gather_into_tensor and reduce_scatter_tensor deprecated (for the *_single
# names); they are what users call.
warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*is deprecated")
warnings.filterwarnings("ignore", message=".*reduce_scatter_tensor.*is deprecated")

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
            check(work.wait(), "wait() should return True")
            check(work.is_completed() and work.is_success() and work.exception() is None, "done after wait()")
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


SUM_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.complex64]


def summed(tensors, dtype):
    """The sum the backend gives: in group-rank order, half and bfloat16 in float32 rounded once."""
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = tensors[0].to(wide).clone()
    for t in tensors[1:]:
        acc += t.to(wide)
    return acc.to(dtype)


def sums(rank, world, tp, dp):
    fg, ranks = groups(world, tp, dp, "fastgather")
    gl, _ = groups(world, tp, dp, "gloo")
    n = len(ranks)
    me = ranks.index(rank)
    for dtype in SUM_DTYPES:
        for shape in [(0,), (1,), (7,), (33, 5), (8, 3072), (300, 1001)]:
            def data(r, salt):
                if dtype.is_complex:
                    return torch.complex(pattern(r, torch.float32, shape, salt), pattern(r, torch.float32, shape, salt + 1))
                return pattern(r, dtype, shape, salt)
            x = data(rank, 1)
            want = summed([data(r, 1) for r in ranks], dtype)
            y = x.clone()
            work = dist.all_reduce(y, group=fg, async_op=True)
            check(work.wait(), "wait() should return True")
            check(same_bytes(y, want), f"all_reduce {dtype} {shape}")
            if dtype in (torch.int32, torch.int64) and x.numel() > 0:
                ref = x.clone()
                dist.all_reduce(ref, group=gl)
                check(same_bytes(y, ref), f"all_reduce {dtype} {shape}: differs from gloo")
            # reduce_scatter_tensor: chunk `me` of everyone's input.
            big = (n * shape[0],) + tuple(shape[1:])
            inputs = {r: torch.cat([data(r, 10 + j) for j in range(n)]) for r in ranks}
            out = torch.empty(shape, dtype=dtype)
            dist.reduce_scatter_tensor(out, inputs[rank], group=fg)
            check(same_bytes(out, summed([data(r, 10 + me) for r in ranks], dtype)), f"reduce_scatter_tensor {dtype} {shape}")
            check(inputs[rank].shape == big, "shape")
            # The list form.
            out2 = torch.empty(shape, dtype=dtype)
            dist.reduce_scatter(out2, [data(rank, 10 + j) for j in range(n)], group=fg)
            check(same_bytes(out2, out), f"reduce_scatter (list) {dtype} {shape}")
    # Random values: within rounding of the float64 sum, and the same bits on every rank.
    g = torch.Generator().manual_seed(7 + rank)
    x = torch.randn(100003, generator=g)
    ref = sum(torch.randn(100003, generator=torch.Generator().manual_seed(7 + r)).double() for r in ranks)
    y = x.clone()
    dist.all_reduce(y, group=fg)
    check(torch.allclose(y.double(), ref, rtol=0, atol=1e-5), f"all_reduce off the float64 sum by {(y.double() - ref).abs().max()}")
    everyone = [torch.empty_like(y) for _ in range(n)]
    dist.all_gather(everyone, y, group=fg)
    check(all(same_bytes(e, y) for e in everyone), "all_reduce gave different bits on different ranks")
    # Non-contiguous, in place.
    base = pattern(rank, torch.float32, (6, 10)).t()
    dist.all_reduce(base, group=fg)
    check(same_bytes(base.contiguous(), summed([pattern(r, torch.float32, (6, 10)).t() for r in ranks], torch.float32).contiguous()),
          "non-contiguous all_reduce")
    # What it does not serve says so, and the group goes on.
    raises("all_reduce AVG of int32", NotImplementedError,
           lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG, group=fg))
    raises("all_reduce BAND of float", NotImplementedError,
           lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND, group=fg))
    raises("reduce_scatter_tensor of the wrong size", ValueError,
           lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.empty(3 * n + 1), group=fg))
    z = torch.full((5,), float(rank + 1))
    dist.all_reduce(z, group=fg)
    check(z[0].item() == sum(r + 1 for r in ranks), f"after the refusals: {z}")


def same_as_gloo(world, train):
    """train(group) on a fastgather group and on a gloo group of every rank: the same tensors, bit
    for bit with 2 ranks (a sum of two has one order), else within rounding."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    gl = dist.new_group(list(range(world)), backend="gloo")
    ours, theirs = train(fg), train(gl)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        check(torch.equal(a, b) if world == 2 else torch.allclose(a, b, rtol=1e-5, atol=1e-6),
              f"tensor {i}: fastgather and gloo differ by {(a - b).abs().max().item()}")


REDUCTIONS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def reference(name, xs, n):
    """The reduction of xs (one tensor per rank, in rank order) as fastgather makes it: folded in
    rank order, fp16/bf16 in fp32 rounded once, integers wrapping, bool or/and, AVG the sum / n."""
    dtype = xs[0].dtype
    if dtype == torch.bool:
        name = {"SUM": "BOR", "MAX": "BOR", "PRODUCT": "BAND", "MIN": "BAND"}.get(name, name)
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = xs[0].to(wide)
    for x in xs[1:]:
        x = x.to(wide)
        acc = {"SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum,
               "MAX": torch.maximum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
               "BXOR": torch.bitwise_xor}[name](acc, x)
    if name == "AVG":
        acc = acc / n
    return acc.to(dtype)


def reductions(rank, world):
    """Every reduction torch names, for every dtype fastgather serves it for,
    all_reduce and reduce_scatter_tensor: the bits of the reference on every rank, and gloo's
    answer where gloo gives one (exact but for float sums and products, whose order gloo picks)."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    gl = dist.new_group(list(range(world)), backend="gloo")
    served = {"SUM": DTYPES, "PRODUCT": DTYPES, "MIN": DTYPES, "MAX": DTYPES,
              "AVG": [torch.float32, torch.float16, torch.bfloat16, torch.float64],
              "BAND": [d for d in DTYPES if not d.is_floating_point]}
    served["BOR"] = served["BXOR"] = served["BAND"]
    compared = 0
    for name in REDUCTIONS:
        op = getattr(dist.ReduceOp, name)
        for dtype in served[name]:
            for count in (7, 40001):
                xs = [pattern(r, dtype, (count,), salt=count) for r in range(world)]
                want = reference(name, xs, world)
                y = xs[rank].clone()
                dist.all_reduce(y, op=op, group=fg)
                check(same_bytes(y, want), f"all_reduce {name} {dtype} {count}: {y[:4]} want {want[:4]}")
                theirs = gloo_or_none(lambda: (lambda t: (dist.all_reduce(t, op=op, group=gl), t)[1])(xs[rank].clone()))
                if theirs is not None:
                    compared += 1
                    exact = not dtype.is_floating_point or name in ("MIN", "MAX")
                    if dtype == torch.bool:
                        check(torch.equal(theirs.view(torch.uint8) != 0, y), f"gloo's {name} of bool differs")
                    elif exact:
                        check(same_bytes(theirs, y), f"gloo's all_reduce {name} {dtype} differs")
                    else:
                        # gloo rounds fp16/bf16 at every step: near the largest fp16 one of
                        # the two may overflow where the other does not.
                        a, b = theirs.double(), y.double()
                        both = a.isfinite() & b.isfinite()
                        check(torch.allclose(a[both], b[both], rtol=1e-2, atol=1e-3),
                              f"gloo's all_reduce {name} {dtype} is off by {(a[both] - b[both]).abs().max()}")
                # reduce_scatter_tensor: rank r gets chunk r.
                big = [pattern(r, dtype, (count * world,), salt=count + 1) for r in range(world)]
                out = torch.empty(count, dtype=dtype)
                dist.reduce_scatter_tensor(out, big[rank], op=op, group=fg)
                chunk = [b[rank * count:(rank + 1) * count] for b in big]
                check(same_bytes(out, reference(name, chunk, world)), f"reduce_scatter_tensor {name} {dtype} {count}")
    check(compared > 0, "gloo answered none of the reductions")
    # PREMUL_SUM (gloo has none): every input times the factor in its dtype, then the sum; a
    # scalar factor and a tensor one; all_reduce, reduce_scatter_tensor and reduce.
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for factor in (2.5, torch.tensor([0.375], dtype=dtype)):
            op = dist._make_nccl_premul_sum(factor)
            xs = [pattern(r, dtype, (1001,), salt=9) for r in range(world)]
            want = reference("SUM", [x * factor for x in xs], world)
            y = xs[rank].clone()
            dist.all_reduce(y, op=op, group=fg)
            check(same_bytes(y, want), f"all_reduce PREMUL_SUM {dtype} by {factor}")
            y = xs[rank].clone()
            dist.reduce(y, dst=world - 1, op=op, group=fg)
            check(same_bytes(y, want if rank == world - 1 else xs[rank]), f"reduce PREMUL_SUM {dtype} by {factor}")
            big = [pattern(r, dtype, (7 * world,), salt=10) for r in range(world)]
            out = torch.empty(7, dtype=dtype)
            dist.reduce_scatter_tensor(out, big[rank], op=op, group=fg)
            check(same_bytes(out, reference("SUM", [b[rank * 7:(rank + 1) * 7] * factor for b in big], world)),
                  f"reduce_scatter_tensor PREMUL_SUM {dtype} by {factor}")
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0), group=fg)
        raise AssertionError("PREMUL_SUM of int32 did not raise")
    except NotImplementedError as e:
        check("PREMUL_SUM of Int" in str(e), str(e))
    dist.barrier(group=fg)


def exchanges(rank, world):
    """gather, scatter, all_to_all_single (equal and uneven splits, a non-contiguous output),
    all_to_all of lists, reduce, gather_object and scatter_object_list, and DTensor's default
    distribute_tensor (a scatter), every dtype, every root: the bytes every rank can compute, and
    gloo's where gloo serves the dtype."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    gl = dist.new_group(list(range(world)), backend="gloo")

    def both(fn):
        """fn(group) on fastgather, and on gloo where gloo serves it."""
        return fn(fg), gloo_or_none(lambda: fn(gl))

    for dtype in DTYPES + [torch.complex64]:
        for count in (0, 5, 40001):
            for root in range(world):
                salt = count * 10 + root
                xs = [pattern(r, dtype, (count,), salt=salt) for r in range(world)]

                def gathered(group):
                    outs = [torch.full((count,), 7, dtype=dtype) for _ in range(world)] if rank == root else None
                    dist.gather(xs[rank], outs, dst=root, group=group)
                    return outs
                ours, theirs = both(gathered)
                for r in range(world if rank == root else 0):
                    check(same_bytes(ours[r], xs[r]), f"gather {dtype} {count} root {root}: rank {r}'s tensor")
                    check(theirs is None or same_bytes(theirs[r], ours[r]), f"gloo's gather {dtype} differs")

                def scattered(group):
                    out = torch.full((count,), 7, dtype=dtype)
                    dist.scatter(out, [pattern(j, dtype, (count,), salt=salt + 1) for j in range(world)]
                                 if rank == root else None, src=root, group=group)
                    return out
                ours, theirs = both(scattered)
                check(same_bytes(ours, pattern(rank, dtype, (count,), salt=salt + 1)), f"scatter {dtype} {count} root {root}")
                check(theirs is None or same_bytes(theirs, ours), f"gloo's scatter {dtype} differs")
            # all_to_all_single, equal splits: part j of every input to rank j.
            parts = [[pattern(r * world + j, dtype, (count, 2), salt=count) for j in range(world)] for r in range(world)]

            def single(group):
                out = torch.empty(world * count, 2, dtype=dtype)
                dist.all_to_all_single(out, torch.cat(parts[rank]), group=group)
                return out
            ours, theirs = both(single)
            check(same_bytes(ours, torch.cat([parts[m][rank] for m in range(world)])), f"all_to_all_single {dtype} {count}")
            check(theirs is None or same_bytes(theirs, ours), f"gloo's all_to_all_single {dtype} differs")
            # Uneven splits (zeros among them) into a non-contiguous output.
            rows = [[(r * 3 + j * 5 + count) % 7 for j in range(world)] for r in range(world)]
            send = [pattern(r * world + j, dtype, (rows[r][j], 3), salt=count + 2) for r in range(world) for j in range(world)]

            def uneven(group, strided=False):
                mine = torch.cat(send[rank * world:(rank + 1) * world])
                received = sum(rows[m][rank] for m in range(world))
                out = torch.empty(3, received, dtype=dtype).t() if strided else torch.empty(received, 3, dtype=dtype)
                dist.all_to_all_single(out, mine, output_split_sizes=[rows[m][rank] for m in range(world)],
                                       input_split_sizes=rows[rank], group=group)
                return out
            ours, theirs = both(uneven)
            want = torch.cat([send[m * world + rank] for m in range(world)])
            check(same_bytes(ours, want), f"uneven all_to_all_single {dtype} {count}")
            check(theirs is None or same_bytes(theirs, ours), f"gloo's uneven all_to_all_single {dtype} differs")
            # (gloo writes a strided output as if it were contiguous: not compared.)
            strided = uneven(fg, strided=True)
            check(not strided.is_contiguous() and same_bytes(strided.contiguous(), want),
                  f"uneven all_to_all_single {dtype} {count} into a strided output")

            # all_to_all of lists of different sizes.
            def lists(group):
                outs = [torch.empty(rows[m][rank], 3, dtype=dtype) for m in range(world)]
                dist.all_to_all(outs, send[rank * world:(rank + 1) * world], group=group)
                return outs
            ours, theirs = both(lists)
            for m in range(world):
                check(same_bytes(ours[m], send[m * world + rank]), f"all_to_all {dtype} {count}: from rank {m}")
                check(theirs is None or same_bytes(theirs[m], ours[m]), f"gloo's all_to_all {dtype} differs")
    # reduce: the root's tensor is the reference's reduction.
    for name in ("SUM", "MAX"):
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            for root in range(world):
                xs = [pattern(r, dtype, (1001,), salt=root) for r in range(world)]
                y = xs[rank].clone()
                dist.reduce(y, dst=root, op=getattr(dist.ReduceOp, name), group=fg)
                if rank == root:
                    check(same_bytes(y, reference(name, xs, world)), f"reduce {name} {dtype} to root {root}")
                else:
                    check(same_bytes(y, xs[rank]), f"reduce {name} {dtype}: a rank other than the root changed")
    # The object helpers built on them.
    objs = [None] * world if rank == 0 else None
    dist.gather_object({"rank": rank, "data": list(range(rank + 2))}, objs, dst=0, group=fg)
    if rank == 0:
        check(objs == [{"rank": r, "data": list(range(r + 2))} for r in range(world)], f"gather_object: {objs}")
    got = [None]
    dist.scatter_object_list(got, [("to", r, "x" * (r * 100)) for r in range(world)] if rank == 0 else None, src=0,
                             group=fg)
    check(got[0] == ("to", rank, "x" * (rank * 100)), f"scatter_object_list: {got}")
    # Sequence numbers, as gloo keeps them: one per collective, the same on every rank (asked
    # of the backend: torch's ProcessGroup answers them only for its own backends).
    backend = fg._get_backend(torch.device("cpu"))
    backend._set_sequence_number_for_group()
    before = backend._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(3), group=fg)
    dist.barrier(group=fg)
    seqs = [None] * world
    dist.all_gather_object(seqs, backend._get_sequence_number_for_group(), group=gl)
    check(seqs == [before + 2] * world, f"sequence numbers {seqs}, from {before}")
    # DTensor's default distribute_tensor scatters from rank 0.
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor
    full = torch.arange(world * 6, dtype=torch.float32).reshape(world * 2, 3) if rank == 0 else torch.zeros(world * 2, 3)
    d = distribute_tensor(full, DeviceMesh.from_group(fg, "cpu"), [Shard(0)])
    check(torch.equal(d.to_local(), torch.arange(world * 6, dtype=torch.float32).reshape(world * 2, 3)[rank * 2:rank * 2 + 2]),
          f"distribute_tensor: {d.to_local()}")


def tp_and_checkpoint(rank, world):
    """DTensor tensor parallelism with its defaults (parallelize_module, whose distribute_tensor
    scatters every shard from rank 0) for a forward and a backward, then
    torch.distributed.checkpoint save, a perturbation and a load, on a mesh of a fastgather group
    and of a gloo group: the same outputs, gradients and loaded parameters."""
    import shutil
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    where = f"/tmp/fg-dcp-{os.getppid()}"  # the same on every rank: they share the test's process

    def train(group):
        mesh = DeviceMesh.from_group(group, "cpu")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
        y = model(x)
        y.sum().backward()
        grads = [p.grad.full_tensor() for p in model.parameters()]
        path = os.path.join(where, dist.get_backend(group))
        dcp.save(model.state_dict(), checkpoint_id=path, process_group=group)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        state = model.state_dict()
        dcp.load(state, checkpoint_id=path, process_group=group)
        model.load_state_dict(state)
        return [y] + grads + [p.full_tensor() for p in model.parameters()]

    try:
        same_as_gloo(world, train)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(where, ignore_errors=True)


def fsdp2(rank, world):
    """FSDP2 with its defaults (reduce_scatter_tensor with AVG, all_gather_into_tensor) and
    clip_grad_norm_(inf) (an all_reduce MAX of DTensors) for 3 steps, on a mesh of a fastgather
    group and of a gloo group: the same parameters (bit for bit with 2 ranks, whose sums have one
    order; else within rounding)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def train(group):
        mesh = DeviceMesh.from_group(group, "cpu")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        norms = []
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 32, generator=g)).square().mean().backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type=float("inf")).full_tensor())
            opt.step()
        return [p.full_tensor() for p in model.parameters()] + norms

    same_as_gloo(world, train)


def uneven(rank, world):
    """all_gather with tensors of different sizes per rank (some empty), every dtype, and a mismatch."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    for dtype in DTYPES:
        for scale in (0, 1, 1000, 100000):
            shapes = [((r * 7 + 3) * scale % 50001, 2) for r in range(world)]
            x = pattern(rank, dtype, shapes[rank], salt=scale)
            outs = [torch.empty(s, dtype=dtype) for s in shapes]
            dist.all_gather(outs, x, group=fg)
            for r, o in enumerate(outs):
                check(same_bytes(o, pattern(r, dtype, shapes[r], salt=scale)), f"uneven all_gather {dtype} {shapes}: rank {r}")
    # Members that disagree on the sizes: every one raises, and the group goes on.
    sizes = [(4,), (4,)] + [(4,)] * (world - 2) if rank == 0 else [(4,), (6,)] + [(4,)] * (world - 2)
    x = torch.zeros(sizes[rank])
    raises("sizes that differ between members", ValueError,
           lambda: dist.all_gather([torch.empty(s) for s in sizes], x, group=fg))
    outs = [torch.empty(2) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), float(rank)), group=fg)
    check([o[0].item() for o in outs] == [float(r) for r in range(world)], "after the mismatch")


def errors(rank, world):
    fg = dist.new_group(list(range(world)), backend="fastgather", timeout=datetime.timedelta(seconds=20))
    # Mismatched shapes: every rank raises, naming the ranks and sizes.
    shape = (4, 8) if rank == 0 else (5, 8)
    x = torch.zeros(shape)
    outs = [torch.empty(shape) for _ in range(world)]
    try:
        dist.all_gather(outs, x, group=fg)
        raise AssertionError("mismatched shapes did not raise")
    except ValueError as e:
        msg = str(e)
        check("Mismatch" in msg and "128 bytes" in msg and "160 bytes" in msg, f"message should name both sizes: {msg}")
    # Mismatched dtypes.
    x = torch.zeros(4, dtype=torch.float32 if rank == 0 else torch.int32)
    try:
        dist.all_gather([torch.empty_like(x) for _ in range(world)], x, group=fg)
        raise AssertionError("mismatched dtypes did not raise")
    except ValueError as e:
        check("Mismatch" in str(e) and "fp32" in str(e) and "int32" in str(e), str(e))
    # The group is still usable.
    x = torch.full((3,), float(rank))
    outs = [torch.empty(3) for _ in range(world)]
    dist.all_gather(outs, x, group=fg)
    check([o[0].item() for o in outs] == [float(r) for r in range(world)], "group unusable after a mismatch")
    # What it does not serve is named, on the rank that asked: a sparse tensor with another
    # reduction than SUM (gloo sums sparse tensors only).
    msg = raises("a sparse all_reduce with MAX", NotImplementedError,
                 lambda: dist.all_reduce(torch.zeros(4, 2).to_sparse(), op=dist.ReduceOp.MAX, group=fg))
    check("sparse" in msg and "SUM" in msg, f"sparse MAX: {msg}")
    # Wrong local arguments are refused before any communication, on the rank that passed them.
    try:
        dist.all_gather_into_tensor(torch.empty(world * 4 + 1), torch.zeros(4), group=fg)
        raise AssertionError("a wrong output size did not raise")
    except ValueError as e:
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
    except dist.DistBackendError as e:
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
        except (ValueError, TypeError) as e:
            check(bad.split()[0] in str(e) or "fastgather" in str(e), f"{bad}: {e}")
    dist.barrier(group=fg)


def fused_rs(rank, world, tp, dp):
    """fastgather.mm_reduce_scatter_base against a float64 reference, eager and under torch.compile."""
    fg, ranks = groups(world, tp, dp, "fastgather")
    n_ranks = len(ranks)
    me = ranks.index(rank)
    hcom = fastgather.get_comm_name(fg, rank)
    for dtype in [torch.float16, torch.bfloat16, torch.float32]:
        for rows, k, n in [(1, 16, 4), (5, 64, 16), (64, 3072, 16), (8, 100, 1000)]:
            m = rows * n_ranks

            def make(r, shape, salt):
                g = torch.Generator().manual_seed(7 * r + 13 * salt + m)
                return (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5).to(dtype)
            bias = make(99, (n,), 3)
            for b in [None, bias]:
                out = fastgather.mm_reduce_scatter_base(make(rank, (m, k), 1), make(rank, (k, n), 2), hcom, n_ranks, bias=b)
                ref = sum(make(r, (m, k), 1).double() @ make(r, (k, n), 2).double() for r in ranks)[me * rows:(me + 1) * rows]
                if b is not None:
                    ref = ref + b.double()
                check(out.dtype == dtype and out.shape == (rows, n), f"output {out.dtype} {tuple(out.shape)}")
                err = (out.double() - ref).abs().max().item() if out.numel() else 0.0
                scale = max(ref.abs().max().item() if ref.numel() else 0.0, 1.0)
                check(err <= TOL[dtype] * scale * (k ** 0.5) * n_ranks, f"{dtype} m={m} k={k} n={n}: max error {err}")
    x1 = torch.zeros(2 * n_ranks, 8)
    for bad, args, kwargs in [("k", (x1, torch.zeros(9, 4), hcom, n_ranks), {}),
                              ("world_size", (x1, torch.zeros(8, 4), hcom, n_ranks + 1), {}),
                              ("rows", (torch.zeros(2 * n_ranks + 1, 8), torch.zeros(8, 4), hcom, n_ranks), {}),
                              ("reduce_op", (x1, torch.zeros(8, 4), hcom, n_ranks), {"reduce_op": "max"}),
                              ("int32", (x1.int(), torch.zeros(8, 4, dtype=torch.int32), hcom, n_ranks), {}),
                              ("None", (None, torch.zeros(8, 4), hcom, n_ranks), {})]:
        try:
            fastgather.mm_reduce_scatter_base(*args, **kwargs)
            raise AssertionError(f"bad {bad} was accepted")
        except (ValueError, TypeError) as e:
            check("fastgather" in str(e), f"{bad}: {e}")

    def layer(x1, x2):
        return torch.relu(fastgather.mm_reduce_scatter_base(x1, x2, hcom, n_ranks)) * 2

    fast = torch.compile(layer, fullgraph=True)
    x1 = (pattern(rank, torch.float32, (4 * n_ranks, 64)) - 60) / 64
    x2 = (pattern(rank, torch.float32, (64, 16), salt=5) - 60) / 64
    got = fast(x1, x2)
    check(torch.equal(got, layer(x1, x2)), "compiled vs eager")
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


def settings_in_code(rank, world):
    """fastgather.set_settings: the groups created after it follow it (a heap of 0 bytes, a 64 KiB
    ring: every byte right across many ring steps), earlier ones keep theirs; bad names, types and
    values raise; set_settings() goes back to the environment."""
    before = dist.new_group(list(range(world)), backend="fastgather")
    fastgather.set_settings(ring_bytes=65536, symmetric_bytes=0, copy_in="streaming", report_ms=0)
    check("FG_RING_BYTES=65536" in fastgather.settings(), fastgather.settings())
    fg = dist.new_group(list(range(world)), backend="fastgather")
    mine = fastgather.settings(fg)
    check("FG_RING_BYTES=65536" in mine and "FG_SYMMETRIC_BYTES=0" in mine and "FG_COPY_IN=streaming" in mine, mine)
    check("FG_RING_BYTES=4194304" in fastgather.settings(before), fastgather.settings(before))
    shape = (300, 1031)  # 1.2 MB per rank: many steps of a 64 KiB ring
    x = pattern(rank, torch.float32, shape)
    flat = torch.empty((world * shape[0], shape[1]))
    dist.all_gather_into_tensor(flat, x, group=fg)
    check(same_bytes(flat, torch.cat([pattern(r, torch.float32, shape) for r in range(world)])), "bytes")
    raises("unknown name", TypeError, lambda: fastgather.set_settings(ring_byte=65536))
    raises("a str for a size", TypeError, lambda: fastgather.set_settings(ring_bytes="64k"))
    raises("None for a size", TypeError, lambda: fastgather.set_settings(ring_bytes=None))
    msg = raises("out of range", ValueError, lambda: fastgather.set_settings(ring_bytes=100))
    check("FG_RING_BYTES=100" in msg, msg)
    raises("an unknown word", ValueError, lambda: fastgather.set_settings(copy_in="fast"))
    raises("negative", ValueError, lambda: fastgather.set_settings(net_piece_bytes=-1))
    check("FG_RING_BYTES=65536" in fastgather.settings(), "a refused call changed the settings")
    fastgather.set_settings()
    check("FG_RING_BYTES=4194304" in fastgather.settings(), fastgather.settings())
    dist.barrier(group=fg)


def import_twice(rank, world):
    import importlib
    importlib.reload(fastgather)
    fg = dist.new_group(list(range(world)), backend="fastgather")
    dist.barrier(group=fg)


def world_backend(rank, world):
    """fastgather as the world's backend (init_process_group("fastgather")), with TP groups inside."""
    check(dist.get_backend() in ("fastgather", "cpu:fastgather"), dist.get_backend())
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


def any_source_from_everyone(rank, world, group, numel, tag, salt):
    """Rank 0 receives from any source (src=None) one message of numel fp32 from every other rank:
    each said to come from its sender, its bytes that sender's, every sender once."""
    if rank == 0:
        seen = set()
        for _ in range(world - 1):
            t = torch.full((numel,), -1.0)  # never a pattern's value (0..119)
            src = dist.recv(t, group=group, tag=tag)
            check(same_bytes(t, pattern(src, torch.float32, (numel,), salt=salt)),
                  f"any source: the message said to be from {src}")
            seen.add(src)
        check(seen == set(range(1, world)), f"any source: sources {sorted(seen)}")
    else:
        dist.send(pattern(rank, torch.float32, (numel,), salt=salt), dst=0, group=group, tag=tag)


def across_hosts(rank, world):
    """Ranks on different hosts (network namespaces): UCX between them, every byte right, for every
    op the backend serves across hosts (a receive from any source among them)."""
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
    # The sums (hierarchical where each host holds as many members: reduced within the host, exchanged
    # between hosts, spread within): the integer patterns sum exactly, so every bit is known.
    for dtype in [torch.float32, torch.bfloat16, torch.float16, torch.int64]:
        for rows, cols in [(1, 7), (8, 3072), (300, 1001)]:
            shape = (world * rows, cols)
            x = pattern(rank, dtype, shape, salt=1)
            want = summed([pattern(r, dtype, shape, salt=1) for r in range(world)], dtype)
            y = x.clone()
            dist.all_reduce(y, group=fg)
            check(same_bytes(y, want), f"all_reduce {dtype} {shape}")
            part = torch.empty((rows, cols), dtype=dtype)
            dist.reduce_scatter_tensor(part, x, group=fg)
            check(same_bytes(part, want[rank * rows:(rank + 1) * rows]), f"reduce_scatter_tensor {dtype} {shape}")
    # Tensors of a different size on every rank, one of them empty.
    for dtype in [torch.float32, torch.int8]:
        shapes = [((r * 7919) % 5003, 3) for r in range(world)]
        outs = [torch.empty(s, dtype=dtype) for s in shapes]
        dist.all_gather(outs, pattern(rank, dtype, shapes[rank], salt=2), group=fg)
        for r, o in enumerate(outs):
            check(same_bytes(o, pattern(r, dtype, shapes[r], salt=2)), f"uneven all_gather {dtype}: rank {r}")
    # The fused matmul + reduce-scatter against a float64 reference.
    hcom = fastgather.get_comm_name(fg, rank)
    for dtype in [torch.bfloat16, torch.float32]:
        rows, k, n = 6, 96, 40
        m = rows * world

        def make(r, shape, salt):
            g = torch.Generator().manual_seed(7 * r + 13 * salt + m)
            return (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5).to(dtype)
        bias = make(99, (n,), 3)
        out = fastgather.mm_reduce_scatter_base(make(rank, (m, k), 1), make(rank, (k, n), 2), hcom, world, bias=bias)
        ref = sum(make(r, (m, k), 1).double() @ make(r, (k, n), 2).double() for r in range(world))
        ref = ref[rank * rows:(rank + 1) * rows] + bias.double()
        err = (out.double() - ref).abs().max().item()
        check(out.dtype == dtype and out.shape == (rows, n) and err <= TOL[dtype] * max(ref.abs().max().item(), 1.0)
              * (k ** 0.5) * world, f"mm_reduce_scatter_base {dtype}: {tuple(out.shape)}, max error {err}")
    # send/recv between the hosts (one UCX message each): a ring through batch_isend_irecv.
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for shape in [(0,), (7,), (8, 3072), (512, 3072)]:
        got = torch.empty(shape)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, pattern(rank, torch.float32, shape, salt=5), nxt, group=fg),
                                       dist.P2POp(dist.irecv, got, prev, group=fg)])
        for w in reqs:
            w.wait()
        check(same_bytes(got, pattern(prev, torch.float32, shape, salt=5)), f"send/recv {shape} from rank {prev}")
    # A receive from any source (src=None): rank 0 takes one message from each other rank, on its
    # host and on the other.
    any_source_from_everyone(rank, world, fg, 70000, tag=4, salt=6)
    print(f"rank {rank}: {fastgather.transport(fg)}", file=sys.stderr)

def world_backend_env(rank, world):
    """init_process_group("fastgather") with env:// (what torchrun sets up)."""
    check(os.environ.get("MASTER_PORT") is not None, "env:// start-up expected")
    world_backend(rank, world)
    check(fastgather.backend_of(dist.group.WORLD) is dist.group.WORLD._get_backend(torch.device("cpu")),
          "the CPU backend of the world is fastgather's")


def world_backend_cpu(rank, world):
    """init_process_group(backend="cpu:fastgather")."""
    world_backend(rank, world)
    check(isinstance(dist.group.WORLD._get_backend(torch.device("cpu")), fastgather._C.ProcessGroupFastgather),
          "cpu:fastgather")


def exchange_times(t):
    """Every rank's float, over the gloo world."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, t)
    return out


def matmul_for(seconds):
    a = torch.rand(256, 256)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = torch.mm(a, a).clamp_(-1, 1)
    return time.monotonic()


def async_overlap(rank, world):
    """async_op=True: rank 0 starts the gather, computes 50 ms, then waits; rank 1's blocking
    call must return during rank 0's computation, and rank 0 must find its work done. 1 MiB per
    rank takes several pipeline steps through the ring (a quarter of L2 each), and rank 1 starts
    its call 10 ms after rank 0's, so rank 0's side must make progress while Python computes
    (its progress thread), not only post its first bytes. (Had both started together, rank 0's
    first look could find each of rank 1's steps already there and finish the whole gather
    before it returned: with 2 MiB of L2, 1 MiB is only 3 steps. Larger blocks, 8 MB, took
    40-62 ms: each step waits for the progress thread to be scheduled beside torch's two
    matmul threads on two cores.)"""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    for nbytes in [96 * 1024, (1 << 20) + 4]:
        n = nbytes // 4
        x = pattern(rank, torch.float32, (n,))
        flat = torch.empty(world * n)
        dist.barrier()  # gloo: both ranks start together
        if rank == 0:
            t0 = time.monotonic()
            work = dist.all_gather_into_tensor(flat, x, group=fg, async_op=True)
            t_end = matmul_for(0.05)
            done_before_wait = work.is_completed()
            work.wait()
            times = exchange_times(t_end)
            check(done_before_wait, f"{nbytes} B: the gather was not done after 50 ms of matmul")
            check(times[1] < t_end, f"{nbytes} B: rank 1 returned {times[1] - t0:.3f} s after the start, "
                                    f"after rank 0's matmul ended ({t_end - t0:.3f} s)")
            print(f"{nbytes} B: rank 1 returned {1e3 * (times[1] - t0):.2f} ms into rank 0's 50 ms matmul",
                  file=sys.stderr)
        else:
            time.sleep(0.01)  # rank 0 has started its gather and is computing
            dist.all_gather_into_tensor(flat, x, group=fg)
            exchange_times(time.monotonic())
        check(same_bytes(flat, torch.cat([pattern(r, torch.float32, (n,)) for r in range(world)])), f"{nbytes} B")
    dist.barrier(group=fg)


def thread_names():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return names


def blocking_on_the_callers_thread(rank, world):
    """async_op=False (torch waits on the Work at once): the call runs on the caller's thread, nothing
    is handed to the library's progress thread ("fg-progress"), which therefore never starts; the
    first async_op=True call starts it (which shows the name is what to look for)."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    for numel in [1536, 307200]:  # one-shot, and a ring of several steps (each divisible by 2 and 3)
        x = pattern(rank, torch.float32, (numel,))
        every = [pattern(r, torch.float32, (numel,)) for r in range(world)]
        for _ in range(20):
            y = x.clone()
            dist.all_reduce(y, group=fg)
            check(same_bytes(y, summed(every, torch.float32)), f"all_reduce of {numel}")
            flat = torch.empty(world * numel)
            dist.all_gather_into_tensor(flat, x, group=fg)
            check(same_bytes(flat, torch.cat(every)), f"all_gather_into_tensor of {numel}")
            outs = [torch.empty(numel) for _ in range(world)]
            dist.all_gather(outs, x, group=fg)
            check(all(same_bytes(o, e) for o, e in zip(outs, every)), f"all_gather of {numel}")
            part = torch.empty(numel // world)
            dist.reduce_scatter_tensor(part, x, group=fg)
            mine = summed([e.view(world, -1)[rank] for e in every], torch.float32)
            check(same_bytes(part, mine), f"reduce_scatter_tensor of {numel}")
            b = x.clone()
            dist.broadcast(b, src=world - 1, group=fg)
            check(same_bytes(b, every[-1]), f"broadcast of {numel}")
            a2a = torch.empty(numel)
            dist.all_to_all_single(a2a, x, group=fg)
            check(same_bytes(a2a, torch.cat([e.view(world, -1)[rank] for e in every])), f"all_to_all of {numel}")
            dist.barrier(group=fg)
    names = thread_names()
    check("fg-progress" not in names, f"blocking calls handed work to the progress thread: threads {names}")
    # The control: rank 0's call cannot complete when it starts (the others join 50 ms later), so
    # it is handed over.
    dist.barrier()  # gloo
    if rank != 0:
        time.sleep(0.05)
    work = dist.all_reduce(torch.ones(16), group=fg, async_op=True)
    work.wait()
    names = thread_names()
    check(rank != 0 or "fg-progress" in names, f"an async_op=True call did not start the progress thread: {names}")
    dist.barrier(group=fg)


def wait_timeout(rank, world):
    """Work.wait(timeout) honours its timeout: the op is still in flight and completes later;
    exception() and the future carry an error; is_completed() tests without blocking."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    x = pattern(rank, torch.float32, (1000,))
    flat = torch.empty(world * 1000)
    if rank == 0:
        work = dist.all_gather_into_tensor(flat, x, group=fg, async_op=True)
        fut = work.get_future()
        check(not work.is_completed() and not fut.done(), "complete although rank 1 has not started")
        t0 = time.monotonic()
        try:
            work.wait(timeout=datetime.timedelta(milliseconds=200))
            raise AssertionError("wait(timeout) returned although the peer is 1 s late")
        except dist.DistBackendError as e:
            took = time.monotonic() - t0
            check(0.19 <= took < 0.7, f"wait(timeout=200 ms) raised after {took:.3f} s")
            check("still in flight" in str(e), str(e))
        check(work.wait(), "the second wait")
        check(fut.wait()[0] is flat, "the future holds the output")
    else:
        time.sleep(1.0)
        dist.all_gather_into_tensor(flat, x, group=fg)
    check(same_bytes(flat, torch.cat([pattern(r, torch.float32, (1000,)) for r in range(world)])), "data")
    # An error through async work: mismatched sizes.
    y = torch.zeros(3 if rank == 0 else 4)
    work = dist.all_gather_into_tensor(torch.empty(world * y.numel()), y, group=fg, async_op=True)
    fut = work.get_future()
    try:
        work.wait()
        raise AssertionError("a mismatch did not raise from wait()")
    except ValueError as e:
        check("Mismatch" in str(e), str(e))
    check(work.is_completed() and not work.is_success() and work.exception() is not None, "exception()")
    try:
        fut.wait()
        raise AssertionError("the future of a failed work did not raise")
    except Exception as e:
        check("Mismatch" in str(e), str(e))
    dist.barrier(group=fg)


def coalesced(rank, world):
    """all_gather_into_tensor_coalesced (the ProcessGroup method, and through the coalescing
    manager), all_gather_coalesced, the functional collectives' all_gather_tensor, and all_reduce of
    a sparse tensor."""
    import torch.distributed._functional_collectives as funcol
    fg = dist.new_group(list(range(world)), backend="fastgather")
    shapes = [(3,), (5, 7), (0,), (64, 33)]
    dtypes = [torch.bfloat16] * 4  # torch asks for one dtype per coalesced call
    xs = [pattern(rank, d, s, salt=i) for i, (d, s) in enumerate(zip(dtypes, shapes))]
    want = [torch.cat([pattern(r, d, s, salt=i) for r in range(world)]) for i, (d, s) in enumerate(zip(dtypes, shapes))]
    outs = [torch.empty((world * s[0],) + s[1:], dtype=d) for d, s in zip(dtypes, shapes)]
    work = fg.allgather_into_tensor_coalesced(outs, xs)
    work.wait()
    check(all(same_bytes(o, w) for o, w in zip(outs, want)), "allgather_into_tensor_coalesced")
    outs = [torch.empty((world * s[0],) + s[1:], dtype=d) for d, s in zip(dtypes, shapes)]
    with dist._coalescing_manager(group=fg, async_ops=True) as cm:
        for o, x in zip(outs, xs):
            dist.all_gather_into_tensor(o, x, group=fg)
    cm.wait()
    check(all(same_bytes(o, w) for o, w in zip(outs, want)), "_coalescing_manager")
    # A sparse COO tensor (gloo sums one): entries that coincide across ranks added, a rank with
    # none, values with a dense dimension; against the dense sum.
    def sparse_of(r):
        g = torch.Generator().manual_seed(70 + r)
        dense = torch.zeros(9, 6, 2, dtype=torch.float64)
        if r != 1:
            for _ in range(5 + r):
                i, j = torch.randint(0, 9, (1,), generator=g).item(), torch.randint(0, 6, (1,), generator=g).item()
                dense[i, j] += torch.randint(1, 50, (2,), generator=g).double()
        return dense.to_sparse(sparse_dim=2)
    y = sparse_of(rank)
    dist.all_reduce(y, group=fg)
    check(y.is_sparse and torch.equal(y.to_dense(), sum(sparse_of(r).to_dense() for r in range(world))), "sparse all_reduce")
    lists = [[torch.empty(s, dtype=d) for d, s in zip(dtypes, shapes)] for _ in range(world)]
    dist.all_gather_coalesced(lists, xs, group=fg)
    for r in range(world):
        for i, (d, s) in enumerate(zip(dtypes, shapes)):
            check(same_bytes(lists[r][i], pattern(r, d, s, salt=i)), f"all_gather_coalesced rank {r} tensor {i}")
    got = funcol.all_gather_tensor(xs[1], gather_dim=0, group=fg)
    check(same_bytes(torch.as_tensor(got.wait() if hasattr(got, "wait") else got), want[1]), "funcol.all_gather_tensor")
    got = funcol.all_gather_tensor(xs[3], gather_dim=1, group=fg)
    got = got.wait() if hasattr(got, "wait") else got
    check(same_bytes(torch.as_tensor(got), torch.cat([pattern(r, dtypes[3], (64, 33), salt=3) for r in range(world)], dim=1)),
          "funcol.all_gather_tensor along dim 1")
    # Reductions coalesced: all_reduce and reduce_scatter_tensor under the coalescing manager
    # (allreduce_coalesced, reduce_scatter_tensor_coalesced: DTensor's Partial -> Shard), and the
    # functional reduce_scatter_tensor_coalesced, against the reductions one at a time.
    ys = [pattern(rank, torch.float32, s, salt=10 + i) for i, s in enumerate(shapes)]
    alone = [y.clone() for y in ys]
    for a in alone:
        dist.all_reduce(a, op=dist.ReduceOp.MAX, group=fg)
    together = [y.clone() for y in ys]
    with dist._coalescing_manager(group=fg, async_ops=True) as cm:
        for t in together:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=fg)
    cm.wait()
    check(all(same_bytes(a, t) for a, t in zip(alone, together)), "all_reduce MAX under the coalescing manager")
    bigs = [pattern(rank, torch.float32, (world * 6, 4), salt=20 + i) for i in range(3)]
    alone = [torch.empty(6, 4) for _ in bigs]
    for o, b in zip(alone, bigs):
        dist.reduce_scatter_tensor(o, b, op=dist.ReduceOp.AVG, group=fg)
    together = [torch.empty(6, 4) for _ in bigs]
    with dist._coalescing_manager(group=fg, async_ops=True) as cm:
        for o, b in zip(together, bigs):
            dist.reduce_scatter_tensor(o, b, op=dist.ReduceOp.AVG, group=fg)
    cm.wait()
    check(all(same_bytes(a, t) for a, t in zip(alone, together)), "reduce_scatter_tensor AVG under the coalescing manager")
    got = funcol.reduce_scatter_tensor_coalesced(bigs, "sum", [0, 0, 0], group=fg)
    sums = [torch.empty(6, 4) for _ in bigs]
    for o, b in zip(sums, bigs):
        dist.reduce_scatter_tensor(o, b, group=fg)
    check(all(same_bytes(torch.as_tensor(g.wait() if hasattr(g, "wait") else g), w) for g, w in zip(got, sums)),
          "funcol.reduce_scatter_tensor_coalesced")
    dist.barrier(group=fg)


def compiled(rank, world):
    """torch.compile(fullgraph=True) of a function calling fastgather.all_gather_base_mm."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    hcom = fastgather.get_comm_name(fg)

    def layer(x1, x2, bias):
        out, gathered = fastgather.all_gather_base_mm(x1, x2, hcom, world, bias=bias)
        return torch.relu(out) * 2, gathered.sum(dim=1)

    fast = torch.compile(layer, fullgraph=True)
    for m in [4, 9]:
        x1 = (pattern(rank, torch.float32, (m, 64), salt=m) - 60) / 64
        x2 = (pattern(99, torch.float32, (64, 16)) - 60) / 64
        bias = torch.linspace(-1, 1, 16)
        got_out, got_sum = fast(x1, x2, bias)
        ref_out, ref_sum = layer(x1, x2, bias)
        full = torch.cat([(pattern(r, torch.float32, (m, 64), salt=m) - 60) / 64 for r in range(world)])
        want = torch.relu(full.double() @ x2.double() + bias.double()) * 2
        check(got_out.shape == (m * world, 16) and torch.allclose(got_out.double(), want, atol=1e-4), f"compiled m={m}")
        check(torch.equal(got_out, ref_out) and torch.allclose(got_sum, ref_sum), f"compiled vs eager m={m}")
    dist.barrier(group=fg)


def direct_ops(rank, world, tp, dp):
    """The direct operators (torch.ops.fastgather.*, by the group's handle) against torch.distributed on
    the same fastgather group and on gloo, byte for byte: every dtype, in place and out of place, strided
    tensors; under torch.compile(fullgraph=True); and every misuse refused with the reason."""
    fg, ranks = groups(world, tp, dp, "fastgather")
    gl, _ = groups(world, tp, dp, "gloo")
    n, me = len(ranks), ranks.index(rank)
    h = fastgather.handle(fg)
    check(fastgather.handle(fg) == h and isinstance(h, int), "the handle is one int for the group's life")
    ops = torch.ops.fastgather
    for dtype in DTYPES:
        for shape in [(1,), (7,), (4 * n, 5), (2 * n, 3072)]:
            x = pattern(rank, dtype, shape)
            reductions = ["sum", "max", "min"] if dtype != torch.bool else ["max", "min"]
            for red in reductions:
                want = x.clone()
                dist.all_reduce(want, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                                          "min": dist.ReduceOp.MIN}[red], group=fg)
                got = ops.all_reduce(x, red, h)
                check(same_bytes(got, want) and same_bytes(x, pattern(rank, dtype, shape)),
                      f"all_reduce {red} {dtype} {shape}: differs from dist.all_reduce, or the input changed")
                y = x.clone()
                check(ops.all_reduce_(y, red, h) is None and same_bytes(y, want), f"all_reduce_ {red} {dtype} {shape}")
                ref = x.clone()
                # (gloo rounds fp16/bf16 sums at every step, fastgather once: compared where both are exact.)
                exact = dtype not in (torch.float16, torch.bfloat16)
                if red == "sum" and exact and gloo_or_none(lambda: (dist.all_reduce(ref, group=gl), True)[1]):
                    check(same_bytes(got, ref), f"all_reduce {dtype} {shape}: differs from gloo")
            gathered = torch.cat([pattern(r, dtype, shape) for r in ranks])
            check(same_bytes(ops.all_gather_into_tensor(x, n, h), gathered), f"all_gather_into_tensor {dtype} {shape}")
            out = torch.empty_like(gathered)
            ops.all_gather_into_tensor_out(x, n, h, out=out)
            check(same_bytes(out, gathered), f"all_gather_into_tensor_out {dtype} {shape}")
            if shape[0] % n == 0 and dtype != torch.bool:
                want = torch.empty((shape[0] // n,) + tuple(shape[1:]), dtype=dtype)
                dist.reduce_scatter_tensor(want, x, group=fg)
                check(same_bytes(ops.reduce_scatter_tensor(x, "sum", n, h), want), f"reduce_scatter_tensor {dtype} {shape}")
            check(same_bytes(ops.broadcast(x, n - 1, h), pattern(ranks[-1], dtype, shape)), f"broadcast {dtype} {shape}")
            b = x.clone()
            ops.broadcast_(b, 0, h)
            check(same_bytes(b, pattern(ranks[0], dtype, shape)), f"broadcast_ {dtype} {shape}")
    # Strided tensors: read as they are, written back where they lie.
    base = pattern(rank, torch.float32, (6, 10))
    t = base.t()
    ops.all_reduce_(t, "sum", h)
    check(same_bytes(t.contiguous(), sum(pattern(r, torch.float32, (6, 10)) for r in ranks).t().contiguous()),
          "all_reduce_ of a transposed tensor")
    wide = torch.zeros((n * 10, 12))[:, ::2]
    ops.all_gather_into_tensor_out(pattern(rank, torch.float32, (6, 10)).t(), n, h, out=wide)
    check(same_bytes(wide.contiguous(), torch.cat([pattern(r, torch.float32, (6, 10)).t() for r in ranks])),
          "all_gather_into_tensor_out into a strided out")

    # torch.compile(fullgraph=True): the out-of-place forms trace (fake kernels) and give eager's bytes.
    def layer(x):
        s = ops.all_reduce(x * 2, "sum", h)
        g = ops.all_gather_into_tensor(s, n, h)
        r = ops.reduce_scatter_tensor(g, "avg", n, h)
        return ops.broadcast(r + 1, 0, h)

    fast = torch.compile(layer, fullgraph=True)
    for rows in [n, 3 * n]:
        x = (pattern(rank, torch.float32, (rows, 16), salt=rows) - 60) / 64
        check(same_bytes(fast(x), layer(x)), f"compiled vs eager, {rows} rows")

    # And the in-place and out= forms (their fake kernels return the tensor they write).
    def layer_in_place(x):
        y = x * 2
        ops.all_reduce_(y, "avg", h)
        out = x.new_empty((n * x.shape[0], x.shape[1]))
        ops.all_gather_into_tensor_out(y, n, h, out=out)
        ops.broadcast_(out, n - 1, h)
        return out + 1

    fast_in_place = torch.compile(layer_in_place, fullgraph=True)
    for rows in [n, 3 * n]:
        x = (pattern(rank, torch.float32, (rows, 16), salt=rows) - 60) / 64
        check(same_bytes(fast_in_place(x), layer_in_place(x)), f"compiled in place vs eager, {rows} rows")

    # Misuse: the reason, on every rank alike (nothing is sent, so the group goes on).
    x = torch.ones(4 * n)
    for what, exc, fn, words in [
            ("a handle that is no group's", ValueError, lambda: ops.all_reduce(x, "sum", 10 ** 6), "not a fastgather group handle"),
            ("a negative handle", ValueError, lambda: ops.all_reduce(x, "sum", -1), "not a fastgather group handle"),
            ("a reduction torch has no name for", NotImplementedError, lambda: ops.all_reduce(x, "median", h), "median"),
            ("avg of int", NotImplementedError, lambda: ops.all_reduce(x.int(), "avg", h), "AVG"),
            ("a wrong group_size", ValueError, lambda: ops.all_gather_into_tensor(x, n + 1, h), "group_size"),
            ("rows that do not split", ValueError, lambda: ops.reduce_scatter_tensor(torch.ones(4 * n + 1), "sum", n, h), "split"),
            ("an out of the wrong size", ValueError,
             lambda: ops.all_gather_into_tensor_out(x, n, h, out=torch.empty(4 * n * n + 1)), "out"),
            ("a src out of the group", ValueError, lambda: ops.broadcast(x, n, h), "src"),
            ("None", (TypeError, RuntimeError), lambda: ops.all_reduce(None, "sum", h), "")]:
        msg = raises(what, exc, fn)
        check(words in msg, f"{what}: {msg}")
    # A meta tensor has a shape and no bytes: the fake kernels answer, nothing is sent.
    m = torch.empty(4 * n, device="meta")
    check(ops.all_reduce_(m, "sum", h) is None, "all_reduce_ of a meta tensor")
    check(ops.all_gather_into_tensor(m, n, h).shape == (4 * n * n,), "all_gather_into_tensor of a meta tensor")
    # The group goes on.
    check(same_bytes(ops.all_reduce(x, "sum", h), x * n), "after the refusals")
    dist.barrier(group=fg)
    # A destroyed group's handle names nothing.
    dist.destroy_process_group(fg)
    raises("a destroyed group's handle", (ValueError, RuntimeError), lambda: ops.all_reduce(x, "sum", h))
    del me


def raises(what, exc, fn):
    try:
        fn()
    except exc as e:
        return str(e)
    except BaseException as e:
        raise AssertionError(f"{what}: raised {type(e).__name__} ({e}), expected {exc}") from e
    raise AssertionError(f"{what}: did not raise")


def bad_objects(rank, world):
    """None, wrong types, a gloo group, a destroyed group: every entry point raises, none crashes."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    gl = dist.new_group(list(range(world)), backend="gloo")
    hcom = fastgather.get_comm_name(fg)
    x1, x2 = torch.ones(2, 8), torch.ones(8, 4)
    for what, exc, fn in [
        ("get_comm_name(None)", TypeError, lambda: fastgather.get_comm_name(None)),
        ("get_comm_name(42)", TypeError, lambda: fastgather.get_comm_name(42)),
        ("get_comm_name(gloo group)", ValueError, lambda: fastgather.get_comm_name(gl)),
        ("transport(None)", TypeError, lambda: fastgather.transport(None)),
        ("empty(None, (4,))", TypeError, lambda: fastgather.empty(None, (4,))),
        ("empty(gloo group)", ValueError, lambda: fastgather.empty(gl, (4,))),
        ("empty(shape=None)", TypeError, lambda: fastgather.empty(fg, None)),
        ("empty(shape='ab')", TypeError, lambda: fastgather.empty(fg, "ab")),
        ("empty(negative)", ValueError, lambda: fastgather.empty(fg, (2, -1))),
        ("empty(dtype='float')", TypeError, lambda: fastgather.empty(fg, (2,), "float")),
        ("empty(absurd)", ValueError, lambda: fastgather.empty(fg, (1 << 40, 1 << 40))),
        ("mm hcom=None", TypeError, lambda: fastgather.all_gather_base_mm(x1, x2, None, world)),
        ("mm hcom=gloo", ValueError, lambda: fastgather.all_gather_base_mm(x1, x2, gl, world)),
        ("mm hcom unknown", ValueError, lambda: fastgather.all_gather_base_mm(x1, x2, "nope", world)),
        ("mm x1=None", TypeError, lambda: fastgather.all_gather_base_mm(None, x2, hcom, world)),
        ("mm x2=list", TypeError, lambda: fastgather.all_gather_base_mm(x1, [[1.0]], hcom, world)),
        ("mm world_size=None", TypeError, lambda: fastgather.all_gather_base_mm(x1, x2, hcom, None)),
        ("mm world_size=0", ValueError, lambda: fastgather.all_gather_base_mm(x1, x2, hcom, 0)),
        ("mm bias='b'", TypeError, lambda: fastgather.all_gather_base_mm(x1, x2, hcom, world, bias="b")),
        ("mm 1-D x1", ValueError, lambda: fastgather.all_gather_base_mm(torch.ones(8), x2, hcom, world)),
        ("mm int64", TypeError, lambda: fastgather.all_gather_base_mm(x1.long(), x2.long(), hcom, world)),
        ("op hcom None", (TypeError, RuntimeError), lambda: torch.ops.fastgather.all_gather_base_mm(x1, x2, None, world)),
        ("op hcom unknown", ValueError, lambda: torch.ops.fastgather.all_gather_base_mm(x1, x2, "nope", world)),
        ("op world_size", ValueError, lambda: torch.ops.fastgather.all_gather_base_mm(x1, x2, hcom, world + 1)),
        ("_C.comm_name(None)", TypeError, lambda: fastgather._C.comm_name(None)),
        ("_C.empty_bytes(None)", TypeError, lambda: fastgather._C.empty_bytes(None, 4)),
        ("_C.empty_bytes(-1)", ValueError, lambda: fastgather._C.empty_bytes(fastgather.backend_of(fg), -1)),
        ("_C.create_backend(None)", (TypeError, ValueError),
         lambda: fastgather._C.create_backend(None, 0, 1, datetime.timedelta(seconds=1))),
        ("all_gather(None)", (TypeError, ValueError, RuntimeError, AttributeError),
         lambda: dist.all_gather(None, torch.ones(2), group=fg)),
        ("all_gather([None])", (TypeError, ValueError, RuntimeError),
         lambda: dist.all_gather([None] * world, torch.ones(2), group=fg)),
        ("broadcast(None)", (TypeError, ValueError, RuntimeError, AttributeError),
         lambda: dist.broadcast(None, src=0, group=fg)),
    ]:
        raises(what, exc, fn)
    # A destroyed group: its ops and its name fail with words, not a signal.
    gone = dist.new_group(list(range(world)), backend="fastgather")
    name = fastgather.get_comm_name(gone)
    dist.destroy_process_group(gone)
    raises("mm on a destroyed group", (ValueError, RuntimeError),
           lambda: fastgather.all_gather_base_mm(x1, x2, name, world))
    raises("all_gather on a destroyed group", (ValueError, RuntimeError),
           lambda: dist.all_gather([torch.empty(2) for _ in range(world)], torch.ones(2), group=gone))
    # Still fine afterwards.
    outs = [torch.empty(2) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), float(rank)), group=fg)
    check([o[0].item() for o in outs] == [float(r) for r in range(world)], "after the bad calls")
    dist.barrier(group=fg)


def future_callbacks(rank, world):
    """A Future callback that starts a collective and waits on its future (PowerSGD's pattern), one
    that calls a blocking collective, and a chain of .then: each ends with every value right. The
    callbacks run on the library's completion threads, never on the thread that drives the group,
    so the collectives started inside them are driven meanwhile. Hung, the test's timeout ends it."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    total = float(sum(range(1, world + 1)))
    for n in [1000, (1 << 18) + 3]:  # one step, and many through the ring
        x = torch.full((n,), float(rank + 1))

        def inner(fut):
            y = fut.value()[0].clone()  # the sum
            dist.all_reduce(y, group=fg, async_op=True).get_future().wait()  # world * the sum
            z = y.clone()
            dist.all_reduce(z, group=fg)  # blocking: world^2 * the sum
            return [y, z]

        fut = dist.all_reduce(x, group=fg, async_op=True).get_future().then(inner).then(
            lambda f: [t * 2 for t in f.value()])
        y2, z2 = fut.wait()
        check(torch.equal(x, torch.full((n,), total)), f"{n}: the first sum")
        check(torch.equal(y2, torch.full((n,), 2 * world * total)), f"{n}: the sum waited on inside the callback")
        check(torch.equal(z2, torch.full((n,), 2 * world * world * total)), f"{n}: the blocking sum in the callback")
    dist.barrier(group=fg)
    # Works nobody waited for, their group destroyed: the future still completes (the library runs
    # its callback on a thread of its own), and a dropped one is settled, nothing hangs.
    gone = dist.new_group(list(range(world)), backend="fastgather")
    a, b = torch.full((64,), float(rank + 1)), torch.full((64,), 1.0)
    wa = dist.all_reduce(a, group=gone, async_op=True)
    wb = dist.all_reduce(b, group=gone, async_op=True)
    dist.destroy_process_group(gone)
    check(torch.equal(wa.get_future().wait()[0], torch.full((64,), total)), "the future of a work of a destroyed group")
    del wb
    check(torch.equal(b, torch.full((64,), float(world))), "a dropped work of a destroyed group")


def powersgd(rank, world):
    """DDP with torch's PowerSGD hook (its callbacks wait on all-reduces inside Future.then) for 3
    steps on fastgather and on gloo: the same parameters, bit for bit (a sum of two ranks is the same
    in any order)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(group):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 8))
        ddp = DDP(model, process_group=group)
        state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                       min_compression_rate=0.5, use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(3):
            opt.zero_grad()
            ddp(torch.randn(16, 64, generator=g)).square().mean().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    same_as_gloo(world, train)


def point_to_point(rank, world):
    """send/recv (blocking, every dtype, empty to several mailboxes' worth, a non-contiguous
    receiver), tags, a ring of isend/irecv through batch_isend_irecv, a receive from any source,
    send/recv_object_list: the bytes every rank can compute, and gloo's alike. Then a receive of the
    wrong size: ValueError on the receiver, and on the sender's next send that way; the group goes on."""
    fg = dist.new_group(list(range(world)), backend="fastgather")
    gl = dist.new_group(list(range(world)), backend="gloo")
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for dtype in DTYPES + [torch.complex64]:
        for count in (0, 5, 40001):
            for group in (fg, gl):
                if dtype == torch.complex64 and group is gl:
                    continue
                x = pattern(rank, dtype, (count,), salt=count)
                want = pattern(prev, dtype, (count,), salt=count)
                got = torch.zeros(count, dtype=dtype)
                if rank % 2 == 0:
                    dist.send(x, dst=nxt, group=group)
                    dist.recv(got, src=prev, group=group)
                else:
                    dist.recv(got, src=prev, group=group)
                    dist.send(x, dst=nxt, group=group)
                check(same_bytes(got, want), f"send/recv of {count} {dtype} from rank {prev}")
    # A non-contiguous receiver, and a tag.
    got = torch.zeros(64, 48).t()
    x = pattern(rank, torch.float32, (48, 64), salt=7)
    ops = [dist.P2POp(dist.isend, x, nxt, group=fg, tag=7), dist.P2POp(dist.irecv, got, prev, group=fg, tag=7)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check(torch.equal(got, pattern(prev, torch.float32, (48, 64), salt=7)), "batch_isend_irecv into a transposed view")
    # Any source: rank 0 receives one message from every other rank.
    any_source_from_everyone(rank, world, fg, 1000, tag=2, salt=2)
    # Objects.
    if rank == 0:
        dist.send_object_list([{"from": 0, "data": list(range(300))}, "x" * 70000], dst=1, group=fg)
    elif rank == 1:
        objs = [None, None]
        dist.recv_object_list(objs, src=0, group=fg)
        check(objs == [{"from": 0, "data": list(range(300))}, "x" * 70000], f"objects: {str(objs)[:80]}")
    # A receive of the wrong size: refused on the receiver, then on the sender's next send.
    def says_both_sizes(msg):
        check("sent 40 bytes" in msg and "receives 80 bytes" in msg, msg)
    if rank == 0:
        dist.send(torch.zeros(10), dst=1, group=fg)
    elif rank == 1:
        says_both_sizes(raises("a receive of the wrong size", ValueError,
                               lambda: dist.recv(torch.zeros(20), src=0, group=fg)))
    dist.barrier(group=fg)
    if rank == 0:
        says_both_sizes(raises("the sender's next send", ValueError, lambda: dist.send(torch.zeros(10), dst=1, group=fg)))
    for bad in (world, -1, rank):
        raises(f"a send to {bad}", (ValueError, RuntimeError), lambda: dist.send(torch.zeros(2), dst=bad, group=fg))
    dist.barrier(group=fg)


def pipelining(rank, world):
    """torch.distributed.pipelining: a 2-stage GPipe schedule of a small MLP over 4 micro-batches,
    3 steps with SGD, on fastgather and on gloo: the same parameters and losses, bit for bit."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    def train(group):
        torch.manual_seed(0)
        full = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 8))
        part = full[:2] if rank == 0 else full[2:]
        stage = PipelineStage(part, rank, world, torch.device("cpu"), group=group)
        schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=lambda out, y: (out - y).square().mean())
        opt = torch.optim.SGD(part.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(5)
        losses_all = []
        for _ in range(3):
            x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
            opt.zero_grad()
            if rank == 0:
                schedule.step(x)
            else:
                losses = []
                schedule.step(target=y, losses=losses)
                losses_all += [l.detach() for l in losses]
            opt.step()
        return [p.detach().clone() for p in part.parameters()] + losses_all

    same_as_gloo(world, train)


def moe(rank, world):
    """A mixture-of-experts layer as MoE libraries route tokens: a router picks an expert per token
    (one expert per rank), the token counts are exchanged (all_to_all_single of int64), the tokens
    go to their experts and back through the functional all_to_all_single with autograd (uneven
    splits, some empty), and the loss is backpropagated into the router and every expert: on
    fastgather and on gloo, the same outputs and gradients, bit for bit."""
    import torch.distributed._functional_collectives as funcol

    def train(group):
        torch.manual_seed(0)
        hidden = 48
        router = torch.nn.Linear(hidden, world, bias=False)
        experts = [torch.nn.Linear(hidden, hidden) for _ in range(world)]
        mine = experts[rank]
        g = torch.Generator().manual_seed(50 + rank)
        outs = []
        for step in range(3):
            tokens = 5 + 7 * rank + 3 * step  # uneven per rank and step
            x = torch.randn(tokens, hidden, generator=g)
            logits = router(x)
            expert = logits.argmax(dim=1)
            if step == 1:
                expert = torch.zeros_like(expert)  # every token to expert 0: empty splits elsewhere
            order = torch.argsort(expert, stable=True)
            send_counts = torch.bincount(expert, minlength=world)
            recv_counts = torch.empty_like(send_counts)
            dist.all_to_all_single(recv_counts, send_counts, group=group)
            gate = torch.softmax(logits, dim=1).gather(1, expert[:, None])
            routed = funcol.all_to_all_single_autograd(x[order], recv_counts.tolist(), send_counts.tolist(), group)
            done = mine(routed)
            back = funcol.all_to_all_single_autograd(done, send_counts.tolist(), recv_counts.tolist(), group)
            y = torch.empty_like(back).index_copy(0, order, back) * gate
            y.square().mean().backward()
            outs.append(y.detach().clone())
        return outs + [router.weight.grad.clone(), mine.weight.grad.clone(), mine.bias.grad.clone()]

    same_as_gloo(world, train)


def sequence_and_loss_parallel(rank, world):
    """DTensor sequence parallelism (a LayerNorm on sequence shards, SequenceParallel; the
    all-gather into the column-parallel layer and the reduce-scatter out of the row-parallel one
    go through the functional collectives) and loss_parallel (the cross-entropy of vocabulary
    shards: all_reduce MAX and SUM), forward and backward, on a mesh of a fastgather group and of
    a gloo group: the same loss and gradients."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel, loss_parallel,
                                                   parallelize_module)

    def train(group):
        mesh = DeviceMesh.from_group(group, "cpu")
        torch.manual_seed(0)
        model = torch.nn.ModuleDict({"norm": torch.nn.LayerNorm(16), "up": torch.nn.Linear(16, 32),
                                     "down": torch.nn.Linear(32, 16), "head": torch.nn.Linear(16, 24, bias=False)})
        parallelize_module(model, mesh, {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        })
        g = torch.Generator().manual_seed(3)
        x = torch.randn(2, 4 * world, 16, generator=g)
        labels = torch.randint(0, 24, (2 * 4 * world,), generator=g)
        h = model["norm"](x.chunk(world, dim=1)[rank])  # this rank's part of the sequence
        h = model["down"](torch.relu(model["up"](h)))
        logits = model["head"](h)
        with loss_parallel():
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels)
            loss.backward()
        return [loss.full_tensor() if hasattr(loss, "full_tensor") else loss.detach()] + \
            [p.grad.full_tensor() for p in model.parameters()]

    same_as_gloo(world, train)


def main():
    name, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    args = [int(a) for a in sys.argv[5:]]
    master = os.environ.get("FG_TEST_MASTER", "127.0.0.1")  # another host's address in the netns test
    timeout = datetime.timedelta(seconds=60)
    if name == "world_backend_env":  # as torchrun starts a rank
        os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
        dist.init_process_group("fastgather", timeout=timeout)
    else:
        backend = {"world_backend": "fastgather", "world_backend_cpu": "cpu:fastgather"}.get(name, "gloo")
        dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank, world_size=world,
                                timeout=timeout)
    globals()[name](rank, world, *args)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
