#!/usr/bin/env python3
"""Tokenizer throughput of the `tokenizers` library, as transformers 5 wraps
it, beside bench/tokenizer_bench.c: the same 2,400 prompts, one at a time,
padding="max_length" + truncation (CLIP 77, T5 the record's length).

Three rows per folder: the transformers tokenizer call the pipelines make,
the bare `tokenizers` Tokenizer.encode (one thread), and encode_batch (its
Rayon thread pool, RAYON_NUM_THREADS or all cores).

    /root/ditd-venv/bin/python bench/tokenizer_bench.py BUILD/tests/unit/tokenizers clip_hub t5_tf5
"""
import json
import os
import sys
import time


def main():
    root = sys.argv[1]
    folders = sys.argv[2:] or ["clip_hub", "t5_tf5"]
    reps = 5
    recs = [json.loads(l) for l in open(os.path.join(root, "expected.jsonl"), encoding="utf-8")][1:]
    recs = [r for r in recs if "t5_max_length" in r]  # not the long-prompt records
    from transformers import CLIPTokenizer, T5Tokenizer
    for name in folders:
        clip = name.startswith("clip")
        cls = CLIPTokenizer if clip else T5Tokenizer
        t0 = time.perf_counter()
        tok = cls.from_pretrained(os.path.join(root, name))
        load = time.perf_counter() - t0
        prompts = [r["prompt"] for r in recs]
        lens = [77 if clip else r["t5_max_length"] for r in recs]
        n = len(prompts)

        def best(fn):
            b = 1e9
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                b = min(b, time.perf_counter() - t0)
            return b

        def call():
            for p, ml in zip(prompts, lens):
                tok(p, padding="max_length", max_length=ml, truncation=True)
        dt = best(call)
        print(f"transformers {name:14s} load {load * 1e3:.0f} ms, {n} prompts: {n / dt:.0f} prompts/s, "
              f"{dt / n * 1e6:.2f} us/prompt")
        bt = tok.backend_tokenizer
        # the bare library, grouped by length so padding/truncation are set once per group
        groups = {}
        for p, ml in zip(prompts, lens):
            groups.setdefault(ml, []).append(p)

        def bare():
            for ml, ps in groups.items():
                bt.enable_truncation(ml)
                bt.enable_padding(length=ml, pad_id=tok.pad_token_id, pad_token=tok.pad_token)
                for p in ps:
                    bt.encode(p)
        dt = best(bare)
        print(f"tokenizers   {name:14s} encode, 1 thread: {n / dt:.0f} prompts/s, {dt / n * 1e6:.2f} us/prompt")

        def batch():
            for ml, ps in groups.items():
                bt.enable_truncation(ml)
                bt.enable_padding(length=ml, pad_id=tok.pad_token_id, pad_token=tok.pad_token)
                bt.encode_batch(ps)
        dt = best(batch)
        print(f"tokenizers   {name:14s} encode_batch ({os.environ.get('RAYON_NUM_THREADS', 'all')} threads): "
              f"{n / dt:.0f} prompts/s")


if __name__ == "__main__":
    main()
