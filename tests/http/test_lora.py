#!/usr/bin/env python3
"""LoRA adapters in `ditd serve` (issue 26, docs/lora.md): a real daemon on
127.0.0.1 serving the tiny DiT (tests/fixtures/models/tiny-p2-c1-h6) with
two adapters of tests/fixtures/lora, one by --lora and one through
--lora-dir. Exit 0 pass, 1 fail, 77 skip.

usage: test_lora.py --ditd BUILD/ditd CASE
cases: lora (GET /v1/loras; images with adapters equal `ditd generate
       --lora` with the same seed, pixel for pixel; the base model unchanged
       before and after; requests with different adapters batched together
       each equal to their solo result; refusals naming the field; /metrics
       rows per adapter),
       lora_start (start-up refusals: a file for another model, a missing
       file, a bad --lora-dir),
       lora_mpi (mpirun: ulysses 2 and dp 2 with adapters, as one rank; tp 2 refused),
       lora_flux (the tiny FLUX pipeline: PEFT and kohya adapters, as
       `ditd generate`, batched together)
"""
import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http as th  # noqa: E402
from test_http import FIXTURES, Daemon, check  # noqa: E402

MODEL = os.path.join(FIXTURES, "models", "tiny-p2-c1-h6")
MODEL_ID = "tiny-p2-c1-h6"
LORA = os.path.join(FIXTURES, "lora")
D4 = os.path.join(LORA, "dit_r4_peft.safetensors")          # rank 4, every targetable linear
D8 = os.path.join(LORA, "dit_r8_some_downup.safetensors")   # rank 8 + alpha, some modules
FLUX4 = os.path.join(LORA, "flux_r4_peft.safetensors")      # another model's adapter
BASE = {"model": MODEL_ID, "class_label": 3, "n": 1, "seed": 5, "num_inference_steps": 4,
        "guidance_scale": 4.0, "sampler": "flow-euler", "response_format": "b64_json"}


def pixels(d, loras):
    """The request's image as 8-bit samples, and its PNG bytes."""
    body = dict(BASE, loras=loras) if loras is not None else dict(BASE)
    st, _, data = d.generate(body)
    assert st == 200, (st, data[:300])
    png = base64.b64decode(json.loads(data)["data"][0]["b64_json"])
    return th.png_pixels(png), png


def cli_pixels(ditd, tmp, loras, tag):
    """`ditd generate` with the same seed, steps, guidance and sampler."""
    out = os.path.join(tmp, f"{tag}.png")
    args = [ditd, "generate", "--model", MODEL, "--class", "3", "--seed", "5", "--steps", "4",
            "--guidance", "4", "--sampler", "flow-euler", "--threads", "1", "-q", "-o", out]
    for name, path, scale in loras:
        args += ["--lora", f"{name}={path}", "--lora-scale", f"{name}={scale}"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr
    return th.png_pixels(open(out, "rb").read())


def err_of(d, loras):
    st, _, data = d.generate(dict(BASE, loras=loras))
    e = json.loads(data).get("error", {}) if data else {}
    return st, e.get("param"), e.get("message", "")


def case_lora(ditd):
    tmp = tempfile.mkdtemp(prefix="ditd-lora-")
    ldir = os.path.join(tmp, "adapters")
    os.mkdir(ldir)
    shutil.copy(D8, os.path.join(ldir, "d8.safetensors"))
    open(os.path.join(ldir, "README.txt"), "w").write("not an adapter: ignored\n")
    # a batch window long enough that two requests sent together share a batch
    d = Daemon(ditd, "--lora", f"d4={D4}", "--lora-dir", ldir, "--max-loras-per-request", "2",
               "--max-batch", "4", "--batch-window-ms", "1500", model=MODEL)
    try:
        # GET /v1/loras
        st, _, data = d.request("GET", "/v1/loras")
        o = json.loads(data)
        by = {x["id"]: x for x in o.get("data", [])}
        check(st == 200 and th.validate(o, "LoraList") and list(by) == ["d4", "d8"]
              and o["max_loras_per_request"] == 2, "GET /v1/loras: d4 (--lora), d8 (--lora-dir)",
              (st, list(by)))
        check(by["d4"]["loaded"] and by["d4"]["format"] == "peft" and by["d4"]["rank"] == 4
              and by["d4"]["num_modules"] == len(by["d4"]["modules"]) == 29
              and by["d4"]["model"] == MODEL_ID and by["d4"]["bytes"] > 0,
              "d4: loaded, peft, rank 4, 29 modules", {k: by["d4"][k] for k in ("format", "rank", "num_modules")})
        check(by["d8"]["loaded"] and by["d8"]["rank"] == 8 and 0 < by["d8"]["num_modules"] < 29
              and all(m["rank"] == 8 for m in by["d8"]["modules"]),
              "d8: rank 8 on some modules only", {k: by["d8"][k] for k in ("rank", "num_modules")})

        # the base model, then adapters, then the base again
        base0, png0 = pixels(d, None)
        cases = [("d4 at 0.8", [{"name": "d4", "scale": 0.8}], [("d4", D4, 0.8)]),
                 ("d8 at scale 1 (default)", [{"name": "d8"}], [("d8", D8, 1)]),
                 ("d4 at 1 and d8 at -0.5", [{"name": "d4", "scale": 1}, {"name": "d8", "scale": -0.5}],
                  [("d4", D4, 1), ("d8", D8, -0.5)])]
        solo = {}
        n = 0
        for what, req, cli in cases:
            got, _ = pixels(d, req)
            want = cli_pixels(ditd, tmp, cli, f"cli{n}")
            diff = sum(1 for a, b in zip(got, want) if a != b)
            check(got == want, f"{what}: the image equals `ditd generate --lora` with the same seed, "
                  f"pixel for pixel ({len(got)} values, {diff} differ)")
            check(got != base0, f"{what}: the adapter changes the image")
            solo[what] = got
            n += 1
        check(n == 3, f"{n} adapter cases checked")
        got, _ = pixels(d, [{"name": "d4", "scale": 0}])
        check(got == base0, "d4 at scale 0: the base model's image")
        base1, png1 = pixels(d, None)
        check(base1 == base0 and png1 == png0, "no adapters after adapters: the same PNG bytes as "
              "before (the base weights unchanged)")
        check(base0 == cli_pixels(ditd, tmp, [], "cli_base"), "no adapters: equals `ditd generate`")

        # requests with different adapters (and none) sent together: one batch
        m0 = d.metrics()
        reqs = [cases[0], cases[1], ("no adapters", None, None)]
        out = [None] * len(reqs)

        def one(i):
            out[i] = pixels(d, reqs[i][1])[0]
        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        m1 = d.metrics()
        nb = m1[f'ditd_batch_size_count{{model="{MODEL_ID}"}}'] - m0[f'ditd_batch_size_count{{model="{MODEL_ID}"}}']
        ns = m1[f'ditd_batch_size_sum{{model="{MODEL_ID}"}}'] - m0[f'ditd_batch_size_sum{{model="{MODEL_ID}"}}']
        check(nb == 1 and ns == 3, f"three requests with different adapter sets ran as one batch "
              f"({int(nb)} batch(es), {int(ns)} samples)")
        for i, (what, _, _) in enumerate(reqs):
            want = solo.get(what, base0)
            diff = sum(1 for a, b in zip(out[i] or [], want) if a != b)
            check(out[i] == want, f"batched together, {what}: equals its solo result "
                  f"({diff} values differ)")

        # refusals, naming the field
        for what, loras, param, says in [
                ("an unknown name", [{"name": "nope"}], "loras[0].name", "'nope'"),
                ("an unknown name lists the adapters", [{"name": "nope"}], "loras[0].name", "'d4', 'd8'"),
                ("a scale over 10", [{"name": "d4", "scale": 11}], "loras[0].scale", "-10..10"),
                ("a scale under -10", [{"name": "d4", "scale": -10.5}], "loras[0].scale", "-10..10"),
                ("a scale as a string", [{"name": "d4", "scale": "1"}], "loras[0].scale", "-10..10"),
                ("three adapters (max 2)", [{"name": "d4"}, {"name": "d8"}, {"name": "d4"}], "loras",
                 "at most 2"),
                ("a name twice", [{"name": "d4"}, {"name": "d4"}], "loras[1].name", "twice"),
                ("not an array", {"name": "d4"}, "loras", "array"),
                ("an unknown field", [{"name": "d4", "weight": 1}], "loras[0].weight", "unknown field")]:
            st, p, msg = err_of(d, loras)
            check(st == 400 and p == param and says in msg, f"{what}: 400, param {param}",
                  (st, p, msg), says)

        # /metrics: images made carrying each adapter
        m = d.metrics()
        rows = {a: m.get(f'ditd_lora_rows_total{{model="{MODEL_ID}",adapter="{a}"}}') for a in ("d4", "d8")}
        # d4: 0.8, both, scale 0, batched 0.8; d8: alone, both, batched
        check(rows == {"d4": 4, "d8": 3} and m.get(f'ditd_lora_adapters{{model="{MODEL_ID}"}}') == 2,
              "metrics: rows per adapter (d4 4, d8 3), 2 adapters loaded", rows)
        st, _, data = d.request("GET", "/v1/loras")
        check({x["id"]: x["rows_served"] for x in json.loads(data)["data"]} == {"d4": 4, "d8": 3},
              "GET /v1/loras: rows_served")
    finally:
        rc = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(rc == 0, "exit 0", rc)


def serve_refused(ditd, *args, timeout=60):
    p = subprocess.run([ditd, "serve", "--model", MODEL, "--host", "127.0.0.1", "--port", "0",
                        "--threads", "1", *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def case_lora_start(ditd):
    tmp = tempfile.mkdtemp(prefix="ditd-lora-")
    try:
        rc, out = serve_refused(ditd, "--lora", f"f4={FLUX4}")
        check(rc != 0 and "f4=" + FLUX4 in out and "context_embedder" in out,
              "another model's adapter: the start fails naming the file and the tensor", (rc, out[-400:]))
        rc, out = serve_refused(ditd, "--lora", "x=/nonexistent/x.safetensors")
        check(rc == 2 and "/nonexistent/x.safetensors" in out, "a missing file: exit 2 naming it",
              (rc, out[-300:]))
        rc, out = serve_refused(ditd, "--lora", f"d4={D4}", "--lora", f"d4={D8}")
        check(rc == 2 and "d4 given twice" in out, "a name given twice: exit 2", (rc, out[-300:]))
        rc, out = serve_refused(ditd, "--lora", D4)
        check(rc == 2 and "NAME=PATH" in out, "--lora without NAME=: exit 2", (rc, out[-300:]))
        rc, out = serve_refused(ditd, "--lora-dir", os.path.join(tmp, "none"))
        check(rc == 2 and "--lora-dir" in out, "a missing --lora-dir: exit 2", (rc, out[-300:]))
        shutil.copy(D4, os.path.join(tmp, "bad name.safetensors"))
        rc, out = serve_refused(ditd, "--lora-dir", tmp)
        check(rc == 2 and "bad name" in out, "--lora-dir with a file stem that is no name: exit 2 "
              "naming it", (rc, out[-300:]))
        rc, out = serve_refused(ditd, "--max-loras-per-request", "9")
        check(rc == 2 and "--max-loras-per-request" in out, "--max-loras-per-request 9: exit 2",
              (rc, out[-300:]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def case_lora_mpi(ditd):
    """Under mpirun: every rank of a multi-rank replica loads the adapters
    (ulysses 2: the sequence is split, the term is token-wise; tp 2: A and B
    cut with their base weights), and two single-rank replicas (dp 2) each do; images as `ditd generate --lora` on
    one rank, to the 8-bit quantum (layouts promise latents within 1e-4)."""
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        return 77
    tmp = tempfile.mkdtemp(prefix="ditd-lora-")
    try:
        req = [{"name": "d4", "scale": 1}, {"name": "d8", "scale": -0.5}]
        want = cli_pixels(ditd, tmp, [("d4", D4, 1), ("d8", D8, -0.5)], "cli_two")
        base = cli_pixels(ditd, tmp, [], "cli_base")
        n = 0
        for what, flags in [("ulysses 2", ["--ulysses-degree", "2"]), ("dp 2", ["--dp", "2"]),
                            ("tp 2", ["--tp-degree", "2"])]:
            d = Daemon(ditd, "--lora", f"d4={D4}", "--lora", f"d8={D8}", *flags, mpi_np=3, model=MODEL)
            try:
                st, _, data = d.request("GET", "/v1/loras")
                check(st == 200 and [x["loaded"] for x in json.loads(data)["data"]] == [True, True],
                      f"{what}: both adapters loaded", data[:200])
                for k in range(2):  # dp 2: the two requests may land on either replica
                    got, _ = pixels(d, req)
                    worst = max(abs(a - b) for a, b in zip(got, want))
                    differ = sum(1 for a, b in zip(got, want) if a != b)
                    check(len(got) == len(want) and worst <= 1 and differ <= 2,
                          f"{what}, request {k}: d4 + d8 at -0.5 as one rank's `ditd generate` "
                          f"(worst {worst} level, {differ} values differ)")
                    n += 1
                got, _ = pixels(d, None)
                check(max(abs(a - b) for a, b in zip(got, base)) <= 1, f"{what}: no adapters: the base image")
            finally:
                rc = d.stop()
            check(rc == 0, f"{what}: exit 0", rc)
        check(n == 6, f"{n} layout images checked")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def case_lora_flux(ditd):
    """The tiny FLUX pipeline (FluxPipeline, the folder tests/golden
    assembles) with a PEFT and a kohya adapter: images equal `ditd generate
    --lora` pixel for pixel, and two requests with different adapters
    batched together each equal their solo result to the 8-bit quantum."""
    model = th.text_model(ditd)
    if not model:
        print("skip: no tiny FLUX folder (build tests/golden first)")
        return 77
    mid = os.path.basename(model)
    f4 = os.path.join(LORA, "flux_r4_peft.safetensors")
    f8k = os.path.join(LORA, "flux_r8_some_kohya.safetensors")
    body = {"model": mid, "prompt": "a red cube", "size": "64x64", "num_inference_steps": 3,
            "seed": 4, "max_sequence_length": 32, "guidance_scale": 3.5, "sampler": "flow-euler",
            "response_format": "b64_json"}
    tmp = tempfile.mkdtemp(prefix="ditd-lora-")

    def served(d, loras):
        st, _, data = d.generate(dict(body, loras=loras) if loras else body)
        assert st == 200, (st, data[:300])
        return th.png_pixels(base64.b64decode(json.loads(data)["data"][0]["b64_json"]))

    def cli(loras, tag):
        out = os.path.join(tmp, f"{tag}.png")
        args = [ditd, "generate", "--model", model, "--prompt", "a red cube", "--size", "64x64",
                "--steps", "3", "--seed", "4", "--max-sequence-length", "32", "--guidance", "3.5",
                "--sampler", "flow-euler", "--threads", "1", "-q", "-o", out]
        for name, path, scale in loras:
            args += ["--lora", f"{name}={path}", "--lora-scale", f"{name}={scale}"]
        p = subprocess.run(args, capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert p.returncode == 0, p.stderr
        return th.png_pixels(open(out, "rb").read())

    d = Daemon(ditd, "--lora", f"f4={f4}", "--lora", f"f8k={f8k}", "--max-batch", "2",
               "--batch-window-ms", "1500", model=model)
    try:
        st, _, data = d.request("GET", "/v1/loras")
        fm = {x["id"]: x["format"] for x in json.loads(data)["data"]}
        check(fm == {"f4": "peft", "f8k": "kohya"}, "GET /v1/loras: f4 peft, f8k kohya", fm)
        base = served(d, None)
        solo = {}
        for what, req, cl in [("f4", [{"name": "f4"}], [("f4", f4, 1)]),
                              ("f8k at 0.5", [{"name": "f8k", "scale": 0.5}], [("f8k", f8k, 0.5)])]:
            got, want = served(d, req), cli(cl, what.replace(" ", "_"))
            diff = sum(1 for a, b in zip(got, want) if a != b)
            check(got == want and got != base, f"FLUX, {what}: equals `ditd generate --lora`, pixel "
                  f"for pixel ({len(got)} values, {diff} differ), and differs from the base")
            solo[what] = got
        check(served(d, None) == base, "FLUX: no adapters after adapters: the base image")
        m0 = d.metrics()
        out = {}
        reqs = [("f4", [{"name": "f4"}]), ("f8k at 0.5", [{"name": "f8k", "scale": 0.5}])]
        ts = [threading.Thread(target=lambda w=w, r=r: out.__setitem__(w, served(d, r))) for w, r in reqs]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        m1 = d.metrics()
        key = f'ditd_batch_size_count{{model="{mid}"}}'
        check(m1[key] - m0[key] == 1, f"FLUX: the two requests ran as one batch ({int(m1[key] - m0[key])})")
        # Not bit for bit on FLUX (docs/lora.md, not done): a sample with f4
        # batched with another request lands one 8-bit level away from its
        # solo image in some values (measured: 629 of 12288), although the
        # base model batched, and `ditd generate -n 2 --lora f4`, are bit
        # for bit; f8k's sample is exact. Checked here to the 8-bit quantum.
        for w, _ in reqs:
            got = out.get(w) or []
            worst = max((abs(a - b) for a, b in zip(got, solo[w])), default=None)
            diff = sum(1 for a, b in zip(got, solo[w]) if a != b)
            check(len(got) == len(solo[w]) and worst is not None and worst <= 1,
                  f"FLUX batched together, {w}: its solo result to the 8-bit quantum (worst {worst} "
                  f"level, {diff} of {len(got)} values differ)")
    finally:
        rc = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(rc == 0, "exit 0", rc)


CASES = {"lora": case_lora, "lora_start": case_lora_start, "lora_mpi": case_lora_mpi,
         "lora_flux": case_lora_flux}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ditd", required=True)
    ap.add_argument("case", choices=sorted(CASES))
    a = ap.parse_args()
    t0 = time.time()
    rc = CASES[a.case](os.path.abspath(a.ditd))
    print(f"{a.case}: {time.time() - t0:.1f} s, {len(th.failures)} failure(s)")
    if rc == 77:
        return 77
    return 1 if th.failures else 0


if __name__ == "__main__":
    sys.exit(main())
