#!/usr/bin/env python3
"""Makes the tokenizer fixtures (tests/fixtures/tokenizers/) and the reference
ids that tests/unit/test_tokenizer_*.c compare against.

1. Vocabularies, offline from PyPI: the sdist of stable-diffusion-cpp-python
   embeds OpenAI CLIP's BPE merges and google/t5-v1_1's tokenizer.json
   (vendor/stable-diffusion.cpp/src/tokenizers/vocab/clip_t5.hpp); the
   open-clip-torch wheel ships the same merges as bpe_simple_vocab_16e6.txt.gz,
   which we check they equal. Written gzipped (mtime 0) as
   clip_merges.txt.gz and t5_tokenizer.json.gz.
2. tests/fixtures/tokenizers/unpack.py builds the hub-style folders; this
   script loads them with transformers 5 and saves them again, which is what
   current transformers writes (tokenizer.json + tokenizer_config.json); the
   vocabulary is stripped from those and kept as skel/<name>/.
3. A seeded set of prompts (ASCII, accents, decomposed accents, CJK, Hangul
   jamo, emoji, full-width forms, control characters, whitespace runs, "!"
   cases, literal special tokens, empty strings, prompts far past the limit,
   random code points), each encoded by every folder the way the Diffusers
   pipelines call the tokenizers: padding="max_length", truncation=True,
   max_length 77 for CLIP, max_sequence_length for T5.
   -> expected.jsonl.gz: one header line, then one line per prompt.

Run with the venv that has transformers 5 (tools/requirements.txt):
    /root/ditd-venv/bin/python tools/make_tokenizer_fixtures.py [--src DIR]
--src: a folder that already holds the downloaded sdist and wheel.
"""
import argparse
import glob
import gzip
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unicodedata
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
sys.path.insert(0, FIX)
import unpack  # noqa: E402

CLIP_FOLDERS = ["clip_hub", "clip_pad_excl", "clip_tf5"]
T5_FOLDERS = ["t5_hub", "t5_spm", "t5_tf5"]
N_PROMPTS = 2400


def gz_write(path, data):
    with open(path, "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as g:
            g.write(data)


def fetch_vocab(src):
    if src is None:
        src = tempfile.mkdtemp(prefix="tokfix-")
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", src]
        subprocess.run(pip + ["--no-binary", ":all:", "stable-diffusion-cpp-python"], check=True)
        subprocess.run(pip + ["--only-binary", ":all:", "open-clip-torch"], check=True)
    sdist = sorted(glob.glob(os.path.join(src, "stable_diffusion_cpp_python-*.tar.gz")))[-1]
    wheel = sorted(glob.glob(os.path.join(src, "open_clip_torch-*.whl")))[-1]
    with tarfile.open(sdist) as tf:
        m = [n for n in tf.getnames() if n.endswith("src/tokenizers/vocab/clip_t5.hpp")][0]
        hpp = tf.extractfile(m).read().decode("ascii")
    arrays = {}
    for name in ("clip_merges_utf8_c_str", "t5_tokenizer_json_str"):
        i = hpp.index(name)
        j = hpp.index("{", i)
        k = hpp.index("}", j)
        arrays[name] = bytes(int(x, 16) for x in re.findall(r"0x([0-9a-fA-F]+)", hpp[j:k]))
    with zipfile.ZipFile(wheel) as z:
        oc = gzip.decompress(z.read("open_clip/bpe_simple_vocab_16e6.txt.gz")).decode("utf-8")
    merges = arrays["clip_merges_utf8_c_str"].decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    oc_merges = oc.split("\n")[1:49152 - 256 - 2 + 1]
    assert merges == oc_merges, "the sdist's CLIP merges differ from open_clip's"
    print(f"vocab: {os.path.basename(sdist)} (CLIP merges == open_clip's), {os.path.basename(wheel)}")
    gz_write(os.path.join(FIX, "clip_merges.txt.gz"), arrays["clip_merges_utf8_c_str"])
    gz_write(os.path.join(FIX, "t5_tokenizer.json.gz"), arrays["t5_tokenizer_json_str"])


def make_skeletons(tmp):
    from transformers import CLIPTokenizer, T5Tokenizer
    for src, dst, cls in (("clip_hub", "clip_tf5", CLIPTokenizer), ("t5_hub", "t5_tf5", T5Tokenizer)):
        t = cls.from_pretrained(os.path.join(tmp, src))
        out = os.path.join(tmp, "saved_" + dst)
        t.save_pretrained(out)
        skel = os.path.join(FIX, "skel", dst)
        shutil.rmtree(skel, ignore_errors=True)
        os.makedirs(skel)
        for fn in sorted(os.listdir(out)):
            obj = json.load(open(os.path.join(out, fn), encoding="utf-8"))
            if fn == "tokenizer.json":
                obj["model"]["vocab"] = [] if cls is T5Tokenizer else {}
                if "merges" in obj["model"]:
                    obj["model"]["merges"] = []
                norms = obj["normalizer"]["normalizers"] if obj["normalizer"]["type"] == "Sequence" \
                    else [obj["normalizer"]]
                for n in norms:
                    if n["type"] == "Precompiled":
                        n["precompiled_charsmap"] = ""
            elif fn not in ("tokenizer_config.json", "special_tokens_map.json"):
                continue
            unpack.wjson(os.path.join(skel, fn), obj)
        print(f"skel/{dst}: {sorted(os.listdir(skel))}")


# ---------------------------------------------------------------- prompts
WORDS = ("a photo of an astronaut riding horse on mars cat dog sitting the beach sunset "
         "portrait woman man old young city night neon lights cyberpunk forest river "
         "mountain snow painting by van gogh oil canvas watercolor highly detailed 4k 8k "
         "trending artstation octane render unreal engine cinematic lighting bokeh "
         "close-up wide-angle lens 35mm film grain vintage steampunk robot dragon castle "
         "fantasy illustration anime style studio ghibli minimalist logo vector flat "
         "colorful vibrant dark moody rainy street reflections coffee cup table book "
         "library glowing magic crystal underwater coral reef fish whale space nebula "
         "galaxy stars planet moon sun clouds sky blue red green yellow purple golden hour "
         "don't it's I'm you're we've they'll she'd JOHN'S BOB'LL x-ray e-mail U.S.A. "
         "mr. dr. 3.14 1,000,000 42 2024 #hashtag @user http://example.com/a?b=c&d=e "
         "foo_bar camelCase UPPER lower MiXeD").split()
ACCENTED = ("café naïve résumé Ångström Zürich São Paulo Kraków façade jalapeño coöperate "
            "straße Æsir Øresund İstanbul ılık ΣΊΣΥΦΟΣ Οδυσσεύς Москва Україна ĳssel ǅemal "
            "ﬁnance ﬀ Ⅻ ½ ² ℃ ™ ｶﾀｶﾅ").split()
DECOMPOSED = ["cafe\u0301", "nai\u0308ve", "A\u030angstro\u0308m", "e\u0301\u0301", "n\u0303",
              "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af", "o\u0308\u0304",
              "\u0041\u030a", "\u212b", "\u2126", "\u0958", "\u30ab\u3099", "\uac00\u11a8"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "1️⃣", "❤️", "☺︎", "🏳️‍🌈", "🧑🏿‍🚀", "🐱", "🔥🔥🔥",
         "✨", "🙏🏻", "👩‍💻", "🤖", "😂😂", "⚡️", "🌊", "🍕"]
FULLWIDTH = ["ＡＢＣ", "ｈｅｌｌｏ", "１２３", "！？", "（ｔｅｓｔ）", "＃１", "ｶﾞｷﾞ", "￥１００", "～", "＂ｑ＂"]
CONTROL = ["\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x7f", "\x80", "\x85", "\x9f",
           "\u200b", "\u200c", "\u200d", "\u200e", "\u202e", "\u2060", "\ufeff", "\u00ad", "\ufffd",
           "\ufff9", "\U000e0001", "\U000f0000"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u3000", "\u00a0", "\u2028", "\u2029", "\x1c", "\x1d",
          "\x1e", "\x1f", "\u2003", "\u202f", "\u205f", "\u1680", "\x85", " \t \n ", "\u180e"]
SPECIAL = ["<|endoftext|>", "<|startoftext|>", "<|ENDOFTEXT|>", "<|StartOfText|>", "<|endof", "|>",
           "</s>", "<pad>", "<unk>", "<extra_id_0>", "<extra_id_99>", "<extra_id_100>", "<s>",
           "< / s >", "<|endoftext|><|endoftext|>", "x<|startoftext|>y", "</w>", "▁", "▁▁x"]
EXCL = ["!", "!!", "!!!", "hello!", "wow!!!", "! ! !", "!a!", "a !", "!\n!", "！", "¡hola!",
        "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"]
CJK_RANGES = [(0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3),
              (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0xFF61, 0xFF9F)]  # assigned in Unicode 15


def rand_cjk(rng, n):
    out = []
    for _ in range(n):
        a, b = rng.choice(CJK_RANGES)
        out.append(chr(rng.randint(a, b)))
    return "".join(out)


# Code points that Debian 12's utf8proc (Unicode 15.0) calls unassigned but
# tokenizers 0.23 (Unicode 16 tables in its regex engine and Rust's char)
# may not: left out of the random prompts (docs/text.md, "Unicode version").
# Fixed unassigned code points (unassigned in 16.0 too) are in FIXED_CN.
try:
    import ctypes
    _u8p = ctypes.CDLL("libutf8proc.so.2")
except OSError:
    sys.exit("make_tokenizer_fixtures: needs libutf8proc2 (deploy/install-deps.sh)")


def assigned_u15(c):
    return _u8p.utf8proc_category(c) != 0


FIXED_CN = ["\u0378", "\uffff", "\U0001ffff", "\U0010ffff", "\u05ff", "\U000e0080"]


def rand_codepoints(rng, n):
    out = []
    while len(out) < n:
        c = rng.choice([rng.randint(0x20, 0x2FF), rng.randint(0x300, 0x36F), rng.randint(0x370, 0x1FFF),
                        rng.randint(0x2000, 0x2BFF), rng.randint(0x2E80, 0xFFFD),
                        rng.randint(0x10000, 0x1FAFF), rng.randint(0, 0x10FFFF)])
        if 0xD800 <= c <= 0xDFFF:
            continue
        if not assigned_u15(c):
            if rng.random() < 0.05:
                out.append(rng.choice(FIXED_CN))
            continue
        # tokenizers' NFC tables are older than Unicode 12: a combining mark
        # assigned since may be reordered differently (docs/text.md); keep
        # the combining marks Unicode 3.2 already had.
        if unicodedata.combining(chr(c)) and unicodedata.ucd_3_2_0.category(chr(c)) == "Cn":
            continue
        out.append(chr(c))
    return "".join(out)


def word_prompt(rng, n):
    ws = [rng.choice(WORDS) for _ in range(n)]
    ws = [w.upper() if rng.random() < 0.1 else (w.capitalize() if rng.random() < 0.1 else w) for w in ws]
    seps = [rng.choice([" ", " ", " ", ", ", ". ", " - ", "; ", " (", ") "]) for _ in range(n)]
    return "".join(w + s for w, s in zip(ws, seps)).strip()


def mixed_prompt(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        k = rng.randint(0, 11)
        if k <= 2:
            parts.append(word_prompt(rng, rng.randint(1, 6)))
        elif k == 3:
            parts.append(rng.choice(ACCENTED))
        elif k == 4:
            parts.append(rng.choice(DECOMPOSED))
        elif k == 5:
            parts.append(rand_cjk(rng, rng.randint(1, 8)))
        elif k == 6:
            parts.append(rng.choice(EMOJI))
        elif k == 7:
            parts.append(rng.choice(FULLWIDTH))
        elif k == 8:
            parts.append(rng.choice(CONTROL))
        elif k == 9:
            parts.append(rng.choice(SPECIAL))
        elif k == 10:
            parts.append(rng.choice(EXCL))
        else:
            parts.append(rand_codepoints(rng, rng.randint(1, 6)))
        parts.append(rng.choice(SPACES) if rng.random() < 0.7 else "")
    return "".join(parts)


def prompts(n):
    rng = random.Random(20261201)
    out = ["", " ", "\t\n", "!", "a", "A photo of a cat", "a photo of a cat!", "<|endoftext|>", "</s>",
           "it's", "IT'S", "'s", "''s", "x'll", "x'LL", "'\u017f", "x'\u017f", "\u0130stanbul", "\u212a",
           "ǅ", "ΣΑΣ", "ǰ", "ﬃ", "\u0345", "1234567890", "٣٤٥", "①②③", "Ⅳ", "x²", "𝟙𝟚"]
    out += EXCL + SPECIAL + CONTROL + SPACES + EMOJI + FULLWIDTH + DECOMPOSED + ACCENTED
    while len(out) < n:
        r = rng.random()
        if r < 0.25:
            out.append(word_prompt(rng, rng.randint(1, 40)))
        elif r < 0.80:
            out.append(mixed_prompt(rng))
        elif r < 0.88:
            out.append(word_prompt(rng, rng.randint(80, 400)))  # far past 77 tokens
        elif r < 0.93:
            out.append(" ".join(mixed_prompt(rng) for _ in range(rng.randint(8, 30))))
        elif r < 0.97:
            out.append(rand_codepoints(rng, rng.randint(1, 40)))
        else:
            out.append(rng.choice(SPACES) * rng.randint(1, 50) + word_prompt(rng, 3)
                       + rng.choice(SPACES) * rng.randint(1, 50))
    return out[:n]


LONG_MAX_LENGTH = 4096
N_LONG = 120


def long_prompts(ps):
    """Prompts past 1 KB, encoded at max_length 4096 so that ditd's chunked
    normalization (cut before an ASCII space every ~1 KB) is crossed many
    times: 80 of the long generated prompts, and 40 made to put awkward
    things at the spaces (a Prepend before a space, marks after one, CR LF,
    ZWJ, regional indicators, special tokens, runs of mixed whitespace)."""
    rng = random.Random(4096)
    out = [p for p in ps if len(p.encode("utf-8")) > 1100][:80]
    tricky = ["\u0600 ", " \u0301", "\r\n", "\u200d ", "\U0001f1eb \U0001f1f7", "\u3000 ", " <|endoftext|> ",
              " </s> ", "\u0915\u094d ", " \u200d", "e \u0301", "\u0e40 ", " \u3099", "\x85 ", "  \t\n  "]
    while len(out) < N_LONG:
        words = []
        while sum(len(w) + 1 for w in words) < rng.randint(1500, 4000):
            r = rng.random()
            words.append(rng.choice(tricky) if r < 0.3 else (mixed_prompt(rng)[:40] if r < 0.5
                         else rng.choice(WORDS)))
        out.append(" ".join(words))
    return out


def t5_max_length(rng):
    return rng.choice([77, 77, 128, 128, 256, 512])


def reference(tmp, ps):
    from transformers import CLIPTokenizer, T5Tokenizer
    toks = {}
    for f in CLIP_FOLDERS:
        toks[f] = CLIPTokenizer.from_pretrained(os.path.join(tmp, f))
    for f in T5_FOLDERS:
        toks[f] = T5Tokenizer.from_pretrained(os.path.join(tmp, f))
    rng = random.Random(7)
    header = {"folders": {}, "count": len(ps),
              "reference": "transformers " + __import__("transformers").__version__
              + ", tokenizers " + __import__("tokenizers").__version__}
    lines = []
    for f, t in toks.items():
        header["folders"][f] = {"kind": "clip" if f.startswith("clip") else "t5",
                                "pad_id": t.pad_token_id}
    for p in ps:
        L = t5_max_length(rng)
        rec = {"prompt": p, "t5_max_length": L, "ids": {}}
        for f, t in toks.items():
            ml = 77 if f.startswith("clip") else L
            # as Diffusers' FluxPipeline / StableDiffusion3Pipeline call them
            enc = t(p, padding="max_length", max_length=ml, truncation=True,
                    return_length=False, return_overflowing_tokens=False)
            ids, mask = enc.input_ids, enc.attention_mask
            n = sum(mask)
            assert len(ids) == ml and mask == [1] * n + [0] * (ml - n), (f, p)
            assert all(i == t.pad_token_id for i in ids[n:]), (f, p)
            rec["ids"][f] = ids[:n]
        lines.append(json.dumps(rec, ensure_ascii=False))
    for p in long_prompts(ps):
        rec = {"prompt": p, "long_max_length": LONG_MAX_LENGTH, "long_ids": {}}
        for f in ("clip_hub", "t5_hub"):
            t = toks[f]
            enc = t(p, padding="max_length", max_length=LONG_MAX_LENGTH, truncation=True)
            n = sum(enc.attention_mask)
            assert all(i == t.pad_token_id for i in enc.input_ids[n:]), (f, p)
            rec["long_ids"][f] = enc.input_ids[:n]
        lines.append(json.dumps(rec, ensure_ascii=False))
    header["long_count"] = N_LONG
    # transformers 4.x's T5TokenizerFast used tokenizer.json as written
    # (Precompiled + Replace(" {2,}") + Metaspace); count where it differs.
    from tokenizers import Tokenizer
    old = Tokenizer.from_file(os.path.join(tmp, "t5_hub", "tokenizer.json"))
    diff = sum(old.encode(p).ids != json.loads(l)["ids"]["t5_hub"] for p, l in zip(ps, lines[:len(ps)])
               if len(json.loads(l)["ids"]["t5_hub"]) < json.loads(l)["t5_max_length"])
    header["t5_tokenizer_json_literal_differs"] = diff
    print(f"T5: the literal tokenizer.json pipeline (transformers 4.x) differs on {diff} prompts")
    return header, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", help="folder holding the sdist and wheel already")
    ap.add_argument("--skip-vocab", action="store_true", help="keep the committed vocab files")
    a = ap.parse_args()
    if not a.skip_vocab:
        fetch_vocab(a.src)
    tmp = tempfile.mkdtemp(prefix="tokfold-")
    try:
        unpack.main(tmp)
        make_skeletons(tmp)
        shutil.rmtree(tmp)
        unpack.main(tmp)
        ps = prompts(N_PROMPTS)
        header, lines = reference(tmp, ps)
        data = (json.dumps(header) + "\n" + "\n".join(lines) + "\n").encode("utf-8")
        gz_write(os.path.join(FIX, "expected.jsonl.gz"), data)
        print(f"expected.jsonl.gz: {len(ps)} prompts x {len(header['folders'])} folders, "
              f"{os.path.getsize(os.path.join(FIX, 'expected.jsonl.gz'))} bytes")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
