#!/usr/bin/env python3
"""POST /v1/images/edits on `ditd serve` with an SD3 folder (issue 23): the SD3 edit rows through
the route, on the tiny SD3 folder the build assembles (<builddir>/tests/golden/sd3_pipeline/sd3;
its numerics are checked against Diffusers' StableDiffusion3Img2ImgPipeline and
StableDiffusion3InpaintPipeline by test_sd3_edit and test_generate_sd3_edit). Exit 0 pass, 1 fail,
77 skip.

usage: test_sd3_edits.py --ditd BUILD/ditd sd3_edits
The case: /v1/models' `edits` names both SD3 edit rows, their default strengths (0.6, and 1.0 for
a masked edit) and steps, and says skip-layer guidance is not an edit's; curl's form (img2img with
a negative prompt) and the openai client's images.edit with OpenAI's mask (inpainting at the
inpainting row's default strength) equal `ditd generate --image [--mask]` for the same seed, pixel
for pixel; an img2img and a masked edit of one strength sent together run as one batch (the
metrics' ditd_batch_size) and each is still its own `ditd generate` picture (the worker decodes the
masked one as the inpainting row does, without shift_factor, the other with it); the previews of a
masked edit that keeps everything are its final image byte for byte; skip_guidance_layers
on an edit refused (400 naming it) while a generation takes it.
"""
import argparse
import base64
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http as th  # noqa: E402
from test_http import Daemon, check  # noqa: E402
from test_edits import H, W, b64_pixels, curl_form, hole, image_rgb, png, refused  # noqa: E402

PROMPT = "a lighthouse at dusk"
SEED, STEPS = 9, 3


def generate(ditd, model, tmp, name, extra):
    import subprocess
    out = os.path.join(tmp, name + ".png")
    r = subprocess.run([ditd, "generate", "--model", model, "--prompt", PROMPT, "--seed", str(SEED),
                        "--steps", str(STEPS), "--max-sequence-length", "16", "--dtype", "f32",
                        "--threads", "1", "-q", "-o", out] + extra, capture_output=True, text=True,
                       timeout=300)
    check(r.returncode == 0, f"ditd generate {' '.join(extra)}", r.stderr[-400:])
    return th.png_pixels(open(out, "rb").read()) if r.returncode == 0 else None


def case_sd3_edits(ditd):
    model = os.environ.get("DITD_SD3_MODEL") or os.path.join(
        os.path.dirname(ditd), "tests", "golden", "sd3_pipeline", "sd3")
    if not os.path.exists(os.path.join(model, "model_index.json")):
        print("skip: no SD3 model (the build's tests/golden/sd3_pipeline/sd3)")
        return 77
    import openai
    tmp = tempfile.mkdtemp(prefix="ditd-sd3-edits-")
    rows = image_rgb()
    img = png(W, H, rows, 2)
    oa_mask = png(W, H, [[v for x in range(W) for v in (0, 0, 0, 0 if hole(x, y) else 255)]
                         for y in range(H)], 6)
    df_mask = png(W, H, [[v for x in range(W) for v in ((255, 255, 255) if hole(x, y) else (0, 0, 0))]
                         for y in range(H)], 2)
    paths = {}
    for name, data in (("img", img), ("oa_mask", oa_mask), ("df_mask", df_mask)):
        paths[name] = os.path.join(tmp, name + ".png")
        open(paths[name], "wb").write(data)
    ref = generate(ditd, model, tmp, "ref", ["--image", paths["img"], "--strength", "0.7",
                                             "--negative-prompt", "blurry"])
    ref_mask = generate(ditd, model, tmp, "ref_mask", ["--image", paths["img"], "--mask", paths["df_mask"]])
    ref_s1 = generate(ditd, model, tmp, "ref_s1", ["--image", paths["img"], "--strength", "1.0"])
    check(ref is not None and ref_mask is not None and ref != ref_mask, "the mask changes the picture")
    d = Daemon(ditd, "--dtype", "f32", "--threads", "1", "--max-batch", "2", "--batch-window-ms", "700",
               model=model)
    mid = os.path.basename(model)
    checked = 0
    try:
        st, _, data = d.request("GET", "/v1/models")
        ed = (json.loads(data)["data"][0].get("edits") or {}) if st == 200 else {}
        check(st == 200 and th.validate(json.loads(data), "ModelList") and
              ed.get("img2img") == "StableDiffusion3Img2ImgPipeline" and ed.get("inpaint") is True and
              ed.get("inpaint_pipeline") == "StableDiffusion3InpaintPipeline" and
              ed.get("default_strength") == 0.6 and ed.get("default_steps") == 50 and
              ed.get("inpaint_default_strength") == 1.0 and ed.get("inpaint_default_steps") == 50 and
              ed.get("skip_guidance_layers") is False,
              "/v1/models: an SD3 folder takes img2img and inpainting by the SD3 edit rows", ed)
        checked += 1
        st, body = curl_form(d, f"image=@{paths['img']};type=image/png", f"prompt={PROMPT}",
                             f"seed={SEED}", f"num_inference_steps={STEPS}", "strength=0.7",
                             "negative_prompt=blurry", "max_sequence_length=16")
        out = json.loads(body) if st == 200 else {}
        check(st == 200 and out.get("strength") == 0.7 and out.get("mask") is False and
              b64_pixels(out["data"][0]["b64_json"]) == ref,
              "curl -F image=@... on SD3 equals ditd generate --image", (st, body[:300]))
        checked += 1
        c = openai.OpenAI(base_url=d.url("/v1"), api_key="unused", max_retries=0)
        r = c.images.edit(model=mid, image=open(paths["img"], "rb"), mask=open(paths["oa_mask"], "rb"),
                          prompt=PROMPT, extra_body={"seed": SEED, "num_inference_steps": STEPS,
                                                     "max_sequence_length": 16})
        check(b64_pixels(r.data[0].b64_json) == ref_mask,
              "images.edit with OpenAI's mask on SD3 (strength 1.0, the inpainting row's default) "
              "equals ditd generate --image --mask")
        checked += 1
        # an img2img edit and a masked one at strength 1.0 together: one batch, two decodes
        url = "data:image/png;base64,"
        both = [{"model": mid, "prompt": PROMPT, "seed": SEED, "num_inference_steps": STEPS,
                 "max_sequence_length": 16, "image": url + base64.b64encode(img).decode(), **extra}
                for extra in ({"strength": 1.0}, {"mask": url + base64.b64encode(oa_mask).decode()})]
        m0 = d.metrics()
        got = [None, None]

        def send(i):
            got[i] = d.request("POST", "/v1/images/edits", json.dumps(both[i]).encode(),
                               {"Content-Type": "application/json"}, timeout=120)
        ts = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(130)
        m1 = d.metrics()
        def total(m, name):  # the series of every label set
            return sum(v for key, v in m.items() if key.split("{")[0] == name)
        n = total(m1, "ditd_batch_size_count") - total(m0, "ditd_batch_size_count")
        k = total(m1, "ditd_batch_size_sum") - total(m0, "ditd_batch_size_sum")
        pics = [b64_pixels(json.loads(g[2])["data"][0]["b64_json"]) if g and g[0] == 200 else None for g in got]
        check(n == 1 and k == 2, "an img2img and a masked SD3 edit of one strength ran as one batch",
              (n, k, [g[0] if g else None for g in got]))
        check(pics[0] == ref_s1 and pics[1] == ref_mask,
              "in one batch each is its own ditd generate picture (the masked one without shift_factor)")
        checked += 2
        # previews of a masked edit that keeps everything: each is the image's latents decoded as
        # the final image is (the inpainting row's rule), so byte for byte the final image
        opaque = png(W, H, [[0, 0, 0, 255] * W] * H, 6)
        evs = [(e.type, getattr(e, "b64_json", None)) for e in c.images.edit(
            model=mid, image=("i.png", img, "image/png"), mask=("m.png", opaque, "image/png"),
            prompt=PROMPT, stream=True, partial_images=2,
            extra_body={"seed": SEED, "num_inference_steps": STEPS, "max_sequence_length": 16})]
        part = [b for t, b in evs if t == "image_edit.partial_image"]
        final = [b for t, b in evs if t == "image_edit.completed"]
        check(len(part) == 2 and len(final) == 1 and
              all(b64_pixels(p) == b64_pixels(final[0]) for p in part),
              "SD3 inpainting previews decode as its final image: with nothing repainted every preview "
              "is the final image", [t for t, _ in evs])
        checked += 1
        body = {"model": mid, "prompt": PROMPT, "image": "data:image/png;base64," + base64.b64encode(img).decode(),
                "num_inference_steps": STEPS, "skip_guidance_layers": [1]}
        st, _, data = d.request("POST", "/v1/images/edits", json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
        ok, got = refused(st, data, 400, "skip_guidance_layers", ["StableDiffusion3Img2ImgPipeline"])
        check(ok, "skip_guidance_layers on an SD3 edit: 400 naming it", got)
        checked += ok
        st, _, data = d.request("POST", "/v1/images/generations",
                                json.dumps({"prompt": PROMPT, "num_inference_steps": STEPS, "size": f"{W}x{H}",
                                            "skip_guidance_layers": [1]}).encode(),
                                {"Content-Type": "application/json"})
        check(st == 200, "the same field on a generation is taken", (st, data[:200]))
        checked += st == 200
    finally:
        d.stop()
    check(checked >= 8, f"checks run to the end: {checked} (at least 8)")
    return 0


CASES = {"sd3_edits": case_sd3_edits}


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
