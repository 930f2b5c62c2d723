#!/usr/bin/env python3
"""POST /v1/images/edits on a FluxKontextPipeline folder (issue 23): the tiny FLUX.1-dev folder the
build assembles, under a model_index.json naming FluxKontextPipeline (a temporary folder linking
its components; its numerics are checked against Diffusers' FluxKontextPipeline by
test_flux_kontext and test_generate_kontext). Exit 0 pass, 1 fail, 77 skip.

usage: test_kontext.py --ditd BUILD/ditd kontext
The case: the reference of tests/fixtures/flux_kontext's auto_resize_preferred case (880x1184, a
preferred resolution, so nothing is resampled; and a 48x32 one, resized), the output 32x32 at max_area 1024: curl's form and
the official `openai` client's `images.edit` (one image) each equal `ditd generate --image` for the
same seed, pixel for pixel; JSON with a data URL and n 2 (both images from one reference);
/v1/models' edits say the reference mode; refusals naming their field (a mask, strength, a
reference not at its preferred resolution, max_area out of range).
"""
import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http as th  # noqa: E402
from test_http import Daemon, check  # noqa: E402
from test_edits import b64_pixels, curl_form, png, refused  # noqa: E402

PROMPT = "a cozy cabin, 雪, 🌲"
SEED, STEPS, AREA = 26, 2, 1024
FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                   "flux_kontext", "expected")


def kontext_folder(dev, tmp):
    d = os.path.join(tmp, "kontext")
    os.mkdir(d)
    for part in os.listdir(dev):
        if part != "model_index.json":
            os.symlink(os.path.join(dev, part), os.path.join(d, part))
    mi = json.load(open(os.path.join(dev, "model_index.json")))
    mi["_class_name"] = "FluxKontextPipeline"
    json.dump(mi, open(os.path.join(d, "model_index.json"), "w"))
    return d


def case_kontext(ditd):
    dev = th.text_model(ditd)
    if not dev:
        print("skip: no FLUX folder (the build's tests/golden/flux_pipeline/dev)")
        return 77
    import openai
    tmp = tempfile.mkdtemp(prefix="ditd-kontext-")
    model = kontext_folder(os.path.abspath(dev), tmp)
    ref = os.path.join(FIX, "auto_resize_preferred_ref.png")
    small = os.path.join(tmp, "small.png")
    open(small, "wb").write(png(48, 32, [[(7 * x + y) % 256 for x in range(48 * 3)] for y in range(32)], 2))
    outs = os.path.join(tmp, "gen.png")
    r = subprocess.run([ditd, "generate", "--model", model, "--prompt", PROMPT, "--seed", str(SEED),
                        "--steps", str(STEPS), "--max-area", str(AREA), "--size", "32x32", "--image", ref,
                        "-n", "2", "--dtype", "f32", "--threads", "1", "-q", "-o", outs],
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, "ditd generate --image on the Kontext folder", r.stderr[-400:])
    if r.returncode:
        return 0
    want = [th.png_pixels(open(os.path.join(tmp, f"gen-{i}.png"), "rb").read()) for i in range(2)]
    # a second reference at the same preferred resolution: Diffusers' image list of two
    ref2 = os.path.join(tmp, "ref2.png")
    open(ref2, "wb").write(png(880, 1184, [[(3 * x + 5 * y) % 256 for x in range(880 * 3)] for y in range(1184)], 2))
    outs2 = os.path.join(tmp, "gen2.png")
    r = subprocess.run([ditd, "generate", "--model", model, "--prompt", PROMPT, "--seed", str(SEED),
                        "--steps", str(STEPS), "--max-area", str(AREA), "--size", "32x32", "--image", ref,
                        "--image", ref2, "-n", "2", "--dtype", "f32", "--threads", "1", "-q", "-o", outs2],
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, "ditd generate --image A --image B on the Kontext folder", r.stderr[-400:])
    want2 = [th.png_pixels(open(os.path.join(tmp, f"gen2-{i}.png"), "rb").read()) for i in range(2)] \
        if r.returncode == 0 else None
    d = Daemon(ditd, "--dtype", "f32", "--threads", "1", model=model)
    mid = os.path.basename(model)
    checked = 0
    try:
        st, _, data = d.request("GET", "/v1/models")
        ed = (json.loads(data)["data"][0].get("edits") or {}) if st == 200 else {}
        check(st == 200 and th.validate(json.loads(data), "ModelList") and ed.get("mode") == "reference" and
              ed.get("reference_pipeline") == "FluxKontextPipeline" and ed.get("mask") is False and
              ed.get("max_area") == 1048576 and ed.get("auto_resize") is True and ed.get("img2img") is None,
              "/v1/models: the Kontext folder takes reference edits", ed)
        checked += 1
        fields = [f"prompt={PROMPT}", f"seed={SEED}", f"num_inference_steps={STEPS}", f"max_area={AREA}",
                  "size=32x32"]
        st, body = curl_form(d, f"image=@{ref};type=image/png", *fields)
        out = json.loads(body) if st == 200 else {}
        check(st == 200 and out.get("size") == "32x32" and b64_pixels(out["data"][0]["b64_json"]) == want[0],
              "curl -F image=@ref: equals ditd generate --image for the same seed", (st, body[:300]))
        checked += st == 200
        c = openai.OpenAI(base_url=d.url("/v1"), api_key="unused", max_retries=0)
        extra = {"seed": SEED, "num_inference_steps": STEPS, "max_area": AREA}
        r = c.images.edit(model=mid, image=open(ref, "rb"), prompt=PROMPT, extra_body={**extra, "size": "32x32"})
        check(b64_pixels(r.data[0].b64_json) == want[0], "images.edit equals ditd generate --image")
        checked += 1
        body = {"model": mid, "prompt": PROMPT, "n": 2, "size": "32x32",
                "image": "data:image/png;base64," + base64.b64encode(open(ref, "rb").read()).decode(), **extra}
        st, _, data = d.request("POST", "/v1/images/edits", json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
        out = json.loads(data) if st == 200 else {}
        got = [b64_pixels(x["b64_json"]) for x in out.get("data", [])]
        check(st == 200 and got == want, "JSON with a data URL, n 2: both equal generate -n 2's", (st, data[:200]))
        checked += st == 200 and got == want
        # a generation on the folder: its size brought to max_area as well (512x256 at 1024**2:
        # round(1448.2) x round(724.1), down to 16: 1440x720)
        st, _, data = d.request("POST", "/v1/images/generations", json.dumps(
            {"prompt": PROMPT, "size": "512x256", "num_inference_steps": 1, "seed": 1}).encode(),
            {"Content-Type": "application/json"})
        out = json.loads(data) if st == 200 else {}
        wh = th.png_info(base64.b64decode(out["data"][0]["b64_json"]))[:2] if st == 200 else None
        check(st == 200 and out.get("size") == "1440x720" and wh == (1440, 720), "a generation: 512x256 brought to 1440x720 (max_area)", (st, data[:200]))
        checked += st == 200
        # two references (a JSON array): output i takes reference i % 2, as ditd generate's list
        body = {"model": mid, "prompt": PROMPT, "size": "32x32", "image": [
            base64.b64encode(open(ref, "rb").read()).decode(),
            "data:image/png;base64," + base64.b64encode(open(ref2, "rb").read()).decode()], **extra}
        st, _, data = d.request("POST", "/v1/images/edits", json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
        out = json.loads(data) if st == 200 else {}
        got = [b64_pixels(x["b64_json"]) for x in out.get("data", [])]
        check(st == 200 and want2 is not None and got == want2 and got[0] == want[0] and got[1] != got[0],
              "two references: n 2, each equal to generate --image A --image B's", (st, data[:200]))
        checked += st == 200 and got == want2
        # a reference of another size: resized to its preferred resolution (48x32 -> 1248x832,
        # PIL's Lanczos) as ditd generate resizes it
        outs3 = os.path.join(tmp, "gen3.png")
        r = subprocess.run([ditd, "generate", "--model", model, "--prompt", PROMPT, "--seed", str(SEED),
                            "--steps", str(STEPS), "--max-area", str(AREA), "--size", "32x32", "--image",
                            small, "--dtype", "f32", "--threads", "1", "-q", "-o", outs3],
                           capture_output=True, text=True, timeout=300)
        want3 = th.png_pixels(open(outs3, "rb").read()) if r.returncode == 0 else None
        st, body = curl_form(d, f"image=@{small};type=image/png", *fields)
        out = json.loads(body) if st == 200 else {}
        check(st == 200 and want3 is not None and b64_pixels(out["data"][0]["b64_json"]) == want3,
              "a 48x32 reference (resized to 1248x832): equals ditd generate --image's", (st, body[:300],
                                                                                       r.stderr[-300:]))
        checked += st == 200 and want3 is not None
        img_f = f"image=@{ref}"
        cases = [
            ((img_f, f"mask=@{small}", *fields), 400, "mask", ["FluxKontextPipeline", "no 'mask'"]),
            ((img_f, "strength=0.5", *fields), 400, "strength", ["no 'strength'"]),
            ((img_f, f"prompt={PROMPT}", "max_area=12"), 400, "max_area", ["integer"]),
        ]
        for flds, status, param, words in cases:
            st, body = curl_form(d, *flds)
            ok, got = refused(st, body, status, param, words)
            check(ok, f"refused: {param} -> {status} naming it", got)
            checked += ok
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(checked >= 10, f"checks run to the end: {checked} (at least 10)")
    return 0


CASES = {"kontext": case_kontext}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ditd", required=True)
    ap.add_argument("case", choices=sorted(CASES))
    a = ap.parse_args()
    t0 = time.time()
    rc = CASES[a.case](os.path.abspath(a.ditd))
    print(f"{a.case}: {time.time() - t0:.1f} s, {len(th.failures)} failure(s)")
    if rc == 77:
        sys.exit(77)
    sys.exit(1 if th.failures else 0)


if __name__ == "__main__":
    main()
