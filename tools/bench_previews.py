#!/usr/bin/env python3
"""What previews cost: a 28-step streamed request with partial_images 0, 1 and 3 on `ditd serve`.

What it is: issue 23's preview benchmark. It starts `ditd serve` on a latent model folder (default
the tiny FLUX.1-dev folder the build assembles, build/tests/golden/flux_pipeline/dev), and for each
--sizes size sends a 28-step (--steps) streamed generation with partial_images 0, 1 and 3, rounds
interleaved (--repeat), timing each request from the POST to its completed event; it prints the
median ms per request, wall (the POST to the completed event) and the daemon's CPU time over the
request (all its threads, /proc: the figure a busy shared machine disturbs least), and the extra
CPU ms per preview ((c_k - c_0) / k). A preview is one VAE
decode of x0 on the replica, so the extra per preview should be one decode; with --vae-bench it
also times `ditd bench --vae flux-vae --size S` (FLUX.1's VAE shape, random weights) for the
sizes given there: the cost one preview has on a FLUX-sized VAE.

What it is not: a test (it asserts nothing), or a measure of quality.

    build/http-venv/bin/python tools/bench_previews.py [--sizes 64 256] [--repeat 3]
        [--vae-bench 512]
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "http"))
from test_http import Daemon  # noqa: E402


def cpu_ms(pid):
    """CPU time of the process, all its threads (user + system), ms."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


def timed_stream(d, body):
    """(ms from the POST to the completed event, partial images seen, last progress elapsed_ms,
    the daemon's CPU ms for the request)."""
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=3600)
    c0 = cpu_ms(d.proc.pid)
    t0 = time.perf_counter()
    c.request("POST", "/v1/images/generations", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    parts, elapsed, ev, t_done = 0, None, None, None
    for raw in r:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            ev = line[6:].strip()
            if ev.endswith("partial_image"):
                parts += 1
        elif line.startswith("data:") and ev and ev.endswith("progress"):
            elapsed = json.loads(line[5:])["elapsed_ms"]
        elif line.startswith("data:") and ev and ev.endswith("completed"):
            t_done = time.perf_counter()
    c.close()
    return (t_done - t0) * 1e3 if t_done else None, parts, elapsed, cpu_ms(d.proc.pid) - c0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ditd", default=str(ROOT / "build" / "ditd"))
    ap.add_argument("--model", default=str(ROOT / "build" / "tests" / "golden" / "flux_pipeline" / "dev"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vae-bench", type=int, nargs="*", default=[])
    a = ap.parse_args()
    d = Daemon(a.ditd, "--dtype", "f32", "--threads", str(a.threads),
               model=a.model)
    mid = os.path.basename(a.model.rstrip("/"))
    rows = []
    try:
        for size in a.sizes:
            base = {"model": mid, "prompt": "a lighthouse on a cliff at dusk", "size": f"{size}x{size}",
                    "seed": 1, "num_inference_steps": a.steps, "stream": True}
            timed_stream(d, dict(base, partial_images=1))  # warm-up: the size's plans
            t = {k: [] for k in (0, 1, 3)}
            cpu = {k: [] for k in (0, 1, 3)}
            for _ in range(a.repeat):
                for k in (0, 1, 3):
                    ms, parts, elapsed, cms = timed_stream(d, dict(base, partial_images=k))
                    assert ms is not None and parts == k, (size, k, parts)
                    t[k].append(ms)
                    cpu[k].append(cms)
            med = {k: statistics.median(v) for k, v in t.items()}
            cmed = {k: statistics.median(v) for k, v in cpu.items()}
            rows.append((size, med, cmed))
            print(f"{size}x{size}: wall " + ", ".join(f"{k}: {med[k]:.0f}" for k in (0, 1, 3)) +
                  " ms; CPU " + ", ".join(f"{k}: {cmed[k]:.0f}" for k in (0, 1, 3)) +
                  f" ms; CPU per preview {(cmed[1] - cmed[0]):.1f} / {(cmed[3] - cmed[0]) / 3:.1f} ms "
                  f"(all runs: wall {t}, CPU {cpu})", flush=True)
    finally:
        d.stop()
    print("\n| size | CPU ms, 0 / 1 / 3 previews | CPU ms per preview (from 1 / from 3) | "
          "wall ms, 0 / 1 / 3 previews |")
    print("| --- | --- | --- | --- |")
    for size, med, cmed in rows:
        print(f"| {size}x{size} | {cmed[0]:.0f} / {cmed[1]:.0f} / {cmed[3]:.0f} | "
              f"{cmed[1] - cmed[0]:.1f} / {(cmed[3] - cmed[0]) / 3:.1f} | "
              f"{med[0]:.0f} / {med[1]:.0f} / {med[3]:.0f} |")
    for size in a.vae_bench:
        r = subprocess.run([a.ditd, "bench", "--vae", "flux-vae", "--size", str(size), "--threads",
                            str(a.threads), "--iters", "1", "--warmup", "0"], capture_output=True,
                           text=True, timeout=3600)
        print(f"\nditd bench --vae flux-vae --size {size}:\n{r.stdout.strip()}\n{r.stderr.strip()[-500:]}")


if __name__ == "__main__":
    main()
