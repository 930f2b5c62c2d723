#!/usr/bin/env python3
"""Start-up of `ditd serve` (one process), before and after a change: time to
/readyz 200 and how often each config file of the folder is opened.

    bench/startup.py --a OLD/ditd --b NEW/ditd [--runs 3] FOLDER...

Prints one table row per (folder, binary): the median and range of the
seconds from exec to the first 200 from /readyz over --runs starts, and (with
strace installed, one more start) the opens of model_index.json and of each
component's config.json / scheduler_config.json under the folder, as
"file x count". Timings are wall time on a shared machine: compare A and B
in one run, as ratios. Not a test.
"""
import argparse
import collections
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(binary, folder, wrap=()):
    port = free_port()
    cmd = list(wrap) + [binary, "serve", "--model", folder, "--host", "127.0.0.1",
                        "--port", str(port)]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        if p.poll() is not None:
            raise SystemExit(f"{binary} serve {folder} exited {p.returncode} before ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    break
        except Exception:
            pass
        if time.monotonic() - t0 > 300:
            p.kill()
            raise SystemExit(f"{binary} serve {folder}: not ready in 300 s")
        time.sleep(0.02)
    dt = time.monotonic() - t0
    return p, dt


def stop(p):
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def opens(binary, folder):
    if not shutil.which("strace"):
        return None
    with tempfile.NamedTemporaryFile(suffix=".strace") as log:
        p, _ = start(binary, folder, ["strace", "-f", "-qq", "-e", "trace=openat", "-o", log.name])
        # strace is the parent: stop the server it traces
        for line in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                   text=True).stdout.split():
            os.kill(int(line), 15)
        p.wait(60)
        text = open(log.name, encoding="latin-1").read()
    root = os.path.abspath(folder).rstrip("/") + "/"
    c = collections.Counter()
    for m in re.finditer(r'openat\([^,]*, "([^"]+)"[^=]*= (-?\d+)', text):
        path, fd = m.group(1), int(m.group(2))
        if fd < 0:
            continue
        full = os.path.abspath(path)
        if full.startswith(root) and (full.endswith("config.json") or
                                      full.endswith("model_index.json")) and \
                "tokenizer" not in full:
            c[full[len(root):]] += 1
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="the ditd before")
    ap.add_argument("--b", required=True, help="the ditd after")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("folders", nargs="+")
    args = ap.parse_args()
    print("| folder | ditd | ready (s, median) | min | max | config opens (total) | per file |")
    print("|---|---|---|---|---|---|---|")
    for folder in args.folders:
        for name, binary in (("A", args.a), ("B", args.b)):
            times = []
            for _ in range(args.runs):
                p, dt = start(binary, folder)
                stop(p)
                times.append(dt)
            c = opens(binary, folder)
            per = ", ".join(f"{k} x{v}" for k, v in sorted(c.items())) if c is not None else "(no strace)"
            tot = sum(c.values()) if c is not None else "-"
            print(f"| {os.path.basename(folder.rstrip('/'))} | {name} | {statistics.median(times):.2f} "
                  f"| {min(times):.2f} | {max(times):.2f} | {tot} | {per} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
