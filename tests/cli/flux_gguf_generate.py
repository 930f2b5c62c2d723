#!/usr/bin/env python3
"""ditd generate on FLUX with a GGUF transformer and a GGUF T5 (issue 25).

An otherwise ordinary FluxPipeline folder (the assembled dev/: scheduler,
VAE, CLIP, tokenizers) whose transformer/ and text_encoder_2/ hold only
their config.json (tests/fixtures/gguf_t5/pipeline), and the weights given
as files beside it, the way a ComfyUI / stable-diffusion.cpp download is
paired with a Diffusers folder:

  ditd generate --transformer-file flux-q8_0.gguf --text-encoder-2-file t5-q8_0.gguf

must give Diffusers' FluxPipeline final latents (float64 on the gguf
package's dequantized weights, tools/make_gguf_t5_fixtures.py) within 1e-4
relative; the same folder with the two .gguf files inside transformer/ and
text_encoder_2/ (no flags) the same latents bit for bit. Then the refusals,
each naming what is wrong: a missing file, a file that is no .gguf or
.safetensors, a transformer file of another model (a tensor's shape), a T5
file of another model (a tensor's shape). ditd serve with the same flags
answers a generation and names both files' storage in /v1/models; a
missing file fails its start. Stdlib only.

usage: flux_gguf_generate.py DITD FLUX_PIPELINE_DIR FIXTURES_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ditd, pipes, fix = sys.argv[1:4]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wan_generate_util import read_npy  # noqa: E402

failures = []
checks = 0


def check(ok, msg):
    global checks
    checks += 1
    print(("ok   " if ok else "FAIL ") + msg)
    if not ok:
        failures.append(msg)


src = os.path.join(fix, "gguf_t5", "pipeline")
meta = json.load(open(os.path.join(src, "expected", "cases.json")))
tmp = tempfile.mkdtemp(prefix="flux_gguf.")
model = os.path.join(tmp, "flux-gguf")
shutil.copytree(os.path.join(pipes, "dev"), model)
for comp in ("transformer", "text_encoder_2"):
    shutil.rmtree(os.path.join(model, comp))
    os.makedirs(os.path.join(model, comp))
    shutil.copy(os.path.join(src, comp, "config.json"), os.path.join(model, comp))
tfile = os.path.join(src, "flux-q8_0.gguf")
t5file = os.path.join(src, "t5-q8_0.gguf")


def generate(extra, out):
    args = [ditd, "generate", "-q", "--model", model, "--prompt", meta["prompt"],
            "--size", "%dx%d" % (meta["width"], meta["height"]), "--steps", str(meta["steps"]),
            "--guidance", str(meta["guidance"]), "--max-sequence-length",
            str(meta["max_sequence_length"]), "--threads", "2",
            "--latents", os.path.join(src, "expected", meta["noise"]),
            "--save-latents", out + ".npy", "-o", out + ".png"] + extra
    return subprocess.run(args, capture_output=True, text=True)


def rel(got, want):
    m = max(abs(w) for w in want)
    return max(abs(g - w) for g, w in zip(got, want)) / m


wshape, want = read_npy(os.path.join(src, "expected", meta["final_latents"]))
r = generate(["--transformer-file", tfile, "--text-encoder-2-file", t5file], os.path.join(tmp, "a"))
check(r.returncode == 0, "--transformer-file + --text-encoder-2-file runs: %s" % r.stderr.strip()[-300:])
a = None
if r.returncode == 0:
    shape, a = read_npy(os.path.join(tmp, "a.npy"))
    e = rel(a, want)
    check(shape == wshape and e <= 1e-4,
          "final latents %s vs Diffusers float64 on the dequantized weights: rel %.3g (tol 1e-4)"
          % (shape, e))

# the same files inside the component folders, no flags
shutil.copy(tfile, os.path.join(model, "transformer"))
shutil.copy(t5file, os.path.join(model, "text_encoder_2"))
r = generate([], os.path.join(tmp, "b"))
check(r.returncode == 0, "transformer/ and text_encoder_2/ holding a .gguf: %s" % r.stderr.strip()[-300:])
if r.returncode == 0 and a is not None:
    _, b = read_npy(os.path.join(tmp, "b.npy"))
    check(b == a, "the folders' .gguf files give the flags' latents bit for bit")
for comp, name in (("transformer", "flux-q8_0.gguf"), ("text_encoder_2", "t5-q8_0.gguf")):
    os.remove(os.path.join(model, comp, name))

# refusals, each naming what is wrong
other_flux = os.path.join(fix, "flux_gguf", "q4_k", "q4_k.gguf")
other_t5 = os.path.join(fix, "gguf_t5", "t5-q8_0", "t5-q8_0.gguf")
cases = [
    (["--transformer-file", os.path.join(tmp, "missing.gguf"), "--text-encoder-2-file", t5file],
     ["--transformer-file", "missing.gguf", "no such file"]),
    (["--transformer-file", os.path.join(src, "expected", "cases.json"),
      "--text-encoder-2-file", t5file], [".gguf or .safetensors"]),
    (["--transformer-file", other_flux, "--text-encoder-2-file", t5file], ["has shape", "expected"]),
    (["--transformer-file", tfile, "--text-encoder-2-file", other_t5], ["shared.weight", "shape"]),
]
for extra, words in cases:
    r = generate(extra, os.path.join(tmp, "x"))
    said = r.stderr
    check(r.returncode != 0 and all(w in said for w in words),
          "refused (%s): exit %d, says %r" % (" ".join(os.path.basename(x) for x in extra),
                                               r.returncode, said.strip()[-300:]))

# ditd serve takes the same flags: a request served from the GGUF files
# (the start refuses a missing file before it listens)
r = subprocess.run([ditd, "serve", "--model", model, "--port", "0",
                    "--transformer-file", os.path.join(tmp, "missing.gguf")],
                   capture_output=True, text=True, timeout=60)
check(r.returncode != 0 and "missing.gguf: no such file" in r.stderr,
      "ditd serve --transformer-file missing.gguf refused at start: %r" % r.stderr.strip()[-200:])
srv = subprocess.Popen([ditd, "serve", "--model", model, "--port", "0", "--threads", "2",
                        "--transformer-file", tfile, "--text-encoder-2-file", t5file],
                       stderr=subprocess.PIPE, text=True)
try:
    port = None
    for line in srv.stderr:
        if "listening on http://127.0.0.1:" in line:
            port = int(line.split("127.0.0.1:")[1].split()[0])
            break
    check(port is not None, "ditd serve with the GGUF files listens")
    if port:
        import base64
        import time
        import urllib.request
        body = json.dumps({"prompt": meta["prompt"], "size": "32x32", "num_inference_steps": 2,
                           "response_format": "b64_json"}).encode()
        got = None
        for _ in range(120):  # the replica loads behind the listening socket
            try:
                req = urllib.request.Request("http://127.0.0.1:%d/v1/images/generations" % port,
                                             data=body, headers={"content-type": "application/json"})
                got = json.load(urllib.request.urlopen(req, timeout=120))
                break
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise
                time.sleep(0.5)
        png = base64.b64decode(got["data"][0]["b64_json"]) if got else b""
        check(png[:8] == b"\x89PNG\r\n\x1a\n", "ditd serve answers a generation from the GGUF files")
        # /v1/models names both files' storage: GGUF, their Q8_0 tensors
        m = json.load(urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % port,
                                             timeout=30))["data"][0]
        st = m.get("storage") or {}
        tr, te = st.get("transformer") or {}, st.get("text_encoder_2") or {}
        check(tr.get("format") == "gguf" and tr.get("types", {}).get("Q8_0", 0) > 0
              and te.get("format") == "gguf" and te.get("types", {}).get("Q8_0", 0) > 0
              and tr.get("bytes", 0) < os.path.getsize(tfile)
              and te.get("bytes", 0) < os.path.getsize(t5file)
              and st.get("text_encoder", {}).get("format") == "safetensors",
              "/v1/models storage: transformer and text_encoder_2 GGUF with Q8_0 tensors, "
              "text_encoder safetensors: %r" % {k: (v.get("format"), v.get("types"))
                                                for k, v in st.items()})
finally:
    srv.terminate()
    srv.wait(timeout=60)

shutil.rmtree(tmp, ignore_errors=True)
if checks < 12:
    failures.append("only %d checks ran (want 12)" % checks)
print("%d checks, %d failed" % (checks, len(failures)))
sys.exit(1 if failures else 0)
