#!/usr/bin/env python3
"""Writes the hand-made seeds of the tokenizer fuzz corpora (stdlib only):
corpus/tok_clip/, corpus/tok_t5/ (byte 0: max_length pick, byte 1: folder,
then the text) and corpus/tok_files/ (byte 0: which file, then its bytes).
Leaves found-* and crash-* files alone. Each seed stays under 4 KB."""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "tokenizers"))
import unpack  # noqa: E402  (its ModelProto writer)

TEXTS = [
    b"", b"a photo of a cat", b"A Photo Of A CAT!!!", b"it's I'LL we've 'd", b"<|startoftext|>x<|endoftext|>",
    b"<|ENDOFTEXT|> <|StartOfText|>", "caf\u00e9 cafe\u0301 \u0130stanbul \u03a3\u0391\u03a3".encode(),
    "\u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4 \u1100\u1161\u11a8".encode(), "\U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f44d\U0001f3fd \U0001f1eb\U0001f1f7".encode(),
    "\uff21\uff22\uff23\uff11\uff12\uff13\uff01".encode(), b"\x00\x01\x1b\x7f \x1c\x1d\x1e\x1f", "\u3000\u00a0\u2028\u2029\x85\t\r\n".encode(),
    b"! ! !!", "</s><pad><unk><extra_id_0> \u2581\u2581x".encode(), b"a" * 3000, b"ab " * 1000,
    b"\xff\xfe", b"a\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xe2\x96",
    "\u035b\u0eba`\u0301\u0301e".encode(), "\ufb03 \u2126 \u212b \u00bd \u2460".encode(),
]


def write(dirname, name, data):
    d = os.path.join(HERE, "corpus", dirname)
    os.makedirs(d, exist_ok=True)
    assert len(data) < 4096, (dirname, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    for k, t in enumerate(TEXTS):
        for target in ("tok_clip", "tok_t5"):
            write(target, f"seed-{k:02d}", bytes([k % 8, k % 2]) + t)
    # tok_files
    clip_json = {"model": {"type": "BPE", "end_of_word_suffix": "</w>", "continuing_subword_prefix": "",
                           "vocab": {"a": 0, "b": 1, "a</w>": 2, "b</w>": 3, "ab</w>": 4,
                                     "<|startoftext|>": 5, "<|endoftext|>": 6},
                           "merges": ["a b</w>"]},
                 "added_tokens": [{"id": 5, "content": "<|startoftext|>", "normalized": True},
                                  {"id": 6, "content": "<|endoftext|>", "normalized": False}]}
    uni = {"model": {"type": "Unigram", "unk_id": 2,
                     "vocab": [["<pad>", 0], ["</s>", 0], ["<unk>", 0], ["\u2581", -2], ["\u2581a", -3], ["b", -4]]},
           "normalizer": {"type": "Precompiled", "precompiled_charsmap": ""}}
    write("tok_files", "seed-clip-json", b"\x00" + json.dumps(clip_json).encode())
    write("tok_files", "seed-uni-json", b"\x00" + json.dumps(uni).encode())
    write("tok_files", "seed-bad-json", b"\x00{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": 3}}")
    write("tok_files", "seed-bad-merge", b"\x00" + json.dumps(dict(clip_json, model=dict(clip_json["model"], merges=["a c"]))).encode())
    write("tok_files", "seed-trunc-json", b"\x00{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", ")
    tj = {"model": {"vocab": [["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0], ["\u2581", -2.0], ["\u2581a", -3.0],
                              ["b", -4.0]]},
          "added_tokens": [{"content": "<pad>"}, {"content": "</s>"}],
          "normalizer": {"type": "Sequence", "normalizers": [{"type": "Precompiled",
                                                               "precompiled_charsmap": "CAAAAAAAAAAAAAAA"}]}}
    spm = unpack.spiece_model(tj)
    write("tok_files", "seed-spiece", b"\x01" + spm)
    write("tok_files", "seed-spiece-trunc", b"\x01" + spm[: len(spm) // 2])
    bpe_spm = spm + bytes([0x12, 0x02, 0x18, 0x02])  # trainer_spec model_type BPE
    write("tok_files", "seed-spiece-bpe", b"\x01" + bpe_spm)
    write("tok_files", "seed-spiece-garbage", b"\x01" + bytes(range(256)) * 2)
    write("tok_files", "seed-vocab", b"\x02" + json.dumps({"a": 0, "b": 1, "a</w>": 2, "b</w>": 3, "ab</w>": 4,
                                                              "ab": 5, "<|startoftext|>": 6, "<|endoftext|>": 7}).encode())
    write("tok_files", "seed-vocab-neg", b"\x02{\"a\": -1}")
    write("tok_files", "seed-merges", b"\x03#version: 0.2\na b</w>\na b\n")
    write("tok_files", "seed-merges-bad", b"\x03a\nb c d\n\xff\xfe\n")
    write("tok_files", "seed-config-t5", b"\x04" + json.dumps({"tokenizer_class": "T5TokenizerFast",
                                                                  "extra_ids": 0, "model_max_length": 512}).encode())
    write("tok_files", "seed-config-bad", b"\x04{\"tokenizer_class\": 5, \"added_tokens_decoder\": {\"x\": 1}}")
    write("tok_files", "seed-config-added", b"\x04" + json.dumps({"added_tokens_decoder": {
        "3": {"content": "\u2581", "normalized": True}, "9": {"content": "zz", "normalized": False}}}).encode())
    write("tok_files", "seed-stm", b"\x05" + json.dumps({"pad_token": "!", "bos_token": {"content": "<|startoftext|>",
                                                                                          "normalized": True}}).encode())
    write("tok_files", "seed-stm-missing", b"\x05" + json.dumps({"pad_token": "<nothing>"}).encode())


if __name__ == "__main__":
    main()
