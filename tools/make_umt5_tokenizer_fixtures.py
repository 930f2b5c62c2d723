#!/usr/bin/env python3
"""Makes the UMT5 tokenizer fixtures (tests/fixtures/tokenizers/): the real
vocabulary and the ids, and WanPipeline's prompt_clean, that
tests/unit/test_tokenizer.c (mode umt5) compares against.

1. The vocabulary, offline from PyPI: the sdist of stable-diffusion-cpp-python
   embeds google/umt5-xxl's tokenizer.json
   (vendor/stable-diffusion.cpp/src/tokenizers/vocab/umt5.hpp,
   umt5_tokenizer_json_str): 256,300 pieces (256,000 + 300 <extra_id_N>; the
   encoder's vocab_size 256,384 pads the embedding), a Replace(" {2,}")
   normalizer and no precompiled charsmap. Written xz-compressed as
   umt5_tokenizer.json.xz (stdlib lzma; unpack.py builds umt5_hub/ from it).
2. Prompts: make_tokenizer_fixtures.prompts() (accents, decomposed forms,
   CJK, emoji, control characters, whitespace runs, special tokens, long
   prompts, random code points), HTML-escaped prompts (named references
   with and without ';', the longest-prefix rule, numeric references,
   html's replacement table, double escapes, malformed ones), Wan's
   default Chinese negative prompt; and 80 prompts of 1-4 KB at
   max_length 4096.
3. The reference, as WanPipeline calls it: T5Tokenizer.from_pretrained(umt5_hub)
   (transformers 5: what AutoTokenizer gives for tokenizer_class
   T5Tokenizer), padding="max_length", truncation=True, max_length 512 (and
   77 / 226 for some); prompt_clean from diffusers' pipeline_wan (without
   ftfy, which the tools venv does not have) and the ids of the cleaned
   prompt at 512. With --ftfy DIR (a folder holding the ftfy package, e.g.
   pip install --target DIR ftfy wcwidth), each record also says whether
   ftfy.fix_text leaves the prompt unchanged (then ditd equals Diffusers
   with ftfy installed too).
   -> expected_umt5.jsonl.gz: a header line, then one line per prompt.

    /root/ditd-venv/bin/python tools/make_umt5_tokenizer_fixtures.py [--src DIR] [--ftfy DIR]
"""
import argparse
import glob
import gzip
import json
import lzma
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
sys.path.insert(0, FIX)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import unpack  # noqa: E402
import make_tokenizer_fixtures as mtf  # noqa: E402

WAN_NEGATIVE = ("色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，"
                "低质量，JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，"
                "毁容的，形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走")
WAN_PROMPT = "A cat and a dog baking a cake together in a kitchen. The cat is carefully measuring flour, " \
             "while the dog is stirring the batter with a wooden spoon. The kitchen is cozy, with sunlight " \
             "streaming through the window."
ENTS = ["&amp;", "&amp", "&lt;", "&gt", "&quot;", "&apos;", "&nbsp;", "&nbsp", "&copy", "&copy;", "&notin;",
        "&notit;", "&notx", "&ampx;", "&AMP;", "&Amp;", "&eacute;", "&Eacute", "&hellip;", "&mdash;",
        "&NotNestedGreaterGreater;", "&nGt;", "&acE;", "&fjlig;", "&#39;", "&#039;", "&#x27;", "&#X41;",
        "&#65", "&#x1F600;", "&#128512;", "&#0;", "&#13;", "&#128;", "&#x80;", "&#150;", "&#159;", "&#x9d;",
        "&#xD800;", "&#55296;", "&#x110000;", "&#1114112;", "&#99999999999999999999;", "&#x1;", "&#11;",
        "&#xFFFE;", "&#xFFFF;", "&#x10FFFF;", "&#xFDD0;", "&#", "&#;", "&#x;", "&#xg;", "&", "& ", "&&amp;",
        "&;", "&#38;amp;", "&amp;amp;", "&amp;lt;", "&amp;#39;", "&amp;amp;amp;", "&lt;b&gt;bold&lt;/b&gt;",
        "&aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa;", "&ampaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa;",
        "&amp\t", "&lt\n", "&lté", "&lt日本", "&\u00e9;", "&nbsp;&nbsp;&nbsp;", "&#x3000;", "&#160;&#8203;",
        "&#x2028;", "&Tab;", "&NewLine;", "&#9;&#10;", "&ThinSpace;", "&MediumSpace;", "&zwnj;",
        "&ensp;&emsp;", "&#12288;"]


def fetch_vocab(src):
    if src is None:
        src = tempfile.mkdtemp(prefix="umt5fix-")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", src, "--no-binary", ":all:",
                        "stable-diffusion-cpp-python"], check=True)
    sdist = sorted(glob.glob(os.path.join(src, "stable_diffusion_cpp_python-*.tar.gz")))[-1]
    with tarfile.open(sdist) as tf:
        m = [n for n in tf.getnames() if n.endswith("src/tokenizers/vocab/umt5.hpp")][0]
        hpp = tf.extractfile(m).read().decode("ascii")
    i = hpp.index("umt5_tokenizer_json_str")
    j = hpp.index("{", i)
    k = hpp.index("}", j)
    data = bytes(int(x, 16) for x in re.findall(r"0x([0-9a-fA-F]+)", hpp[j:k]))
    tj = json.loads(data)
    assert len(tj["model"]["vocab"]) == 256300, len(tj["model"]["vocab"])
    with open(os.path.join(FIX, "umt5_tokenizer.json.xz"), "wb") as f:
        f.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    print(f"vocab: {os.path.basename(sdist)}: umt5 tokenizer.json, {len(data)} bytes")


def html_prompts(rng, n):
    out = list(ENTS) + [WAN_NEGATIVE, WAN_PROMPT, WAN_PROMPT.replace(" ", "  "), " \t" + WAN_PROMPT + "\n\n",
                        WAN_PROMPT.replace(",", " &amp; ").replace("'", "&#39;")]
    words = mtf.WORDS
    while len(out) < n:
        parts = []
        for _ in range(rng.randint(1, 10)):
            r = rng.random()
            if r < 0.35:
                parts.append(rng.choice(ENTS))
            elif r < 0.7:
                parts.append(rng.choice(words))
            elif r < 0.8:
                parts.append(rng.choice(mtf.SPACES))
            elif r < 0.9:
                parts.append(mtf.mixed_prompt(rng)[:30])
            else:
                parts.append(rng.choice(mtf.EMOJI + mtf.ACCENTED))
            parts.append(rng.choice(["", " ", "  ", "\t", "\u3000", "\n"]))
        out.append("".join(parts))
    return out


def ftfy_flags(ps, ftfy_dir):
    if not ftfy_dir:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(ps, f, ensure_ascii=False)
        name = f.name
    code = ("import json,sys,ftfy; ps=json.load(open(sys.argv[1],encoding='utf-8')); "
            "print(json.dumps([ftfy.fix_text(p) == p for p in ps]))")
    env = dict(os.environ, PYTHONPATH=ftfy_dir)
    r = subprocess.run([sys.executable, "-c", code, name], env=env, capture_output=True, text=True, check=True)
    os.unlink(name)
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", help="folder holding the sdist already")
    ap.add_argument("--skip-vocab", action="store_true", help="keep the committed umt5_tokenizer.json.xz")
    ap.add_argument("--ftfy", help="a folder with the ftfy package (pip install --target)")
    a = ap.parse_args()
    if not a.skip_vocab:
        fetch_vocab(a.src)
    tmp = tempfile.mkdtemp(prefix="umt5fold-")
    try:
        unpack.make_umt5_hub(os.path.join(tmp, "umt5_hub"))
        from transformers import T5Tokenizer
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean
        import diffusers.utils
        assert not diffusers.utils.is_ftfy_available(), "the reference is prompt_clean without ftfy"
        tok = T5Tokenizer.from_pretrained(os.path.join(tmp, "umt5_hub"))
        assert tok.unk_token_id == 3 and tok._tokenizer.model.__class__.__name__ == "Unigram"
        rng = random.Random(20261202)
        ps = mtf.prompts(2000) + html_prompts(rng, 600)
        longs = mtf.long_prompts(ps)[:80]
        flags = ftfy_flags(ps, a.ftfy)
        header = {"count": len(ps), "long_count": len(longs), "pad_id": tok.pad_token_id,
                  "ftfy": bool(flags), "reference": "transformers " + __import__("transformers").__version__
                  + ", tokenizers " + __import__("tokenizers").__version__ + ", diffusers "
                  + __import__("diffusers").__version__ + " prompt_clean (no ftfy)"}
        lines = []
        for i, p in enumerate(ps):
            ml = rng.choice([512, 512, 512, 226, 77])
            enc = tok(p, padding="max_length", max_length=ml, truncation=True, add_special_tokens=True,
                      return_attention_mask=True)
            n = sum(enc.attention_mask)
            assert enc.attention_mask == [1] * n + [0] * (ml - n) and all(t == 0 for t in enc.input_ids[n:])
            c = prompt_clean(p)
            ce = tok(c, padding="max_length", max_length=512, truncation=True, add_special_tokens=True,
                     return_attention_mask=True)
            cn = sum(ce.attention_mask)
            rec = {"prompt": p, "max_length": ml, "ids": enc.input_ids[:n], "clean": c,
                   "clean_ids": ce.input_ids[:cn]}
            if flags:
                rec["ftfy_same"] = flags[i]
            lines.append(json.dumps(rec, ensure_ascii=False))
        for p in longs:
            enc = tok(p, padding="max_length", max_length=4096, truncation=True)
            n = sum(enc.attention_mask)
            lines.append(json.dumps({"prompt": p, "max_length": 4096, "ids": enc.input_ids[:n]},
                                    ensure_ascii=False))
        data = (json.dumps(header) + "\n" + "\n".join(lines) + "\n").encode("utf-8")
        mtf.gz_write(os.path.join(FIX, "expected_umt5.jsonl.gz"), data)
        unk = sum(2 in json.loads(l)["ids"] for l in lines)
        print(f"expected_umt5.jsonl.gz: {len(ps)} + {len(longs)} prompts, {unk} with unknowns (id 2), "
              f"ftfy-invariant {sum(flags) if flags else '?'}, "
              f"{os.path.getsize(os.path.join(FIX, 'expected_umt5.jsonl.gz'))} bytes")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
