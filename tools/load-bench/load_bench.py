#!/usr/bin/env python3
"""All-gather latency on a busy machine, in one command (issue 20): for L = 0, 2
and 4 unrelated busy processes (`while :; do :; done`), fg-bench's all-gather
(fastgather from C++ on ordinary memory, and Open MPI's MPI_Allgather under
mpirun, in one fg-bench --compare run) and torch.distributed's
all_gather_into_tensor, all_gather (list) and, for fastgather, its direct
operator torch.ops.fastgather.all_gather_into_tensor_out (fastgather's backend
and gloo), 2 ranks, fp32
(m, 3072) with m = 8 and 128 (96 KB and 1.5 MB per rank). The loads are
interleaved: the whole sweep runs --rounds times.

    PYTHONPATH=build/python .venv/bin/python tools/load-bench/load_bench.py --fg-bench build/tools/fg-bench/fg-bench

The torch calls run back to back, as the original script's loop does, each
timed; "mean" is what that script's "avg" measures (total time / calls), the
median is the per-call median, both of the slowest rank per call. fg-bench's
figures are its own (median and mean of the slowest rank per iteration).
"""
import argparse
import datetime
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HIDDEN = 3072
MS = [8, 128]
CALLS = {8: 2000, 128: 300}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_rank(rank, world, port, q):
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*is deprecated")

    import fastgather  # noqa: F401 (registers the backend)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    out = {}
    for backend in ["fastgather", "gloo"]:
        g = dist.new_group(list(range(world)), backend=backend)
        h = fastgather.handle(g) if backend == "fastgather" else None
        for m in MS:
            x = torch.randn(m, HIDDEN)
            flat = torch.empty(world * m, HIDDEN)
            parts = [torch.empty(m, HIDDEN) for _ in range(world)]
            forms = {"tensor": lambda: dist.all_gather_into_tensor(flat, x, group=g),
                     "list": lambda: dist.all_gather(parts, x, group=g)}
            if h is not None:
                forms["direct"] = lambda: torch.ops.fastgather.all_gather_into_tensor_out(x, world, h, out=flat)
            for form, call in forms.items():
                for _ in range(20):
                    call()
                dist.barrier()
                times = []
                for _ in range(CALLS[m]):
                    t0 = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t0)
                t = torch.tensor(times, dtype=torch.float64)
                every = [torch.empty_like(t) for _ in range(world)]
                dist.all_gather(every, t)
                slowest = torch.stack(every).max(dim=0).values.tolist()
                key = backend if form == "tensor" else f"{backend} {form}"
                out[(key, m)] = (statistics.median(slowest), sum(slowest) / len(slowest))
    if rank == 0:
        q.put(out)
    dist.barrier()
    dist.destroy_process_group()


def run_torch(world):
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=torch_rank, args=(r, world, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    res = q.get(timeout=1800)
    for p in procs:
        p.join()
    return res


def run_fg_bench(exe, world):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "out.json")
        subprocess.run([exe, "--ops", "all_gather", "--m", ",".join(map(str, MS)), "--compare", "--no-limits",
                        "--input", "private", "--time-ms", "1000", "--json", path],
                       env=dict(os.environ, TP="1", DP=str(world)), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=1800, check=True)
        rows = json.load(open(path))["rows"]
    out = {}
    for r in rows:
        m = r["bytes_per_rank"] // (HIDDEN * 4)
        impl = "mpi" if r["impl"] == "mpi" else "fastgather" if r["impl"] in ("fastgather", "private") else None
        if impl is not None and m in MS:
            out[(impl, m)] = (r["median_us"] / 1e6, r["avg_us"] / 1e6)
    return out


def with_load(n, fn):
    loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]
    try:
        time.sleep(0.5)
        return fn()
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fg-bench", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--loads", default="0,2,4")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    loads = [int(v) for v in a.loads.split(",")]
    results = {}  # (load, impl, m) -> [(median, mean)]
    for rnd in range(a.rounds):
        for load in loads:
            both = with_load(load, lambda: (run_fg_bench(a.fg_bench, a.ranks), run_torch(a.ranks)))
            for part, prefix in zip(both, ("", "torch+")):
                for (impl, m), v in part.items():
                    results.setdefault((load, prefix + impl, m), []).append(v)
            print(f"round {rnd + 1}, load {load}: done", file=sys.stderr, flush=True)

    impls = ["fastgather", "mpi", "torch+fastgather", "torch+fastgather list", "torch+fastgather direct",
             "torch+gloo", "torch+gloo list"]
    names = {"fastgather": "fastgather C++", "mpi": "Open MPI", "torch+fastgather": "fastgather tensor form",
             "torch+fastgather list": "fastgather list form", "torch+fastgather direct": "fastgather direct op",
             "torch+gloo": "gloo tensor form", "torch+gloo list": "gloo list form"}
    print(f"{a.ranks} ranks, {os.cpu_count()} CPUs, fp32 (m, {HIDDEN}); median / mean us of the slowest rank, "
          f"one cell per round. torch forms: dist.all_gather_into_tensor (tensor), dist.all_gather (list), "
          f"torch.ops.fastgather.all_gather_into_tensor_out (direct)\n")
    print("| load | per rank | " + " | ".join(names[i] for i in impls) + " | mean: fastgather / Open MPI |")
    print("|---:|---:|" + "---|" * len(impls) + "---:|")

    def cell(key):
        return ", ".join(f"{md * 1e6:.1f} / {mn * 1e6:.1f}" for md, mn in results.get(key, [])) or "-"

    def mean_of(key):
        v = results.get(key)
        return statistics.median(mn for _, mn in v) if v else None

    def size_of(m):
        kb = m * HIDDEN * 4 / 1024
        return f"{kb:g} KB" if kb < 1024 else f"{kb / 1024:g} MB"

    for load in loads:
        for m in MS:
            fg, mpi = mean_of((load, "fastgather", m)), mean_of((load, "mpi", m))
            r1 = f"{fg / mpi:.2f}" if fg and mpi else "-"
            print(f"| {load} | {size_of(m)} | " + " | ".join(cell((load, i, m)) for i in impls) + f" | {r1} |")

    # gloo (its own form) / fastgather's, each round: the smallest of the rounds, by median and by mean.
    print("\ngloo / fastgather through torch, the worst round (median; mean): each fastgather form against gloo's same "
          "form (the direct op against gloo's tensor form)\n")
    pairs = [("torch+fastgather", "torch+gloo"), ("torch+fastgather list", "torch+gloo list"),
             ("torch+fastgather direct", "torch+gloo")]
    print("| load | per rank | " + " | ".join(names[f] for f, _ in pairs) + " |")
    print("|---:|---:|" + "---:|" * len(pairs))
    for load in loads:
        for m in MS:
            cells = []
            for f, g in pairs:
                fv, gv = results.get((load, f, m)), results.get((load, g, m))
                if not fv or not gv:
                    cells.append("-")
                    continue
                worst_md = min(b[0] / a[0] for a, b in zip(fv, gv))
                worst_mn = min(b[1] / a[1] for a, b in zip(fv, gv))
                cells.append(f"{worst_md:.1f}x; {worst_mn:.1f}x")
            print(f"| {load} | {size_of(m)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
