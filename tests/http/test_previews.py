#!/usr/bin/env python3
"""Previews of a latent model in `ditd serve` (issue 23): `partial_images` on the tiny FLUX.1-dev
folder the build assembles (<builddir>/tests/golden/flux_pipeline/dev; the previews' numerics are
checked against Diffusers' FluxPipeline in float64 by tests/golden/test_flux_previews.c), as users
ask for them: the official `openai` client's images.generate / images.edit with stream=True.
Exit 0 pass, 1 fail, 77 skip.

usage: test_previews.py --ditd BUILD/ditd CASE
cases:
  previews      generate and edit (img2img, inpainting) streams: partial_images 2 gives two
                partial_image events (index 0, 1), each a PNG of the request's size, then the
                completed image, equal to the non-streamed one for the same seed; partial_images 0
                gives none; an inpainting preview keeps the image where the mask keeps it (a mask
                that keeps everything: every preview is the final image); closing a 3-preview stream stops the work (the slot frees at once,
                the sample counted canceled)
  previews_mpi  the same stream under mpirun, a replica of 2 ranks: cfg 2 (FLUX.1-dev without
                true CFG runs its rows on one cfg half, so the latents are one rank's to the bit
                and the group's decode must give the single process's previews byte for byte),
                ulysses 2 and tp 2 (latents within 1e-4 of one rank: previews within one level, as
                the final images)
"""
import argparse
import base64
import http.client
import json
import os
import shutil
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http as th  # noqa: E402
from test_http import Daemon, check  # noqa: E402

W, H = 48, 32
PROMPT = "a lighthouse on a cliff at dusk"
BASE = {"prompt": PROMPT, "size": f"{W}x{H}", "seed": 5, "num_inference_steps": 6}


def pixels(b64):
    return th.png_pixels(base64.b64decode(b64))


def partials_ok(evs, kind, k, what):
    """evs: [(type, b64 or None, partial index)]; k partials of the right size in order, then
    one completed, last. Returns the partials' b64 and the final's."""
    types = [t for t, _, _ in evs]
    part = [(b, i) for t, b, i in evs if t == f"{kind}.partial_image"]
    check([i for _, i in part] == list(range(k)), f"{what}: {k} {kind}.partial_image events, index "
          f"0..{k - 1}", [i for _, i in part])
    check(types and types[-1] == f"{kind}.completed" and types.count(f"{kind}.completed") == 1,
          f"{what}: {kind}.completed once, the last event", types[-3:])
    check(all(th.png_info(base64.b64decode(b))[:2] == (W, H) for b, _ in part),
          f"{what}: every partial is a decodable {W}x{H} PNG")
    last = types.index(f"{kind}.completed") if f"{kind}.completed" in types else -1
    pos = [i for i, t in enumerate(types) if t == f"{kind}.partial_image"]
    check(pos and last > max(pos) and all(types[i - 1] == f"{kind}.progress" for i in pos),
          f"{what}: each partial right after its step's progress event, all before the final image")
    return [b for b, _ in part], (evs[last][1] if last >= 0 else None)


def client_events(stream):
    return [(e.type, getattr(e, "b64_json", None), getattr(e, "partial_image_index", None))
            for e in stream]


def case_previews(ditd):
    model = th.text_model(ditd)
    if not model:
        print("skip: no FLUX folder (the build's tests/golden/flux_pipeline/dev)")
        return 77
    import openai
    import test_edits as te
    d = Daemon(ditd, "--dtype", "f32", "--threads", "1", "--max-batch", "2", model=model)
    mid = os.path.basename(model)
    checked = 0
    try:
        c = openai.OpenAI(base_url=d.url("/v1"), api_key="unused", max_retries=0)
        extra = {"seed": BASE["seed"], "num_inference_steps": BASE["num_inference_steps"]}
        plain = c.images.generate(model=mid, prompt=PROMPT, size=BASE["size"], extra_body=extra)
        evs = client_events(c.images.generate(model=mid, prompt=PROMPT, size=BASE["size"], stream=True,
                                              partial_images=2, extra_body=extra))
        part, final = partials_ok(evs, "image_generation", 2, "generate, partial_images 2")
        check(final and pixels(final) == pixels(plain.data[0].b64_json),
              "generate: the streamed final image equals the non-streamed one (same seed)")
        check(len(part) == 2 and pixels(part[0]) != pixels(part[1]) and
              all(pixels(p) != pixels(final) for p in part),
              "generate: the previews are pictures of their own (not the final image, not each other)")
        checked += 1
        evs = client_events(c.images.generate(model=mid, prompt=PROMPT, size=BASE["size"], stream=True,
                                              partial_images=0, extra_body=extra))
        check(not any(t.endswith("partial_image") for t, _, _ in evs) and evs and
              evs[-1][0] == "image_generation.completed" and pixels(evs[-1][1]) == pixels(plain.data[0].b64_json),
              "generate, partial_images 0: no partial image, the same final image", [t for t, _, _ in evs][-3:])
        checked += 1

        # edits: img2img, then inpainting (OpenAI's mask)
        img = te.png(W, H, te.image_rgb(), 2)
        mask = te.png(W, H, [[v for x in range(W) for v in (0, 0, 0, 0 if te.hole(x, y) else 255)]
                             for y in range(H)], 6)
        ex = dict(extra, strength=0.7)
        for what, kw in (("edit", {}), ("edit with a mask", {"mask": ("m.png", mask, "image/png")})):
            plain = c.images.edit(model=mid, image=("i.png", img, "image/png"), prompt=PROMPT,
                                  extra_body=ex, **kw)
            evs = client_events(c.images.edit(model=mid, image=("i.png", img, "image/png"), prompt=PROMPT,
                                              stream=True, partial_images=2, extra_body=ex, **kw))
            part, final = partials_ok(evs, "image_edit", 2, f"{what}, partial_images 2")
            check(final and pixels(final) == pixels(plain.data[0].b64_json),
                  f"{what}: the streamed final image equals the non-streamed one")
            check(all(t.startswith("image_edit.") for t, _, _ in evs), f"{what}: image_edit.* events only")
            checked += 1

        # an inpainting preview is x0 with the kept region the image's latents: with a mask that
        # keeps everything (opaque), every preview is the image's latents decoded, which is the
        # final image byte for byte (a preview of x0 unblended would not be)
        opaque = te.png(W, H, [[0, 0, 0, 255] * W] * H, 6)
        evs = client_events(c.images.edit(model=mid, image=("i.png", img, "image/png"), prompt=PROMPT,
                                          mask=("m.png", opaque, "image/png"), stream=True,
                                          partial_images=2, extra_body=ex))
        part, final = partials_ok(evs, "image_edit", 2, "edit with a mask that keeps everything")
        check(final and len(part) == 2 and all(pixels(p) == pixels(final) for p in part),
              "inpainting previews show the kept region as the image: with nothing repainted every "
              "preview is the final image")
        checked += 1

        # cancel: close a 3-preview stream after its first preview; the slot frees at once
        long_body = dict(BASE, model=mid, num_inference_steps=400)
        t0 = time.time()
        st = d.generate(long_body)[0]
        t_long = time.time() - t0
        check(st == 200, f"a 400-step request alone takes {t_long:.2f} s", st)
        m0 = d.metrics().get(f'ditd_canceled_samples_total{{model="{mid}"}}', 0)
        s = socket.create_connection(("127.0.0.1", d.port))
        raw = json.dumps(dict(long_body, stream=True, partial_images=3)).encode()
        s.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
        got = b""
        s.settimeout(120)
        while b"image_generation.partial_image" not in got:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        s.close()  # at step 100 of 400: three quarters of the work left
        t1 = time.time()
        short = d.generate(dict(BASE, model=mid))
        t_short = time.time() - t1
        check(b"image_generation.partial_image" in got and short[0] == 200 and t_short < 0.5 * t_long,
              f"closing the stream after its first preview stops the work: a short request then takes "
              f"{t_short:.2f} s (the long one {t_long:.2f} s alone)")
        deadline = time.time() + 10
        while time.time() < deadline:
            m1 = d.metrics().get(f'ditd_canceled_samples_total{{model="{mid}"}}', 0)
            if m1 >= m0 + 1:
                break
            time.sleep(0.05)
        check(m1 >= m0 + 1, "metrics: the sample counted canceled", (m0, m1))
        check(d.metrics().get("ditd_inflight_requests") == 0, "no request left in flight")
        checked += 1
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)
    check(checked >= 6, f"preview cases checked to the end: {checked} (at least 6)")
    return 0


def stream_previews(d, body):
    st, _, evs = th.sse_events(d, dict(body, stream=True))
    if st != 200:
        return None, None
    part = [x["b64_json"] for e, x in evs if e == "image_generation.partial_image"]
    fin = [x["b64_json"] for e, x in evs if e == "image_generation.completed"]
    return part, (fin[0] if fin else None)


def case_previews_mpi(ditd):
    model = th.text_model(ditd)
    if not model:
        print("skip: no FLUX folder (the build's tests/golden/flux_pipeline/dev)")
        return 77
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        return 77
    mid = os.path.basename(model)
    bodies = [dict(BASE, model=mid, partial_images=3, seed=s) for s in (5, 6)]
    d = Daemon(ditd, "--dtype", "f32", "--threads", "1", model=model)
    try:
        want = [stream_previews(d, b) for b in bodies]
    finally:
        d.stop()
    check(all(p and len(p) == 3 and f for p, f in want), "one process: three previews and the image per request")
    checked = 0
    for flags, exact, what in ((["--cfg-degree", "2"], True, "--cfg-degree 2"),
                               (["--ulysses-degree", "2"], False, "--ulysses-degree 2"),
                               (["--tp-degree", "2"], False, "--tp-degree 2")):
        d = Daemon(ditd, "--dtype", "f32", "--threads", "1", *flags, model=model, mpi_np=3)
        try:
            for b, (wp, wf) in zip(bodies, want):
                gp, gf = stream_previews(d, b)
                if not gp or len(gp) != 3 or not wp:
                    check(False, f"{what}: seed {b['seed']}: three previews", gp and len(gp))
                    continue
                if exact:
                    same = all(pixels(g) == pixels(w) for g, w in zip(gp, wp))
                    check(same and pixels(gf) == pixels(wf),
                          f"{what} (a replica of 2 ranks), seed {b['seed']}: the three previews and the "
                          f"image equal one process's byte for byte")
                else:
                    r = th.same_pictures([{"b64_json": g} for g in gp + [gf]],
                                         [{"b64_json": w} for w in wp + [wf]])
                    check(r[0], f"{what} (a replica of 2 ranks), seed {b['seed']}: the previews and the "
                          f"image within one level of one process's (worst {r[1]}, {r[2]} values differ)", r)
                checked += 1
        finally:
            rc = d.stop()
        check(rc == 0, f"{what}: mpirun exits 0", rc)
    check(checked >= 6, f"mpi preview streams checked: {checked} (at least 6)")
    return 0


CASES = {"previews": case_previews, "previews_mpi": case_previews_mpi}


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
