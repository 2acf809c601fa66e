#!/usr/bin/env python3
"""AllGather vs AllGather+MatMul, as the original experiment ran it, on CPU,
with gloo and fastgather side by side.

Launch as the original: the same six variables, no torchrun; this program
starts one process per local rank (the server's first rank runs in this
process):

    TP=1 DP=2 SERVER_NUM=1 SERVER_INDEX=0 MASTER_IP=127.0.0.1 PORT=29500 \\
        PYTHONPATH=build/python .venv/bin/python examples/all_gather_matmul_multinode.py

On several servers, run it on each with its SERVER_INDEX. BACKEND=gloo or
BACKEND=fastgather runs one backend; by default both run, one after the
other in the same processes. The world group is always gloo; the TP groups
of DP ranks (ranks k, k+TP, k+2TP, ...) are created with the backend under
test, as dist.new_group(ranks, backend=...).

Two tables per backend, with the original's columns (per-rank data, average
latency, effective bandwidth = per-rank bytes / average latency):
  AllGather        dist.all_gather of x (m, 3072) fp32 into a list
  AllGather+MatMul fastgather.all_gather_base_mm(x1 (m', 3072) fp16, x2 (3072, 16)) with
                   fastgather; with gloo, dist.all_gather then torch.matmul (fp16 matmul
                   is not implemented on CPU in torch 1.13, so gloo's multiplies in fp32)
m' is chosen so that both ops move the same bytes per rank; then the verdict:
is the standalone all-gather at least as fast as the fused op at equal bytes?
"""
import argparse
import datetime
import multiprocessing
import os
import sys
import time

import torch
import torch.distributed as dist

HIDDEN = 3072
N = 16
DEFAULT_MS = [8, 32, 128, 512]                                 # 96 KB .. 6 MB per rank
FULL_MS = [8, 32, 128, 256, 512, 1024, 2048, 4096, 8192]       # 96 KB .. 96 MB (fg-bench's sweep)


def env_int(name, default):
    v = os.environ.get(name, str(default))
    if not v.isdigit():
        sys.exit(f"{name}={v!r} is not a whole number")
    return int(v)


def server_block(world, servers, index):
    """Consecutive ranks per server, the first servers one more (as fastgather's launcher)."""
    q, rem = divmod(world, servers)
    first = index * q + min(index, rem)
    return first, q + (1 if index < rem else 0)


def timed(fn, iters, group):
    for _ in range(20):  # warm-up: caches, the ring gone round once
        fn()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def human(b):
    for unit in ["B", "KB", "MB", "GB"]:
        if b < 1024 or unit == "GB":
            return f"{b:g} {unit}" if b == int(b) else f"{b:.1f} {unit}"
        b /= 1024


def table(title, rows):
    out = [f"### {title}", "", "| m | per-rank data | avg latency (ms) | effective bandwidth GB/s |", "|---:|---:|---:|---:|"]
    for m, nbytes, sec in rows:
        out.append(f"| {m} | {human(nbytes)} | {sec * 1e3:.4f} | {nbytes / sec / 1e9:.2f} |")
    return "\n".join(out)


def run_backend(backend, rank, world, tp, dp, ms, iters):
    import fastgather  # registers the backend
    mine = None
    for k in range(tp):
        ranks = list(range(k, world, tp))
        g = dist.new_group(ranks, backend=backend, timeout=datetime.timedelta(seconds=60))
        if rank in ranks:
            mine = (g, ranks)
    group, ranks = mine
    n = len(ranks)
    ag_rows, mm_rows = [], []
    for m in ms:
        x = torch.randn(m, HIDDEN, dtype=torch.float32)
        outs = [torch.empty_like(x) for _ in range(n)]
        sec = timed(lambda: dist.all_gather(outs, x, group=group), iters(m), group)
        ag_rows.append((m, x.numel() * x.element_size(), sec))

        m2 = m * 4 // 2  # fp16 rows of the same bytes
        x1 = torch.randn(m2, HIDDEN).half()
        x2 = (torch.randn(HIDDEN, N) / HIDDEN ** 0.5).half()
        if backend == "fastgather":
            hcom = fastgather.get_comm_name(group, rank)
            fn = lambda: fastgather.all_gather_base_mm(x1, x2, hcom, n, gather_index=0, gather_output=True)
        else:
            gathered = [torch.empty_like(x1) for _ in range(n)]
            w32 = x2.float()

            def fn():
                dist.all_gather(gathered, x1, group=group)
                return torch.cat(gathered).float() @ w32
        sec = timed(fn, iters(m), group)
        mm_rows.append((m2, x1.numel() * x1.element_size(), sec))
    # The slowest rank's time is the job's: gather everyone's figures over the gloo world.
    mine_t = torch.tensor([s for _, _, s in ag_rows] + [s for _, _, s in mm_rows], dtype=torch.float64)
    every = [torch.empty_like(mine_t) for _ in range(world)]
    dist.all_gather(every, mine_t)
    slowest = torch.stack(every).max(dim=0).values.tolist()
    ag_rows = [(m, b, slowest[i]) for i, (m, b, _) in enumerate(ag_rows)]
    mm_rows = [(m, b, slowest[len(ms) + i]) for i, (m, b, _) in enumerate(mm_rows)]
    return ag_rows, mm_rows


def rank_main(rank, world, tp, dp, master, port, backends, ms, quick):
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    print(f"rank {rank}/{world} ready (TP={tp} DP={dp}, backends {', '.join(backends)})", flush=True)

    def iters(m):
        return max(5, (200 if not quick else 20) // max(1, m // 64))

    report = []
    for b in backends:
        ag, mm = run_backend(b, rank, world, tp, dp, ms, iters)
        report.append((b, ag, mm))
    if rank == 0:
        for b, ag, mm in report:
            print()
            print(table(f"AllGather [{b}] (fp32, hidden {HIDDEN}, TP={tp} DP={dp})", ag))
            print()
            print(table(f"AllGather+MatMul [{b}] (fp16, hidden {HIDDEN}, n={N})", mm))
        print("\n### Is the standalone all-gather at least as fast as the fused op moving the same bytes? (average)\n")
        for b, ag, mm in report:
            for (m, nbytes, t_ag), (_, _, t_mm) in zip(ag, mm):
                print(f"- [{b}] {human(nbytes):>8} per rank: all_gather {t_ag * 1e3:.3f} ms vs all_gather_matmul "
                      f"{t_mm * 1e3:.3f} ms -> {'yes' if t_ag <= t_mm else 'no'}")
        if len(report) == 2:
            print("\n### fastgather vs gloo, same sizes (average latency, ms)\n")
            print("| per-rank data | gloo all_gather | fastgather all_gather | speed-up | gloo all_gather+matmul | "
                  "fastgather all_gather_base_mm | speed-up |")
            print("|---:|---:|---:|---:|---:|---:|---:|")
            by = {b: (ag, mm) for b, ag, mm in report}
            for i, (m, nbytes, _) in enumerate(by["gloo"][0]):
                g_ag, f_ag = by["gloo"][0][i][2], by["fastgather"][0][i][2]
                g_mm, f_mm = by["gloo"][1][i][2], by["fastgather"][1][i][2]
                print(f"| {human(nbytes)} | {g_ag * 1e3:.3f} | {f_ag * 1e3:.3f} | {g_ag / f_ag:.1f}x | {g_mm * 1e3:.3f} | "
                      f"{f_mm * 1e3:.3f} | {g_mm / f_mm:.1f}x |")
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="the full sweep, 96 KB .. 96 MB per rank")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (tests)")
    a = ap.parse_args()
    tp, dp = env_int("TP", 1), env_int("DP", 2)
    servers, index = env_int("SERVER_NUM", 1), env_int("SERVER_INDEX", 0)
    master, port = os.environ.get("MASTER_IP", "127.0.0.1"), env_int("PORT", 29500)
    backends = [b for b in os.environ.get("BACKEND", "gloo,fastgather").split(",") if b]
    for b in backends:
        if b not in ("gloo", "fastgather"):
            sys.exit(f"BACKEND={b!r}: gloo, fastgather, or both (the default)")
    world = tp * dp
    if not (1 <= servers <= world and 0 <= index < servers):
        sys.exit(f"SERVER_NUM={servers} SERVER_INDEX={index} do not fit TP*DP={world}")
    first, local = server_block(world, servers, index)
    ms = FULL_MS if a.full else DEFAULT_MS
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, world, tp, dp, master, port, backends, ms, a.quick))
             for r in range(first + 1, first + local)]
    for p in procs:
        p.start()
    failed = 0
    try:
        rank_main(first, world, tp, dp, master, port, backends, ms, a.quick)
    except Exception as e:  # report, then stop the others
        print(f"rank {first}: {e}", file=sys.stderr)
        failed = 1
        for p in procs:
            p.terminate()
    for p in procs:
        p.join()
        failed |= p.exitcode != 0
    sys.exit(failed)


if __name__ == "__main__":
    main()
