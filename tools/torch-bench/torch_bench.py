#!/usr/bin/env python3
"""torch.distributed all-gather, gloo beside fastgather, and fg-bench's C++
call of the same size, in one command (2 local ranks by default):

    PYTHONPATH=build/python .venv/bin/python tools/torch-bench/torch_bench.py --fg-bench build/tools/fg-bench/fg-bench

Per backend: dist.all_gather (list), dist.all_gather_into_tensor, and the
fused op (fastgather.all_gather_base_mm) against gloo all-gather + torch
matmul (in fp32, torch's faster CPU matmul than fp16 here); for fastgather
also all_gather_into_tensor from an input in the group's symmetric heap
(fastgather.empty). Medians over iterations of the slowest rank; fp32
(m, 3072) for the gathers, fp16 (2m, 3072) @ (3072, 16) for the matmul rows
(same bytes). Then fg-bench runs the same sizes with the C++ API on ordinary
memory (--input private: what a torch tensor is), medians too.

    ... torch_bench.py --exchanges [--rounds 3]

gather, scatter, all_to_all_single, reduce, all_reduce (SUM and MAX) and a
send/recv ping-pong (with a memcpy of the same bytes beside them) instead,
gloo and fastgather in turn in every round. Across two hosts (network
namespaces joined by a veth pair): tools/torch-bench/across_hosts.sh.

    ... torch_bench.py --direct [--rounds 3] [--dtypes fp32,bf16] [--fg-bench build/tools/fg-bench/fg-bench]

all_reduce (SUM) and all-gather (into one tensor) from 4 KB to 6 MB per rank through every door,
interleaved in every round: the direct operators (torch.ops.fastgather.all_reduce_,
all_gather_into_tensor_out; and their OpOverload .default, looked up once, as an engine keeps it),
dist.* on a fastgather group, dist.* on gloo, DeepSpeed's shared-memory all_reduce
(torch.ops.deepspeed.inference_all_reduce_, what deepspeed.comm.inference_all_reduce calls; where
deepspeed is installed: pip install --no-build-isolation deepspeed==0.19.8, its op JIT-built with
g++ at the first run, fp32 only without AVX-512), and fg-bench's C++ call (ordinary memory, and
the group's heap); each both per call (median of the slowest rank, a barrier before every call)
and back to back (the original script's way: total / iterations, slowest rank). Each rank takes
its share of the cores for torch's threads (torch.set_num_threads(cpus // ranks)).
"""
import argparse
import ctypes
import datetime
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import time

import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*is deprecated")

HIDDEN, N = 3072, 16
MS = [8, 32, 128, 512, 2048]  # 96 KB .. 24 MB per rank in fp32


def median_slowest(fn, iters, group):
    for _ in range(5):
        fn()
    samples = []
    for _ in range(iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    t = torch.tensor(samples, dtype=torch.float64)
    every = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(every, t)  # the gloo world
    return statistics.median(torch.stack(every).max(dim=0).values.tolist())


def rank_main(rank, world, port, q, backends):
    import fastgather
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    results = {}
    for backend in backends:
        g = dist.new_group(list(range(world)), backend=backend)
        for m in MS:
            iters = max(10, 400 // max(1, m // 16))
            x = torch.randn(m, HIDDEN)
            outs = [torch.empty_like(x) for _ in range(world)]
            flat = torch.empty(world * m, HIDDEN)
            results[(backend, "list", m)] = median_slowest(lambda: dist.all_gather(outs, x, group=g), iters, g)
            try:
                dist.all_gather_into_tensor(flat, x, group=g)
                results[(backend, "tensor", m)] = median_slowest(lambda: dist.all_gather_into_tensor(flat, x, group=g),
                                                                 iters, g)
            except RuntimeError:
                results[(backend, "tensor", m)] = None
            if backend == "fastgather":
                xs = fastgather.empty(g, (m, HIDDEN), torch.float32)
                xs.copy_(x)
                results[(backend, "symmetric", m)] = median_slowest(
                    lambda: dist.all_gather_into_tensor(flat, xs, group=g), iters, g)
            x1 = torch.randn(2 * m, HIDDEN).half()
            x2 = (torch.randn(HIDDEN, N) / HIDDEN ** 0.5).half()
            if backend == "fastgather":
                hcom = fastgather.get_comm_name(g, rank)
                fn = lambda: fastgather.all_gather_base_mm(x1, x2, hcom, world)
            else:
                gathered = [torch.empty_like(x1) for _ in range(world)]
                w32 = x2.float()

                def fn():
                    dist.all_gather(gathered, x1, group=g)
                    return (torch.cat(gathered).float() @ w32).half()
            results[(backend, "matmul", m)] = median_slowest(fn, iters, g)
        if backend == "fastgather":
            # Where the torch path's time goes at the smallest size: each layer of the
            # tensor-form call, outermost first, down to the backend's own method.
            m = MS[0]
            x, flat = torch.randn(m, HIDDEN), torch.empty(world * m, HIDDEN)
            backend_obj = fastgather.backend_of(g)
            iters = 2000
            results["layers"] = [
                ("dist.all_gather_into_tensor", median_slowest(lambda: dist.all_gather_into_tensor(flat, x, group=g), iters, g)),
                ("dist.all_gather_single", median_slowest(lambda: dist.all_gather_single(flat, x, group=g), iters, g)),
                ("group._allgather_base(...).wait()", median_slowest(lambda: g._allgather_base(flat, x).wait(), iters, g)),
                ("backend._allgather_base(...).wait()",
                 median_slowest(lambda: backend_obj._allgather_base(flat, x).wait(), iters, g)),
            ]
    if rank == 0:
        q.put(results)
    dist.barrier()
    dist.destroy_process_group()


EXCHANGES = ["gather", "scatter", "all_to_all_single", "reduce", "all_reduce", "all_reduce_max", "send_recv", "memcpy"]


def ping_pong(rank, x, y, g):
    if rank == 0:
        dist.send(x, dst=1, group=g)
        dist.recv(y, src=1, group=g)
    elif rank == 1:
        dist.recv(y, src=0, group=g)
        dist.send(x, dst=0, group=g)


def rank_exchanges(rank, world, port, q, backends, rounds, ops, master="127.0.0.1"):
    """--exchanges: gather, scatter, all_to_all_single and reduce (SUM) of fp32 (m, 3072) per rank
    (all_to_all_single: that much in and out, in equal parts), each backend in turn in every round:
    per backend, op and size, the median over rounds of each round's median of the slowest rank."""
    import fastgather  # noqa: F401  (registers the backend)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    groups = {b: dist.new_group(list(range(world)), backend=b) for b in backends}
    per_round = {}
    for _ in range(rounds):
        for backend in backends:
            g = groups[backend]
            for m in MS:
                iters = max(10, 200 // max(1, m // 16))
                x = torch.randn(m, HIDDEN)
                outs = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
                parts = [torch.randn(m, HIDDEN) for _ in range(world)] if rank == 0 else None
                mine = torch.empty(m, HIDDEN)
                a2a_in, a2a_out = torch.randn(world * (m // world or 1), HIDDEN), torch.empty(world * (m // world or 1), HIDDEN)
                calls = {
                    "gather": lambda: dist.gather(x, outs, dst=0, group=g),
                    "scatter": lambda: dist.scatter(mine, parts, src=0, group=g),
                    "all_to_all_single": lambda: dist.all_to_all_single(a2a_out, a2a_in, group=g),
                    "reduce": lambda: dist.reduce(x, dst=0, group=g),
                    "all_reduce": lambda: dist.all_reduce(x, group=g),
                    "all_reduce_max": lambda: dist.all_reduce(x, op=dist.ReduceOp.MAX, group=g),
                    # A ping-pong between ranks 0 and 1 (the others idle): two messages of
                    # (m, 3072) fp32, one each way; the time is for both.
                    "send_recv": lambda: ping_pong(rank, x, mine, g),
                    # One memcpy of the same bytes on this rank's core, beside it: the yardstick
                    # of issue 37 (a message within 2x of a copy). libc's, on one thread (torch's
                    # copy_ splits a large copy over its intra-op threads, which two ranks on two
                    # cores make wait for each other).
                    "memcpy": lambda: ctypes.memmove(mine.data_ptr(), x.data_ptr(), x.numel() * x.element_size()),
                }
                for op in ops:
                    try:
                        v = median_slowest(calls[op], iters, g)
                    except (RuntimeError, NotImplementedError) as e:  # the table says "failed"; here is why
                        print(f"rank {rank}: {backend} {op} of {m} x {HIDDEN} fp32: {type(e).__name__}: {e}",
                              file=sys.stderr, flush=True)
                        v = None
                    per_round.setdefault((backend, op, m), []).append(v)
    if rank == 0:
        q.put({k: (None if None in v else statistics.median(v), v) for k, v in per_round.items()})
    dist.barrier()
    dist.destroy_process_group()


def print_exchanges(res, ranks, backends, rounds, ops):
    print(f"torch {torch.__version__}, {ranks} ranks, {os.cpu_count()} CPUs, {rounds} interleaved rounds; per op "
          "and size the median over rounds of each round's median (us) of the slowest rank, [min-max of the rounds]\n")
    print("| op | per-rank data | " + " | ".join(backends) + " | gloo / fastgather |")
    print("|---|---:|" + "---:|" * len(backends) + "---:|")

    def cell(v):
        if v is None:
            return "failed"
        med, runs = v
        return "failed" if med is None else f"{med * 1e6:.1f} [{min(runs) * 1e6:.0f}-{max(runs) * 1e6:.0f}]"
    for op in ops:
        for m in MS:
            kb = m * HIDDEN * 4 / 1024
            size = f"{kb:g} KB" if kb < 1024 else f"{kb / 1024:g} MB"
            row = [res.get((b, op, m)) for b in backends]
            g, f = res.get(("gloo", op, m)), res.get(("fastgather", op, m))
            ratio = f"{g[0] / f[0]:.1f}x" if g and f and g[0] and f[0] else "-"
            print(f"| {op} | {size} | " + " | ".join(cell(v) for v in row) + f" | {ratio} |")


DIRECT_KB = [4, 16, 64, 96, 384, 1536, 6144]


def back_to_back(fn, iters, group):
    """The original script's timing: iterations back to back, total / iterations, the slowest rank."""
    for _ in range(5):
        fn()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the gloo world
    return t.item()


def deepspeed_all_reduce(rank, world, port):
    """DeepSpeed's shared-memory all_reduce of the whole world (its op, built and initialized as
    deepspeed.comm's TorchBackend does), and which dtypes its kernels serve on this CPU; or None and
    why not."""
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError as e:
        return None, (), f"deepspeed is not installed ({e})"
    # Its shared memory is named after these, and used only where every rank is local (LOCAL_SIZE).
    os.environ.update(LOCAL_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mod = get_accelerator().create_op_builder("ShareMemCommBuilder").load()
    mod.initialize(world, rank)
    level = mod.vector_kernel_level()  # 1: AVX2, fp32 only; 2: AVX-512BW, bf16 and fp16 too
    dtypes = ("fp32",) if level == 1 else ("fp32", "bf16") if level >= 2 else ()
    return torch.ops.deepspeed.inference_all_reduce_, dtypes, f"vector kernel level {level}"


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def rank_direct(rank, world, port, q, rounds, exe, dtypes):
    """--direct: per round, per dtype, per size, each way of calling in turn (see the module's docstring)."""
    import fastgather
    # The cores shared out among the ranks, as inference engines and DeepSpeed's launcher do
    # (OMP_NUM_THREADS): DeepSpeed's op reduces with torch's threads, and two of them per rank on two
    # cores made its 4 KB call 28-50 us here, 5-10 ms in a script of its own (1 thread: 5.4 us).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    ds, ds_dtypes, ds_why = deepspeed_all_reduce(rank, world, port + 100)
    fg = dist.new_group(list(range(world)), backend="fastgather")
    gl = dist.new_group(list(range(world)), backend="gloo")
    h = fastgather.handle(fg)
    # A group of this rank alone (every rank makes every one): what a call costs with nothing to exchange.
    solos = [dist.new_group([r], backend="fastgather") for r in range(world)]
    solo = solos[rank]
    ops = torch.ops.fastgather
    # The overloads themselves, looked up once (as an engine keeps them): no packet to resolve per call.
    all_reduce_, all_gather_out = ops.all_reduce_.default, ops.all_gather_into_tensor_out.default
    res = {"deepspeed": ds_why}
    for r in range(rounds):
        for dt in dtypes:
            for kb in DIRECT_KB:
                x = torch.randn(kb * 1024 // DTYPES[dt].itemsize).to(DTYPES[dt])
                flat = torch.empty(world * x.numel(), dtype=x.dtype)
                iters = max(20, min(2000, 40000 // kb))
                calls = [("all_reduce", "direct", lambda: ops.all_reduce_(x, "sum", h)),
                         ("all_reduce", "direct .default", lambda: all_reduce_(x, "sum", h)),
                         ("all_reduce", "dist fastgather", lambda: dist.all_reduce(x, group=fg)),
                         ("all_reduce", "dist gloo", lambda: dist.all_reduce(x, group=gl)),
                         ("all_gather", "direct", lambda: ops.all_gather_into_tensor_out(x, world, h, out=flat)),
                         ("all_gather", "direct .default", lambda: all_gather_out(x, world, h, out=flat)),
                         ("all_gather", "dist fastgather", lambda: dist.all_gather_into_tensor(flat, x, group=fg)),
                         ("all_gather", "dist gloo", lambda: dist.all_gather_into_tensor(flat, x, group=gl))]
                if dt in ds_dtypes:
                    calls.append(("all_reduce", "deepspeed", lambda: ds(x)))
                for op, way, fn in calls:
                    n = iters if way != "dist gloo" else max(10, iters // 10)
                    res.setdefault((op, way, "call", kb, dt), []).append(median_slowest(fn, n, fg))
                    res.setdefault((op, way, "loop", kb, dt), []).append(back_to_back(fn, n, fg))
            dist.barrier()
            if exe and rank == 0:  # fg-bench between the rounds, the torch ranks idle at the barrier below
                for inp in ("private", "symmetric"):
                    for (op, kb), v in fg_bench_direct(exe, world, port + 1 + r * len(dtypes) + dtypes.index(dt), inp, dt).items():
                        res.setdefault((op, f"C++ {inp}", "call", kb, dt), []).append(v)
            dist.barrier()
    if rank == 0:
        x, hs = torch.randn(1024), fastgather.handle(solo)

        def each(fn, n=20000):
            for _ in range(200):
                fn()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) / n
        res["alone"] = [("torch.ops.fastgather.all_reduce_(x, 'sum', h)", each(lambda: ops.all_reduce_(x, "sum", hs))),
                        ("torch.ops.fastgather.all_reduce_.default(x, 'sum', h)", each(lambda: all_reduce_(x, "sum", hs))),
                        ("dist.all_reduce(x, group=g)", each(lambda: dist.all_reduce(x, group=solo))),
                        ("x.add_(0)", each(lambda: x.add_(0))),
                        ("torch.ops.aten.add_(x, 0)", each(lambda: torch.ops.aten.add_(x, 0)))]
        q.put(res)
    dist.barrier()
    dist.destroy_process_group()


def fg_bench_direct(exe, world, port, inp, dt):
    """fg-bench's medians (s) of all_reduce and all_gather at DIRECT_KB: rows of 4 KB (1024 fp32, 2048 bf16)."""
    hidden = 4096 // DTYPES[dt].itemsize
    ms = [kb // 4 or 1 for kb in DIRECT_KB]
    out = subprocess.run([exe, "--m", ",".join(map(str, ms)), "--hidden", str(hidden), "--dtype", dt, "--ops",
                          "all_reduce,all_gather", "--no-compare", "--no-limits", "--input", inp, "--time-ms", "200",
                          "--port", str(port)], env=dict(os.environ, TP="1", DP=str(world), FG_NO_MPIRUN="1"),
                         capture_output=True, text=True, timeout=600, check=True).stdout
    medians, op = {}, None
    for line in out.splitlines():
        if line.startswith("### "):
            op = {"AllReduce": "all_reduce", "AllGather": "all_gather"}.get(line.split()[1].rstrip(","))
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if op and len(cells) >= 6 and cells[0].isdigit() and int(cells[0]) in ms:
            medians[(op, DIRECT_KB[ms.index(int(cells[0]))])] = float(cells[4]) / 1e3
    return medians


def print_direct(res, ranks, rounds, dtypes):
    print("A call with nothing to exchange (a group of one rank), 4 KB fp32, back to back, rank 0 (us):\n")
    print("| call | us |")
    print("|---|---:|")
    for name, v in res.get("alone", []):
        print(f"| `{name}` | {v * 1e6:.2f} |")
    print()
    print(f"torch {torch.__version__}, {ranks} ranks, {os.cpu_count()} CPUs, {rounds} interleaved rounds; "
          "each cell the median over rounds (us), [min-max of the rounds]; per call: each round's median of the "
          "slowest rank (a barrier before every call); loop: back to back, total / iterations, slowest rank. "
          f"DeepSpeed: {res.get('deepspeed')}\n")
    for dt, op in [(dt, op) for dt in dtypes for op in ("all_reduce", "all_gather")]:
        ways = ["direct", "direct .default", "dist fastgather", "dist gloo"] + (["deepspeed"] if op == "all_reduce" else [])
        print(f"\n{op}, {dt}:\n")
        print("| per rank | C++ private | C++ heap | " + " | ".join(f"{w} (call)" for w in ways) + " | " +
              " | ".join(f"{w} (loop)" for w in ways) + " | direct - C++ private (call) | dist - direct (call) | gloo / dist (call) |" +
              (" deepspeed / direct (call) | deepspeed / direct (loop) |" if op == "all_reduce" else ""))
        print("|---:|" + "---:|" * (2 + 2 * len(ways) + 3 + (2 if op == "all_reduce" else 0)))

        def cell(key):
            v = res.get(key)
            return "-" if not v else f"{statistics.median(v) * 1e6:.1f} [{min(v) * 1e6:.1f}-{max(v) * 1e6:.1f}]"

        def med(key):
            v = res.get(key)
            return statistics.median(v) if v else None
        def ratio(a, b):
            return f"{a / b:.2f}x" if a and b else "-"
        for kb in DIRECT_KB:
            size = f"{kb} KB" if kb < 1024 else f"{kb / 1024:g} MB"
            d, c, f, g = (med((op, "direct", "call", kb, dt)), med((op, "C++ private", "call", kb, dt)),
                          med((op, "dist fastgather", "call", kb, dt)), med((op, "dist gloo", "call", kb, dt)))
            row = (f"| {size} | {cell((op, 'C++ private', 'call', kb, dt))} | {cell((op, 'C++ symmetric', 'call', kb, dt))} | " +
                   " | ".join(cell((op, w, "call", kb, dt)) for w in ways) + " | " +
                   " | ".join(cell((op, w, "loop", kb, dt)) for w in ways) + " | " +
                   (f"{(d - c) * 1e6:+.1f}" if d and c else "-") + " | " + (f"{(f - d) * 1e6:+.1f}" if d and f else "-") +
                   " | " + (f"{g / f:.1f}x" if g and f else "-") + " |")
            if op == "all_reduce":
                row += (f" {ratio(med((op, 'deepspeed', 'call', kb, dt)), d)} |"
                        f" {ratio(med((op, 'deepspeed', 'loop', kb, dt)), med((op, 'direct', 'loop', kb, dt)))} |")
            print(row)


def fg_bench_medians(exe, world, port):
    out = subprocess.run([exe, "--m", ",".join(map(str, MS)), "--ops", "all_gather", "--no-compare", "--no-limits",
                          "--input", "private", "--port", str(port)], env=dict(os.environ, TP="1", DP=str(world), FG_NO_MPIRUN="1"),
                         capture_output=True, text=True, timeout=600, check=True).stdout
    medians = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[0].isdigit():
            medians[int(cells[0])] = float(cells[4]) / 1e3  # median (ms) column
    return medians


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--fg-bench", default="", help="fg-bench binary for the C++ column")
    ap.add_argument("--backends", default="gloo,fastgather",
                    help="which to run (fastgather alone: its rows, e.g. to compare two builds in interleaved runs)")
    ap.add_argument("--exchanges", action="store_true",
                    help="gather, scatter, all_to_all_single, reduce and a send/recv ping-pong instead, the backends interleaved")
    ap.add_argument("--rounds", type=int, default=3, help="--exchanges: interleaved rounds")
    ap.add_argument("--ops", default=",".join(EXCHANGES), help="--exchanges: which of " + ",".join(EXCHANGES))
    ap.add_argument("--dtypes", default="fp32", help="--direct: fp32, bf16 or both (fp32,bf16)")
    ap.add_argument("--direct", action="store_true",
                    help="all_reduce and all-gather through the direct operators, dist.* on fastgather and on gloo, and "
                         "fg-bench's C++ (with --fg-bench), 4 KB to 6 MB, interleaved rounds")
    ap.add_argument("--rank", type=int, default=-1,
                    help="--exchanges: run this one rank of --ranks (started by hand on each host, e.g. by "
                         "across_hosts.sh); rank 0 prints the table. Default: every rank here")
    ap.add_argument("--master", default="127.0.0.1", help="--rank: rank 0's address (the gloo world's store)")
    a = ap.parse_args()
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    backends = a.backends.split(",")
    if a.direct:
        dtypes = a.dtypes.split(",")
        if set(dtypes) - set(DTYPES):
            ap.error(f"--dtypes: of {', '.join(DTYPES)}")
        procs = [ctx.Process(target=rank_direct, args=(r, a.ranks, a.port, q, a.rounds, a.fg_bench, dtypes))
                 for r in range(a.ranks)]
        for p in procs:
            p.start()
        res = q.get(timeout=3600)
        for p in procs:
            p.join()
        print_direct(res, a.ranks, a.rounds, dtypes)
        return
    if a.exchanges:
        ops = a.ops.split(",")
        unknown = sorted(set(ops) - set(EXCHANGES))
        if unknown:
            ap.error(f"--ops: no such op {', '.join(unknown)} (the ops: {', '.join(EXCHANGES)})")
        if a.rank >= 0:
            class Table:  # rank 0 prints what it would have handed back
                def put(self, res):
                    print_exchanges(res, a.ranks, backends, a.rounds, ops)
            rank_exchanges(a.rank, a.ranks, a.port, Table(), backends, a.rounds, ops, a.master)
            return
        procs = [ctx.Process(target=rank_exchanges, args=(r, a.ranks, a.port, q, backends, a.rounds, ops))
                 for r in range(a.ranks)]
        for p in procs:
            p.start()
        res = q.get(timeout=3600)
        for p in procs:
            p.join()
        print_exchanges(res, a.ranks, backends, a.rounds, ops)
        return
    procs = [ctx.Process(target=rank_main, args=(r, a.ranks, a.port, q, backends)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    res = q.get(timeout=1200)
    for p in procs:
        p.join()
    cxx = fg_bench_medians(a.fg_bench, a.ranks, a.port + 1) if a.fg_bench else {}

    missing = object()  # a backend --backends left out

    def us(v):
        return "-" if v is missing else "unsupported" if v is None else f"{v * 1e6:.1f}"

    print(f"torch {torch.__version__}, {a.ranks} ranks, {os.cpu_count()} CPUs; medians (us) of the slowest rank\n")
    print("| per-rank data | gloo all_gather | gloo all_gather_into_tensor | fastgather all_gather | "
          "fastgather all_gather_into_tensor | fastgather, symmetric input | fg-bench C++ private | "
          "torch - C++ (tensor form) | gloo / fastgather (tensor form) | gloo all_gather + matmul | "
          "fastgather all_gather_base_mm | gloo / fastgather (fused) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def ratio(a, b):
        return f"{a / b:.1f}x" if isinstance(a, float) and isinstance(b, float) else "-"

    def get(*key):
        return res.get(key, missing)

    for m in MS:
        kb = m * HIDDEN * 4 / 1024
        size = f"{kb:g} KB" if kb < 1024 else f"{kb / 1024:g} MB"
        gt, ft = get("gloo", "tensor", m), get("fastgather", "tensor", m)
        gm, fm = get("gloo", "matmul", m), get("fastgather", "matmul", m)
        c = cxx.get(m, missing)
        print(f"| {size} | {us(get('gloo', 'list', m))} | {us(gt)} | {us(get('fastgather', 'list', m))} | {us(ft)} | "
              f"{us(get('fastgather', 'symmetric', m))} | {us(c)} | {f'{(ft - c) * 1e6:+.1f}' if isinstance(c, float) and isinstance(ft, float) else '-'} | "
              f"{ratio(gt, ft)} | {us(gm)} | {us(fm)} | {ratio(gm, fm)} |")
    kb = MS[0] * HIDDEN * 4 / 1024
    print(f"\nThe tensor form at {kb:g} KB per rank, layer by layer (fastgather; median us of the slowest rank):\n")
    print("| call | median (us) | minus fg-bench C++ private (us) |")
    print("|---|---:|---:|")
    c = cxx.get(MS[0], missing)
    for name, v in res.get("layers", []):
        print(f"| `{name}` | {us(v)} | {f'{(v - c) * 1e6:+.1f}' if isinstance(c, float) else '-'} |")


if __name__ == "__main__":
    main()
