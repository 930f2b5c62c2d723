#!/usr/bin/env python3
"""POST /v1/images/edits on `ditd serve` (issue 23), as users send it: curl's multipart form and
the official `openai` client's `images.edit` (unchanged), on the tiny FLUX.1-dev folder the build
assembles (<builddir>/tests/golden/flux_pipeline/dev; its numerics are checked against Diffusers'
FluxImg2ImgPipeline and FluxInpaintPipeline by test_flux_img2img and test_flux_inpaint). Exit 0
pass, 1 fail, 77 skip.

usage: test_edits.py --ditd BUILD/ditd edits
The case: the served image equals `ditd generate --image` (img2img) and `ditd generate --image
--mask` (inpainting: OpenAI's transparency mask against Diffusers' white-is-repainted mask, and
the image's own alpha when no mask is sent) for the same seed, pixel for pixel; the same for a
JPEG with EXIF orientation 6, a lossless WebP (with a WebP mask too) and a lossy WebP; several
images (Diffusers' image list: image[] repeated by the client, n 2, and n 4 with one mask; a JSON
array), and a list request batched with a single-image one; a JSON body with a data URL;
stream=True gives image_edit.* events ending in image_edit.completed; /v1/models' `edits`; the
refusals, each a 4xx naming its field (no image, an undecodable upload, a 1x100000 PNG header, a
30000x30000 JPEG header, a truncated WebP, BMP, GIF, a mask of another size, a mask without
alpha, an image of another size than `size`, a wrong content type, `image` and `image[]` mixed, n
not a multiple of the images, images of two sizes, transparency on one image of two, a bomb as
the second image, 50 MB of form data).
"""
import argparse
import base64
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http as th  # noqa: E402
from test_http import Daemon, check  # noqa: E402

PROMPT = "a red fox in the snow, watercolor"
# the uploads PIL made (tools/make_edit_upload_fixtures.py): JPEG with EXIF, WebP, hostile ones
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "edit_uploads")
W, H = 48, 32
SEED, STEPS, STRENGTH = 7, 3, 0.7


def png(width, height, rows, color_type):
    """A PNG from rows of bytes (color type 2: RGB, 4: gray+alpha, 6: RGBA; 8 bits)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\0" + bytes(r) for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def image_rgb():
    rows = []
    for y in range(H):
        r = []
        for x in range(W):
            r += [(40 + 4 * x) % 256, (200 - 5 * y) % 256, (17 * x + 11 * y) % 256]
        rows.append(r)
    return rows


def hole(x, y):
    """The region to repaint: a block with a hole in it, edges off the 8-pixel grid."""
    return 5 <= x < 41 and 3 <= y < 27 and not (17 <= x < 27 and 11 <= y < 19)


def run_generate(ditd, model, tmp, name, extra, n=1):
    """ditd generate's pixels for the same seed: one image, or a list of n (-n N)."""
    out = os.path.join(tmp, name + ".png")
    r = subprocess.run([ditd, "generate", "--model", model, "--prompt", PROMPT, "--seed", str(SEED),
                        "--steps", str(STEPS), "--strength", str(STRENGTH), "--dtype", "f32",
                        "--threads", "1", "-q", "-o", out, "-n", str(n)] + extra, capture_output=True,
                       text=True, timeout=300)
    check(r.returncode == 0, f"ditd generate {' '.join(extra)}", r.stderr[-400:])
    if r.returncode != 0:
        return None
    if n == 1:
        return th.png_pixels(open(out, "rb").read())
    return [th.png_pixels(open(os.path.join(tmp, f"{name}-{i}.png"), "rb").read()) for i in range(n)]


def b64_pixels(b64):
    return th.png_pixels(base64.b64decode(b64))


def curl_form(d, *fields, path="/v1/images/edits"):
    args = ["-s", "-o", "-", "-w", "\n%{http_code}", d.url(path)]
    for f in fields:
        args += ["-F", f]
    r = subprocess.run(["curl"] + args, capture_output=True, timeout=120)
    body, _, code = r.stdout.rpartition(b"\n")
    return int(code or 0), body


def refused(st, body, status, param, words):
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        err = {}
    msg = err.get("message") or ""
    return st == status and err.get("param") == param and all(w in msg for w in words), (st, err)


def case_edits(ditd):
    model = th.text_model(ditd)
    if not model:
        print("skip: no FLUX folder (the build's tests/golden/flux_pipeline/dev)")
        return 77
    import openai
    tmp = tempfile.mkdtemp(prefix="ditd-edits-")
    img_rows = image_rgb()
    img = png(W, H, img_rows, 2)
    # OpenAI's mask: transparent where to repaint; Diffusers' (ditd generate --mask): white there
    oa_mask = png(W, H, [[v for x in range(W) for v in (0, 0, 0, 0 if hole(x, y) else 255)]
                         for y in range(H)], 6)
    df_mask = png(W, H, [[v for x in range(W) for v in ((255, 255, 255) if hole(x, y) else (0, 0, 0))]
                         for y in range(H)], 2)
    # the image with its own alpha: the same hole transparent
    img_alpha = png(W, H, [[v for x in range(W) for v in img_rows[y][3 * x:3 * x + 3] + [0 if hole(x, y) else 255]]
                           for y in range(H)], 6)
    paths = {}
    for name, data in (("img", img), ("oa_mask", oa_mask), ("df_mask", df_mask),
                       ("img_alpha", img_alpha), ("small_mask", png(16, 16, [[0, 0] * 16] * 16, 4)),
                       ("rgb_mask", png(W, H, [[0] * (3 * W)] * H, 2)),
                       ("bomb", png(1, 100000, [[0, 0, 0]] * 100000, 2)), ("junk", b"GIF89a not really")):
        paths[name] = os.path.join(tmp, name + ".png")
        open(paths[name], "wb").write(data)
    fx = {k: os.path.join(FIXTURES, k) for k in os.listdir(FIXTURES)}
    jpg, webp, lossy = fx["photo_exif6.jpg"], fx["img.webp"], fx["img_lossy.webp"]
    ref = run_generate(ditd, model, tmp, "ref", ["--image", paths["img"]])
    ref_mask = run_generate(ditd, model, tmp, "ref_mask", ["--image", paths["img"], "--mask", paths["df_mask"]])
    check(ref is not None and ref_mask is not None and ref != ref_mask, "the mask changes the picture")
    # the JPEG (EXIF orientation 6) and the lossy WebP: the same files on the command line (the
    # decoders' pixels against PIL's are test_image_in's); several images: --image repeated
    ref_jpeg = run_generate(ditd, model, tmp, "ref_jpeg", ["--image", jpg])
    ref_lossy = run_generate(ditd, model, tmp, "ref_lossy", ["--image", lossy])
    ref_list = run_generate(ditd, model, tmp, "ref_list", ["--image", paths["img"], "--image", jpg], n=2)
    ref_list4 = run_generate(ditd, model, tmp, "ref_list4", ["--image", paths["img"], "--image", jpg,
                                                              "--mask", paths["df_mask"]], n=4)
    check(ref_list is not None and ref_list[0] == ref and ref_list[1] != ref_jpeg,
          "an image list: output 0 is image 0's edit alone (its draw at offset 0), output 1 edits "
          "image 1 with its own part of the posterior draw (not the same image's edit alone)")
    check(ref_list4 is not None and len({bytes(x) for x in ref_list4}) == 4,
          "an image list with a mask, n 4: four different pictures")
    # a batch window, so that requests sent together share a batch
    d = Daemon(ditd, "--dtype", "f32", "--threads", "1", "--batch-window-ms", "300", model=model)
    mid = os.path.basename(model)
    fields = [f"prompt={PROMPT}", f"seed={SEED}", f"num_inference_steps={STEPS}", f"strength={STRENGTH}"]
    checked = 0
    try:
        st, _, data = d.request("GET", "/v1/models")
        info = json.loads(data)["data"][0]
        ed = info.get("edits") or {}
        check(st == 200 and th.validate(json.loads(data), "ModelList") and
              ed.get("img2img") == "FluxImg2ImgPipeline" and ed.get("inpaint") is True and
              ed.get("inpaint_pipeline") == "FluxInpaintPipeline" and ed.get("default_strength") == 0.6,
              "/v1/models: this folder takes img2img and inpainting edits", ed)
        # curl's multipart form, img2img
        st, body = curl_form(d, f"image=@{paths['img']};type=image/png", *fields)
        out = json.loads(body) if st == 200 else {}
        check(st == 200 and th.validate(out, "ImagesResponse") and out.get("strength") == STRENGTH and
              out.get("mask") is False and out.get("size") == f"{W}x{H}",
              "curl -F image=@...: 200, the image's size, no mask", (st, body[:300]))
        check(st == 200 and b64_pixels(out["data"][0]["b64_json"]) == ref,
              "the curl edit equals ditd generate --image for the same seed")
        checked += 2
        # the official client, with and without mask, and with the image's own alpha
        c = openai.OpenAI(base_url=d.url("/v1"), api_key="unused", max_retries=0)
        extra = {"seed": SEED, "num_inference_steps": STEPS, "strength": STRENGTH}
        r = c.images.edit(model=mid, image=open(paths["img"], "rb"), prompt=PROMPT, extra_body=extra)
        check(b64_pixels(r.data[0].b64_json) == ref, "images.edit equals ditd generate --image")
        r = c.images.edit(model=mid, image=open(paths["img"], "rb"), mask=open(paths["oa_mask"], "rb"),
                          prompt=PROMPT, size=f"{W}x{H}", extra_body=extra)
        check(b64_pixels(r.data[0].b64_json) == ref_mask,
              "images.edit with OpenAI's mask equals ditd generate --image --mask (white = its transparent)")
        r = c.images.edit(model=mid, image=[open(paths["img_alpha"], "rb")], prompt=PROMPT, extra_body=extra)
        check(b64_pixels(r.data[0].b64_json) == ref_mask,
              "images.edit with image[] and no mask: the image's own transparency is the mask")
        checked += 3
        # JSON with a data URL; n = 2 (both images of one request share its image latents)
        body = {"model": mid, "prompt": PROMPT, "n": 2, "image": "data:image/png;base64," +
                base64.b64encode(img).decode(), **extra}
        st, _, data = d.request("POST", "/v1/images/edits", json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
        out = json.loads(data) if st == 200 else {}
        check(st == 200 and len(out.get("data", [])) == 2 and b64_pixels(out["data"][0]["b64_json"]) == ref,
              "JSON with a data URL, n 2: image 0 equals generate's", (st, data[:200]))
        checked += 1
        # JPEG with an EXIF orientation (upright 48x32; stored 32x48), WebP lossless (the PNG's
        # pixels: the PNG's edit) with and without a mask (a WebP mask too), lossy WebP
        r = c.images.edit(model=mid, image=open(jpg, "rb"), prompt=PROMPT, extra_body=extra)
        jw, jh = th.png_info(base64.b64decode(r.data[0].b64_json))[:2]
        check((jw, jh) == (W, H), "the JPEG's EXIF orientation applied: 48x32 upright (stored 32x48)",
              (jw, jh))
        check(b64_pixels(r.data[0].b64_json) == ref_jpeg,
              "images.edit of a JPEG with EXIF orientation 6 equals ditd generate --image on it")
        r = c.images.edit(model=mid, image=open(webp, "rb"), prompt=PROMPT, extra_body=extra)
        check(b64_pixels(r.data[0].b64_json) == ref, "images.edit of a lossless WebP equals the PNG's edit")
        r = c.images.edit(model=mid, image=open(webp, "rb"), mask=open(fx["mask.webp"], "rb"),
                          prompt=PROMPT, extra_body=extra)
        check(b64_pixels(r.data[0].b64_json) == ref_mask,
              "images.edit of a lossless WebP with a WebP mask equals ditd generate --image --mask")
        r = c.images.edit(model=mid, image=open(lossy, "rb"), prompt=PROMPT, extra_body=extra)
        check(b64_pixels(r.data[0].b64_json) == ref_lossy,
              "images.edit of a lossy WebP equals ditd generate --image on it")
        checked += 5
        # several images (Diffusers' image list): image[] repeated by the client, n 2 and n 4
        # with a mask; a JSON array; output i edits image i % 2
        r = c.images.edit(model=mid, image=[open(paths["img"], "rb"), open(jpg, "rb")], prompt=PROMPT,
                          n=2, extra_body=extra)
        check([b64_pixels(x.b64_json) for x in r.data] == ref_list,
              "images.edit with two images, n 2, equals ditd generate --image A --image B -n 2")
        r = c.images.edit(model=mid, image=[open(paths["img"], "rb"), open(jpg, "rb")],
                          mask=open(paths["oa_mask"], "rb"), prompt=PROMPT, n=4, extra_body=extra)
        check([b64_pixels(x.b64_json) for x in r.data] == ref_list4,
              "images.edit with two images and one mask, n 4, equals ditd generate ... --mask -n 4")
        body = {"model": mid, "prompt": PROMPT, **extra, "image": [
            "data:image/png;base64," + base64.b64encode(img).decode(),
            base64.b64encode(open(jpg, "rb").read()).decode()]}
        st, _, data = d.request("POST", "/v1/images/edits", json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
        out = json.loads(data) if st == 200 else {}
        check(st == 200 and [b64_pixels(x["b64_json"]) for x in out.get("data", [])] == ref_list,
              "JSON with an array of two images (n absent: one output per image) equals the list's",
              (st, data[:200]))
        checked += 3
        # sent together (one batch window): the list's second image and a request of that image
        # alone draw different posteriors, each request its own pixels
        import threading
        got = {}

        def send(key, **kw):
            try:
                got[key] = [b64_pixels(x.b64_json) for x in c.images.edit(
                    model=mid, prompt=PROMPT, extra_body=extra, **kw).data]
            except Exception as e:  # noqa: BLE001  (reported by the check below)
                got[key] = e
        def batches():
            st, _, data = d.request("GET", "/metrics")
            return sum(float(line.split()[-1]) for line in data.decode().splitlines()
                       if line.startswith("ditd_replica_batches_total"))
        b0 = batches()
        ts = [threading.Thread(target=send, args=("list",),
                               kwargs={"image": [open(paths["img"], "rb"), open(jpg, "rb")], "n": 2}),
              threading.Thread(target=send, args=("one",), kwargs={"image": open(jpg, "rb")})]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        nb = batches() - b0
        check(got.get("list") == ref_list and got.get("one") == [ref_jpeg],
              "a list request and a single-image request sent together: each its own pixels",
              {k: (v if isinstance(v, Exception) else len(v)) for k, v in got.items()})
        check(nb == 1, "... and they ran as one batch of three samples", nb)
        checked += 2
        # streaming: image_edit.* events, the last one image_edit.completed
        events = [e.type for e in c.images.edit(model=mid, image=open(paths["img"], "rb"), prompt=PROMPT,
                                                stream=True, extra_body=extra)]
        check(events and events[-1] == "image_edit.completed" and
              all(t.startswith("image_edit.") for t in events),
              "stream=True: image_edit events, ending in image_edit.completed", events)
        checked += 1
        # refusals, each naming its field
        img_f = f"image=@{paths['img']}"
        cases = [
            ((f"prompt={PROMPT}",), 400, "image", ["required"]),
            ((f"image=@{paths['junk']}", f"prompt={PROMPT}"), 400, "image", ["GIF"]),
            ((f"image=@{paths['bomb']}", f"prompt={PROMPT}"), 400, "image", ["100000"]),
            ((img_f, f"mask=@{paths['small_mask']}", f"prompt={PROMPT}"), 400, "mask", ["16x16", "same size"]),
            ((img_f, f"mask=@{paths['rgb_mask']}", f"prompt={PROMPT}"), 400, "mask", ["alpha"]),
            ((img_f, f"prompt={PROMPT}", "size=64x64"), 400, "image", ["48x32", "resampling"]),
            ((img_f, f"image[]=@{paths['img']}", f"prompt={PROMPT}"), 400, "image[]", ["not both"]),
            # several images: n a multiple of them; one size; all transparent or none; each checked
            ((f"image[]=@{paths['img']}", f"image[]=@{jpg}", "n=3", f"prompt={PROMPT}"), 400, "n",
             ["n = 3", "2 input images"]),
            ((f"image[]=@{paths['img']}", f"image[]=@{paths['small_mask']}", f"prompt={PROMPT}"), 400,
             "image[]", ["image[1]", "16x16", "same size"]),
            ((f"image[]=@{paths['img']}", f"image[]=@{paths['img_alpha']}", f"prompt={PROMPT}"), 400,
             "image[]", ["image[1]", "transparent", "mask"]),
            ((f"image[]=@{paths['img']}", f"image[]=@{paths['bomb']}", f"prompt={PROMPT}"), 400,
             "image[]", ["image[1]", "100000"]),
            ((f"image[]=@{paths['img']}", f"image[]=@{jpg}", f"mask=@{paths['small_mask']}",
              f"prompt={PROMPT}"), 400, "mask", ["16x16", "same size"]),
            # hostile uploads: a 30000x30000 JPEG header (cut after it), a truncated WebP, BMP, GIF
            ((f"image=@{fx['bomb_30000.jpg']}", f"prompt={PROMPT}"), 400, "image",
             ["30000x30000", "limit"]),
            ((f"image=@{fx['cut.webp']}", f"prompt={PROMPT}"), 400, "image", ["webp", "truncated"]),
            ((f"image=@{fx['tiny.bmp']}", f"prompt={PROMPT}"), 400, "image", ["BMP"]),
            ((f"image=@{fx['tiny.gif']}", f"prompt={PROMPT}"), 400, "image", ["GIF"]),
            ((img_f, f"mask=@{fx['cut.webp']}", f"prompt={PROMPT}"), 400, "mask", ["truncated"]),
            ((img_f, f"prompt={PROMPT}", "strength=1.5"), 400, "strength", ["(0, 1]"]),
            ((img_f, f"prompt={PROMPT}", "sampler=dpmpp-2m"), 400, "sampler", ["flow-euler"]),
        ]
        for flds, status, param, words in cases:
            st, body = curl_form(d, *flds)
            ok, got = refused(st, body, status, param, words)
            what = " ".join(os.path.basename(f) for f in flds if not f.startswith("prompt=")) or "no image"
            check(ok, f"refused: {what} -> {status} naming {param}", got)
            checked += ok
        st, _, data = d.request("POST", "/v1/images/edits", b"prompt=x", {"Content-Type": "text/plain"})
        check(st == 415, "a wrong content type: 415", (st, data[:200]))
        checked += st == 415
        st, _, data = d.request("POST", "/v1/images/generations",
                                json.dumps({"prompt": PROMPT, "strength": 0.5}).encode(),
                                {"Content-Type": "application/json"})
        ok, got = refused(st, data, 400, "strength", ["/v1/images/edits"])
        check(ok, "an edit's field on a generation: 400 naming it and the edits endpoint", got)
        checked += ok
        # 50 MB of form data: refused at the headers (the route's 48 MiB), nothing read
        import socket
        with socket.create_connection(("127.0.0.1", d.port), timeout=30) as sk:
            sk.sendall(b"POST /v1/images/edits HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
                       b"boundary=b\r\nContent-Length: 52428800\r\n\r\n")
            head = sk.recv(4096)
        check(head.startswith(b"HTTP/1.1 413"), "50 MB of form data: 413 before the body", head[:80])
        checked += head.startswith(b"HTTP/1.1 413")
    finally:
        d.stop()
    check(checked >= 39, f"checks run to the end: {checked} (at least 39)")
    return 0


CASES = {"edits": case_edits}


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
