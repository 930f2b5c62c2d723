#!/usr/bin/env python3
"""Measure the embedded default model: class accuracy of generated images, a contact
sheet, a settings sweep, a Diffusers cross-check and ditd's time per image.

What it is: a client of ditd. It asks ditd for N images per Fashion-MNIST class
(image j of every class uses seed --seed + j, one image per request) and scores them
with the classifier of tools/train_classifier.py: the accuracy of a class is the share
of its images that the classifier recognises as the class that was asked for. Two ways
to reach ditd:

  --url http://127.0.0.1:8080   a running `ditd serve`: POST /v1/images/generations
                                {"model": "fashion-dit", "prompt": "<class name>", "n": 1,
                                 "seed": S, "response_format": "b64_json"}; the PNG comes
                                back in data[0].b64_json (OpenAI images shape). Only if
                                --steps/--guidance/--sampler are given, the request also
                                carries num_inference_steps / guidance_scale / sampler.
  --ditd build/ditd      the CLI: `ditd generate --model DIR --class C --seed S -q
                                -o X.png` (one process per image, --jobs at a time).

Both give the same pixels for the same seed (one request = one image at index 0).

    python tools/eval_default.py --ditd build/ditd                   # defaults of ditd.json
    python tools/eval_default.py --url http://127.0.0.1:8080 --n 50
    python tools/eval_default.py --ditd build/ditd --sweep-steps 10,20,30 \\
        --sweep-guidance 1.5,3,5                                           # settings sweep
    python tools/eval_default.py --ditd build/ditd --crosscheck      # ditd vs Diffusers
    python tools/eval_default.py --ditd build/ditd --timing          # ms per image

Without a sweep it writes the 10 x 8 contact sheet (rows = classes, columns = seeds
--seed .. --seed+7) to --sheet (docs/fashion-dit-samples.png). --json FILE saves the
numbers. The cross-check runs Diffusers (PyTorch) on the same noise (`--latents`) and
compares the final latents (`--save-latents`) and the PNG.
"""

import argparse
import base64
import concurrent.futures
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
sys.path.insert(0, str(TOOLS))
from train_classifier import classify, load_classifier  # noqa: E402
from train_default import CLASSES  # noqa: E402


def png_to_u8(data):
    img = Image.open(io.BytesIO(data))
    arr = np.asarray(img.convert("L"))
    if arr.shape != (28, 28):
        raise SystemExit(f"expected a 28x28 image, got {arr.shape}")
    return arr


class CliBackend:
    def __init__(self, args):
        self.ditd, self.model, self.args = args.ditd, args.model, args
        self.tmp = tempfile.mkdtemp(prefix="ditd-eval-")

    def settings(self, steps, guidance, sampler):
        out = []
        if steps is not None:
            out += ["--steps", str(steps)]
        if guidance is not None:
            out += ["--guidance", str(guidance)]
        if sampler is not None:
            out += ["--sampler", sampler]
        return out

    def one(self, cls, seed, steps, guidance, sampler):
        path = os.path.join(self.tmp, f"c{cls}-s{seed}-{os.getpid()}-{time.monotonic_ns()}.png")
        cmd = [self.ditd, "generate", "--model", self.model, "--class", str(cls), "--seed",
               str(seed), "-q", "--threads", str(self.args.threads), "-o", path]
        cmd += self.settings(steps, guidance, sampler)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
        with open(path, "rb") as f:
            data = f.read()
        os.unlink(path)
        return png_to_u8(data)


class HttpBackend:
    def __init__(self, args):
        self.url = args.url.rstrip("/") + "/v1/images/generations"
        self.name, self.args = args.model_name, args

    def one(self, cls, seed, steps, guidance, sampler):
        body = {"model": self.name, "prompt": CLASSES[cls], "n": 1, "seed": seed,
                "response_format": "b64_json"}
        if steps is not None:
            body["num_inference_steps"] = steps
        if guidance is not None:
            body["guidance_scale"] = guidance
        if sampler is not None:
            body["sampler"] = sampler
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.args.http_timeout) as r:
                reply = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise SystemExit(f"POST {self.url} {body}: HTTP {e.code}: {e.read()[:500]!r}")
        return png_to_u8(base64.b64decode(reply["data"][0]["b64_json"]))


def generate_all(backend, args, steps, guidance, sampler):
    """uint8 images (10, n, 28, 28); image j of each class has seed args.seed + j."""
    jobs = [(c, j) for c in range(len(CLASSES)) for j in range(args.n)]
    out = np.zeros((len(CLASSES), args.n, 28, 28), np.uint8)
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
        futs = {ex.submit(backend.one, c, args.seed + j, steps, guidance, sampler): (c, j)
                for c, j in jobs}
        for f in concurrent.futures.as_completed(futs):
            c, j = futs[f]
            out[c, j] = f.result()
    return out, time.time() - t0


def score(net, images):
    per_class = []
    for c in range(len(CLASSES)):
        per_class.append(float((classify(net, images[c]) == c).mean()))
    return per_class


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def contact_sheet(images, path, cols=8, scale=3):
    margin, pad = 110, 2
    cell = 28 * scale + pad
    sheet = Image.new("L", (margin + cols * cell + pad, len(CLASSES) * cell + pad), 255)
    draw = ImageDraw.Draw(sheet)
    for c in range(len(CLASSES)):
        y = pad + c * cell
        draw.text((6, y + 28 * scale // 2 - 6), f"{c} {CLASSES[c]}", fill=0)
        for j in range(cols):
            tile = Image.fromarray(images[c, j]).resize((28 * scale, 28 * scale), Image.NEAREST)
            sheet.paste(tile, (margin + pad + j * cell, y))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path, optimize=True)


def model_defaults(model_dir):
    p = Path(model_dir) / "ditd.json"
    d = json.loads(p.read_text()) if p.exists() else {}
    return d.get("num_inference_steps"), d.get("guidance_scale"), d.get("sampler")


def run_eval(backend, net, args):
    d_steps, d_guid, d_samp = model_defaults(args.model)
    cpu0 = child_cpu()
    images, wall = generate_all(backend, args, args.steps, args.guidance, args.sampler)
    cpu = child_cpu() - cpu0
    acc = score(net, images)
    n_img = images.shape[0] * images.shape[1]
    steps = args.steps if args.steps is not None else d_steps
    guid = args.guidance if args.guidance is not None else d_guid
    samp = args.sampler if args.sampler is not None else d_samp
    print(f"settings: steps {steps}, guidance {guid}, sampler {samp} "
          f"({'as given' if args.steps or args.guidance or args.sampler else 'the model defaults'}); "
          f"{args.n} images per class, seeds {args.seed}..{args.seed + args.n - 1}")
    print("| class | accuracy |\n| --- | --- |")
    for c, a in enumerate(acc):
        print(f"| {c} {CLASSES[c]} | {a * 100:.1f}% |")
    overall = float(np.mean(acc))
    print(f"| overall | {overall * 100:.1f}% |")
    print(f"{n_img} images in {wall:.1f} s wall"
          + (f", {cpu / n_img * 1000:.0f} ms CPU per image (ditd processes)" if args.ditd else ""))
    if args.sheet:
        contact_sheet(images, args.sheet)
        print(f"wrote {args.sheet}")
    return {"steps": steps, "guidance": guid, "sampler": samp, "n": args.n, "seed": args.seed,
            "per_class": dict(zip(CLASSES, acc)), "overall": overall,
            "wall_s": wall, "cpu_ms_per_image": cpu / n_img * 1000 if args.ditd else None}


def run_sweep(backend, net, args):
    steps_list = [int(s) for s in args.sweep_steps.split(",")]
    guid_list = [float(g) for g in args.sweep_guidance.split(",")]
    sampler = args.sampler
    rows = []
    for st in steps_list:
        for g in guid_list:
            cpu0 = child_cpu()
            images, wall = generate_all(backend, args, st, g, sampler)
            cpu = child_cpu() - cpu0
            acc = score(net, images)
            n_img = images.shape[0] * images.shape[1]
            row = {"steps": st, "guidance": g, "sampler": sampler, "overall": float(np.mean(acc)),
                   "per_class": dict(zip(CLASSES, acc)), "wall_s": wall,
                   "cpu_ms_per_image": cpu / n_img * 1000 if args.ditd else None}
            rows.append(row)
            worst = min(range(len(acc)), key=lambda c: acc[c])
            print(f"steps {st:3d} guidance {g:4.1f}: overall {row['overall'] * 100:5.1f}%, "
                  f"worst {CLASSES[worst]} {acc[worst] * 100:.0f}%, {wall:.0f} s wall"
                  + (f", {row['cpu_ms_per_image']:.0f} ms CPU/image" if args.ditd else ""),
                  flush=True)
    print(f"\noverall accuracy, {args.n} images per class, sampler {sampler or 'model default'}:\n")
    print("| steps \\ guidance | " + " | ".join(f"{g:g}" for g in guid_list) + " | ms CPU/image |")
    print("| --- |" + " --- |" * (len(guid_list) + 1))
    for st in steps_list:
        r = [x for x in rows if x["steps"] == st]
        ms = np.mean([x["cpu_ms_per_image"] for x in r]) if args.ditd else float("nan")
        print(f"| {st} | " + " | ".join(f"{x['overall'] * 100:.1f}%" for x in r) + f" | {ms:.0f} |")
    print("\nper class:\n")
    print("| steps | guidance | " + " | ".join(CLASSES) + " |")
    print("| --- | --- |" + " --- |" * len(CLASSES))
    for x in rows:
        print(f"| {x['steps']} | {x['guidance']:g} | "
              + " | ".join(f"{x['per_class'][c] * 100:.0f}" for c in CLASSES) + " |")
    return rows


def run_timing(args):
    d_steps, d_guid, d_samp = model_defaults(args.model)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for threads in (1, 2):
            ts = []
            for rep in range(args.timing_reps):
                cmd = [args.ditd, "generate", "--model", args.model, "--class", str(rep % 10),
                       "--seed", str(rep), "-q", "--threads", str(threads), "-o", f"{tmp}/t.png"]
                cmd += CliBackend.settings(None, args.steps, args.guidance, args.sampler)
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True)
                ts.append((time.perf_counter() - t0) * 1000)
            out[threads] = statistics.median(ts)
            print(f"--threads {threads}: median {out[threads]:.0f} ms per image "
                  f"(whole `ditd generate` process, one image, {args.timing_reps} runs: "
                  + ", ".join(f"{t:.0f}" for t in ts) + ")")
    print(f"settings: steps {args.steps or d_steps}, guidance {args.guidance or d_guid}, "
          f"sampler {args.sampler or d_samp}")
    return out


def run_crosscheck(args):
    """ditd vs a DiTPipeline-style loop in Diffusers on the same noise."""
    import torch
    from diffusers import DiTTransformer2DModel, FlowMatchEulerDiscreteScheduler
    from diffusers import DDIMScheduler, DPMSolverMultistepScheduler
    from make_fixtures import sample_dit

    torch.set_num_threads(args.threads)
    d_steps, d_guid, d_samp = model_defaults(args.model)
    steps = args.steps or d_steps
    guid = args.guidance if args.guidance is not None else d_guid
    samp = args.sampler or d_samp
    model = DiTTransformer2DModel.from_pretrained(Path(args.model) / "transformer",
                                                  torch_dtype=torch.float32).eval()
    base = FlowMatchEulerDiscreteScheduler.from_pretrained(Path(args.model) / "scheduler")
    cls = {"flow-euler": FlowMatchEulerDiscreteScheduler, "ddim": DDIMScheduler,
           "dpmpp-2m": DPMSolverMultistepScheduler}[samp]
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for c in range(len(CLASSES)):
            noise = np.random.default_rng(1000 + c).standard_normal((1, 1, 28, 28)).astype(np.float32)
            np.save(f"{tmp}/x.npy", noise)
            cmd = [args.ditd, "generate", "--model", args.model, "--class", str(c), "-q",
                   "--threads", str(args.threads), "--latents", f"{tmp}/x.npy",
                   "--save-latents", f"{tmp}/y.npy", "-o", f"{tmp}/y.png",
                   "--steps", str(steps), "--guidance", str(guid), "--sampler", samp]
            subprocess.run(cmd, check=True)
            ours = np.load(f"{tmp}/y.npy")
            sched = cls.from_config(base.config)
            with torch.no_grad():
                ref = sample_dit(model, sched, [c], noise, guid, steps,
                                 model.config.num_embeds_ada_norm).numpy()
            rel = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))
            mx = float(np.abs(ours - ref).max())
            pix_ref = np.round(np.clip(ref[0, 0] / 2 + 0.5, 0, 1) * 255).astype(int)
            pix = np.asarray(Image.open(f"{tmp}/y.png").convert("L")).astype(int)
            dpix = int(np.abs(pix - pix_ref).max())
            worst = max(worst, rel)
            print(f"class {c} {CLASSES[c]:12s}: final latents max |diff| {mx:.2e}, "
                  f"relative {rel:.2e}; PNG max pixel diff {dpix}")
    print(f"cross-check ({samp}, {steps} steps, guidance {guid}): worst relative error {worst:.2e}")
    if worst > args.crosscheck_tol:
        raise SystemExit(f"cross-check failed: {worst:.2e} > {args.crosscheck_tol:g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--url", help="a running ditd serve, e.g. http://127.0.0.1:8080")
    how.add_argument("--ditd", help="the ditd binary, e.g. build/ditd")
    ap.add_argument("--model", default=str(REPO / "models" / "fashion-dit"),
                    help="model folder (CLI mode; its ditd.json names the defaults)")
    ap.add_argument("--model-name", default="fashion-dit", help="model name (HTTP mode)")
    ap.add_argument("--classifier", default=str(TOOLS / "fashion_classifier.pt"))
    ap.add_argument("--n", type=int, default=50, help="images per class")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--guidance", type=float)
    ap.add_argument("--sampler", choices=["flow-euler", "ddim", "dpmpp-2m"])
    ap.add_argument("--jobs", type=int, default=1, help="requests / processes at a time")
    ap.add_argument("--threads", type=int, default=1, help="ditd --threads (CLI mode)")
    ap.add_argument("--http-timeout", type=float, default=300)
    ap.add_argument("--sheet", default=str(REPO / "docs" / "fashion-dit-samples.png"),
                    help="contact sheet PNG ('' for none)")
    ap.add_argument("--sweep-steps", help="comma-separated steps for a sweep, e.g. 10,20,30")
    ap.add_argument("--sweep-guidance", help="comma-separated guidance scales, e.g. 1.5,3,5")
    ap.add_argument("--crosscheck", action="store_true", help="ditd vs Diffusers (CLI mode)")
    ap.add_argument("--crosscheck-tol", type=float, default=1e-4)
    ap.add_argument("--timing", action="store_true", help="ms per image, --threads 1 and 2")
    ap.add_argument("--timing-reps", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    if args.ditd and not os.access(args.ditd, os.X_OK):
        ap.error(f"--ditd {args.ditd}: not an executable (build it: meson setup build && ninja -C build)")
    if (args.crosscheck or args.timing) and not args.ditd:
        ap.error("--crosscheck and --timing need --ditd")
    if args.crosscheck:
        run_crosscheck(args)
        return
    if args.timing:
        res = run_timing(args)
    else:
        import torch
        torch.set_num_threads(1)
        net = load_classifier(args.classifier)
        backend = CliBackend(args) if args.ditd else HttpBackend(args)
        if args.sweep_steps or args.sweep_guidance:
            if not (args.sweep_steps and args.sweep_guidance):
                ap.error("a sweep needs --sweep-steps and --sweep-guidance")
            res = run_sweep(backend, net, args)
        else:
            res = run_eval(backend, net, args)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
