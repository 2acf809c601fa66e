"""Greedy generation with vLLM on the CPU, its token ids printed as one JSON line (``TOKENS [...]``).

    FG_VLLM=1 python tools/llm-bench/vllm_generate.py MODEL_DIR [--tp 2] [--dtype bfloat16] [--max-tokens 16]

The tests run it with and without FG_VLLM and compare the ids; vLLM's own log (stderr) says which
torch.distributed backend its workers started on.
"""
import argparse
import json
import os

from make_model import PROMPTS  # (this script's folder is first on sys.path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    # One core per rank on this 2-core machine (vLLM's automatic binding wants a NUMA node per rank).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i % os.cpu_count()) for i in range(args.tp)))
    from vllm import LLM, SamplingParams

    path, tp, dtype = args.model, args.tp, args.dtype
    llm = LLM(model=path, tensor_parallel_size=tp, dtype=dtype, enforce_eager=True, max_model_len=256, gpu_memory_utilization=0.05, seed=0)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    print("TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)


if __name__ == "__main__":
    main()
