"""A Llama-architecture model made on the spot: random weights from a config and a byte-level BPE
tokenizer trained here on this repository's own text. Nothing is downloaded; the same arguments make
the same files (seeded), so two runs of an engine read the same model.

    python tools/llm-bench/make_model.py OUT_DIR [--size tiny|large] [--dtype bfloat16|float32]

tiny: hidden 256, 2 layers (tests: start-up in seconds); large: hidden 2048, 8 layers, what the
benchmark runs (a decode step's matrix products and its all-reduces both visible on 2 cores).
"""
import argparse
import json
import os
import pathlib

# What the generation tools (vllm_generate.py, hf_generate.py) feed the made model.
PROMPTS = ["The ring buffer of every rank", "all-gather and matmul", "Errors, not hangs:", "1 2 3 4 5"]

SIZES = {
    # hidden, layers, heads, kv heads, intermediate, vocabulary
    "tiny": (256, 2, 4, 2, 704, 1024),
    "large": (2048, 8, 16, 8, 5632, 32000),
}


def _corpus():
    """Text to train the tokenizer on: this repository's docs and sources (any text would do)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    for pattern in ("*.md", "docs/*.md", "src/**/*.cpp", "python/**/*.py"):
        for path in sorted(root.glob(pattern)):
            yield path.read_text(errors="replace")


def make_tokenizer(out_dir, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out_dir)
    return len(fast)


def make_model(out_dir, size="tiny", dtype="bfloat16", seed=0):
    """Writes config, weights (safetensors) and tokenizer into out_dir; returns out_dir."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv_heads, intermediate, vocab = SIZES[size]
    os.makedirs(out_dir, exist_ok=True)
    n_tokens = make_tokenizer(out_dir, vocab)
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
                         max_position_embeddings=2048, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
                         torch_dtype=dtype)
    assert n_tokens <= vocab, (n_tokens, vocab)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    # Larger than the default 0.02 spread, so that the logits' top token stands clear of the next
    # (the comparisons of greedy tokens across backends then test the collectives, not rounding).
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.5 / hidden ** 0.5)
    model.save_pretrained(out_dir, safe_serialization=True)
    # Greedy by default; the callers force the length (min_new_tokens, ignore_eos), so that every run
    # generates as many tokens as asked whatever the random weights say.
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1, "do_sample": False}, f)
    return out_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(make_model(args.out_dir, args.size, args.dtype, args.seed))


if __name__ == "__main__":
    main()
