"""The inference engines on gloo and on fastgather, side by side, in interleaved rounds.

    python tools/llm-bench/llm_bench.py [--model DIR] [--rounds 3] [--parts vllm-latency,vllm-throughput,hf,deepspeed]
        [--dtypes bfloat16,float32] [--batches 1,8] [--json out.json]

Needs vLLM, transformers and deepspeed beside fastgather (scripts/run.sh's .venv-engines). Without
--model, the larger generated model (make_model.py --size large: hidden 2048, 8 layers, vocabulary
32000) is made in a temporary folder. Tensor parallelism over 2 ranks, one core each. Per round,
each configuration runs once on each backend, the order alternating between rounds; every run is a
fresh process (a fresh vLLM engine). Printed per configuration: the median over rounds, the range,
and gloo / fastgather per round.

- vllm-latency: vLLM's own `vllm bench latency` (tools/llm-bench/vllm_bench.py) with --input-len 32
  --output-len 32 --num-iters-warmup 1 --num-iters 3 --enforce-eager: time per output token = its
  average latency / 32 (the 32-token prefill included). With fastgather, FG_VLLM_TIMES=1 gives each
  rank's time inside the per-token collectives over the span from its first to its last (vLLM's
  warm-up included): the communication share, both ranks.
- vllm-throughput: `vllm bench throughput`, 16 random prompts of 32 tokens, 64 out: tokens/s.
- hf / deepspeed: tools/llm-bench/hf_generate.py --time 16: time per output token of transformers'
  TP and of DeepSpeed AutoTP (on gloo, DeepSpeed sums fp32 with its own shared-memory op).
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHARE = re.compile(r"fastgather: group tp:0 rank (\d+): (\d+) collectives, ([\d.]+) s of the ([\d.]+) s")


def run(cmd, env_extra, timeout=1800):
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0|1", **env_extra)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{(p.stdout + p.stderr)[-4000:]}")
    return p.stdout + p.stderr


def backend_env(backend):
    return {"FG_VLLM": "1", "FG_VLLM_TIMES": "1"} if backend == "fastgather" else {"FG_VLLM": "0"}


def shares(log):
    """Each rank's share of its span inside fastgather's collectives, in percent."""
    return sorted(100.0 * float(m[2]) / float(m[3]) for m in SHARE.findall(log) if float(m[3]) > 0)


def vllm_latency(model, backend, dtype, batch):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        log = run([sys.executable, os.path.join(HERE, "vllm_bench.py"), "latency", "--model", model,
                   "--tensor-parallel-size", "2", "--dtype", dtype, "--batch-size", str(batch), "--input-len", "32",
                   "--output-len", "32", "--num-iters-warmup", "1", "--num-iters", "3", "--enforce-eager",
                   "--max-model-len", "256", "--gpu-memory-utilization", "0.1", "--output-json", out.name],
                  backend_env(backend))
        result = json.load(open(out.name))
    return {"ms_per_token": 1e3 * result["avg_latency"] / 32, "comm_share": shares(log)}


def vllm_throughput(model, backend, dtype, batch):
    del batch
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        log = run([sys.executable, os.path.join(HERE, "vllm_bench.py"), "throughput", "--model", model,
                   "--tensor-parallel-size", "2", "--dtype", dtype, "--dataset-name", "random", "--input-len", "32",
                   "--output-len", "64", "--num-prompts", "16", "--enforce-eager", "--max-model-len", "256",
                   "--gpu-memory-utilization", "0.1", "--output-json", out.name], backend_env(backend))
        result = json.load(open(out.name))
    return {"tokens_per_s": result["tokens_per_second"], "comm_share": shares(log)}


def hf_tpot(engine):
    def measure(model, backend, dtype, batch):
        del batch
        log = run([sys.executable, os.path.join(HERE, "hf_generate.py"), model, "--engine", engine, "--backend",
                   backend, "--dtype", dtype, "--max-tokens", "2", "--time", "16"], {})
        return {"ms_per_token": float(re.search(r"^TPOT ([\d.]+)$", log, re.M)[1])}
    return measure


PARTS = {"vllm-latency": vllm_latency, "vllm-throughput": vllm_throughput, "hf": hf_tpot("hf"),
         "deepspeed": hf_tpot("deepspeed")}


def stop(signum, frame):
    raise KeyboardInterrupt


def configs(parts, dtypes, batches):
    for part in parts:
        for dtype in dtypes:
            for batch in (batches if part == "vllm-latency" else [1]):
                if part == "vllm-throughput" and dtype != dtypes[0]:
                    continue  # one dtype: the run is long, and its ratio follows the latency table's
                yield part, dtype, batch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", default="vllm-latency,vllm-throughput,hf,deepspeed")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--json")
    args = ap.parse_args()
    parts = args.parts.split(",")
    for p in parts:
        if p not in PARTS:
            ap.error(f"--parts: {p!r} is none of {', '.join(PARTS)}")
    model = args.model
    if model is None:
        sys.path.insert(0, HERE)
        import make_model
        model = make_model.make_model(tempfile.mkdtemp(prefix="fg-llm-"), "large", "bfloat16")
    cells = list(configs(parts, args.dtypes.split(","), [int(b) for b in args.batches.split(",")]))
    results = {}
    # Stopped early (SIGTERM, a timeout, Ctrl-C), it still prints the rounds each backend completed.
    signal.signal(signal.SIGTERM, stop)
    try:
        for r in range(args.rounds):
            for part, dtype, batch in cells:
                order = ["gloo", "fastgather"] if r % 2 == 0 else ["fastgather", "gloo"]
                for backend in order:
                    res = PARTS[part](model, backend, dtype, batch)
                    results.setdefault(f"{part} {dtype} batch {batch}", {}).setdefault(backend, []).append(res)
                    print(f"round {r + 1} {part} {dtype} batch {batch} {backend}: {res}", flush=True)
    except KeyboardInterrupt:
        print("stopped: the table holds the rounds both backends completed", flush=True)
    report(results, args.json, model)


def report(results, json_path, model):
    print()
    print("| engine, dtype, batch | metric | gloo: median [range] | fastgather: median [range] | gloo / fastgather, "
          "per round | fastgather's communication share (both ranks, per round) |")
    print("|---|---|---:|---:|---|---|")
    for cell, by in results.items():
        done = min(len(by.get("gloo", [])), len(by.get("fastgather", [])))
        if done == 0:
            continue
        by = {k: v[:done] for k, v in by.items()}
        metric = "tokens/s" if cell.startswith("vllm-throughput") else "ms per output token"
        key = "tokens_per_s" if metric == "tokens/s" else "ms_per_token"
        g = [x[key] for x in by["gloo"]]
        f = [x[key] for x in by["fastgather"]]
        ratios = [(b / a if metric == "tokens/s" else a / b) for a, b in zip(g, f)]
        share = "; ".join("-".join(f"{s:.1f}%" for s in x.get("comm_share", [])) for x in by["fastgather"])
        print(f"| {cell} | {metric} | {statistics.median(g):.1f} [{min(g):.1f}-{max(g):.1f}] | "
              f"{statistics.median(f):.1f} [{min(f):.1f}-{max(f):.1f}] | "
              f"{', '.join(f'{x:.2f}x' for x in ratios)} | {share or '-'} |")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"model": model, "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
