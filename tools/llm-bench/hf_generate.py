"""Greedy generation with Hugging Face transformers on CPU ranks: plain, transformers' own tensor
parallelism, or DeepSpeed's AutoTP inference, on the torch.distributed backend named.

    python tools/llm-bench/hf_generate.py MODEL_DIR --engine hf|deepspeed --backend fastgather|gloo [--tp 2]
        [--dtype float32] [--max-tokens 16] [--time N]

Starts --tp processes itself (rank 0 prints ``TOKENS [...]``, one list per prompt; with --time N it
also times N decode steps and prints ``TPOT <ms>``). The recipes it follows are the README's:
  hf:        dist.init_process_group("fastgather"); AutoModelForCausalLM.from_pretrained(path,
             distributed_config=DistributedConfig(tp_size=2))
  deepspeed: deepspeed.init_distributed("fastgather"); fastgather.serve_deepspeed();
             deepspeed.init_inference(model, tensor_parallel={"tp_size": 2})
"""
import argparse
import json
import os
import socket
import time

from make_model import PROMPTS  # (this script's folder is first on sys.path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decode_ms(model, ids, steps):
    """Time per output token: (time of steps + 1 tokens - time of 1 token) / steps, the best of three."""
    def run(n):
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - t

    best = min(run(steps + 1) - run(1) for _ in range(3))
    return 1e3 * best / steps


COUNTS = {}


def count_deepspeed_all_reduces():
    """Counts DeepSpeed's inference_all_reduce calls and where they went: torch.distributed.all_reduce,
    DeepSpeed's shared-memory op, or neither (fastgather's direct operator, after serve_deepspeed)."""
    import importlib

    import torch
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    backend, served = ds_torch.TorchBackend, ds_torch.TorchBackend.inference_all_reduce

    inside = []

    def served_counted(*a, **k):
        COUNTS["calls"] = COUNTS.get("calls", 0) + 1
        inside.append(1)
        try:
            return served(*a, **k)
        finally:
            inside.pop()

    def counted(name, fn):  # counts the calls made from within inference_all_reduce
        def wrapper(*a, **k):
            if inside:
                COUNTS[name] = COUNTS.get(name, 0) + 1
            return fn(*a, **k)
        return wrapper

    backend.inference_all_reduce = served_counted
    torch.distributed.all_reduce = counted("torch.distributed", torch.distributed.all_reduce)
    if hasattr(torch.ops, "deepspeed") and hasattr(torch.ops.deepspeed, "inference_all_reduce_"):
        shm = torch.ops.deepspeed.inference_all_reduce_
        torch.ops.deepspeed = type("Ops", (), {"inference_all_reduce_": staticmethod(counted("deepspeed shm", shm))})()


def rank_main(rank, args, port):
    # What torchrun and the deepspeed launcher set (DeepSpeed's shared-memory op reads LOCAL_SIZE; without
    # it the op faults on its first call, SIGSEGV, instead of declining).
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.tp), LOCAL_SIZE=str(args.tp),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, tp, backend, dtype = args.model, args.tp, args.backend, getattr(torch, args.dtype)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))
    if backend == "fastgather":
        import fastgather  # registers the torch.distributed backend "fastgather"
    if args.engine == "hf":
        from transformers.distributed import DistributedConfig
        dist.init_process_group(backend)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, distributed_config=DistributedConfig(tp_size=tp))
    else:
        import deepspeed
        deepspeed.init_distributed(dist_backend=backend)
        if backend == "fastgather":
            fastgather.serve_deepspeed()
        count_deepspeed_all_reduces()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model = deepspeed.init_inference(model, tensor_parallel={"tp_size": tp}, dtype=dtype, replace_with_kernel_inject=False).module
    tok = AutoTokenizer.from_pretrained(args.model)
    tokens = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens, do_sample=False)
            tokens.append(out[0, ids.shape[1]:].tolist())
        tpot = decode_ms(model, tok(PROMPTS[0], return_tensors="pt").input_ids, args.time) if args.time else None
    if rank == 0:
        print("TOKENS " + json.dumps(tokens), flush=True)
        if args.engine == "deepspeed":
            print("ALLREDUCE " + json.dumps(COUNTS), flush=True)
        if tpot is not None:
            print(f"TPOT {tpot:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--engine", choices=["hf", "deepspeed"], default="hf")
    ap.add_argument("--backend", default="fastgather")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--time", type=int, default=0, metavar="N", help="also time N decode steps (TPOT)")
    args = ap.parse_args()
    import torch.multiprocessing as mp
    mp.start_processes(rank_main, args=(args, free_port()), nprocs=args.tp, start_method="spawn")


if __name__ == "__main__":
    main()
