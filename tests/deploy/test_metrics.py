#!/usr/bin/env python3
"""The operator series of GET /metrics against what the system says
independently: ditd_build_info's version and commit against meson and git,
ditd_model_load_seconds against the process's uptime, process_* against
/proc/PID of the daemon (read from outside), and CPU time growing with work.

usage: test_metrics.py --ditd BUILD/ditd --version V
exit 0 pass, 1 fail."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.environ.get("DITD_FIXTURES", os.path.join(ROOT, "tests", "fixtures"))
failures = []


def check(cond, what, got=None, want=None):
    print(("ok   " if cond else "FAIL ") + what + ("" if cond or (got is None and want is None)
                                                  else f": got {got!r}, want {want!r}"))
    if not cond:
        failures.append(what)


def scrape(base):
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return text, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ditd", required=True)
    ap.add_argument("--version", required=True)
    args = ap.parse_args()
    log = tempfile.NamedTemporaryFile("w+", prefix="ditd-metrics-", suffix=".log", delete=False)
    t_launch = time.time()
    p = subprocess.Popen([args.ditd, "serve", "--model", os.path.join(FIXTURES, "models", "tiny-p4-c1-h3"),
                          "--host", "127.0.0.1", "--port", "0", "--threads", "1"],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        port = None
        while port is None and time.time() - t_launch < 60:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log.name).read())
            port = m and int(m.group(1))
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        while urllib.request.urlopen(base + "/healthz", timeout=10).status != 200:
            time.sleep(0.05)
        time.sleep(0.3)  # let the replica's ready heartbeat land
        text, m = scrape(base)

        info = [k for k in m if k.startswith("ditd_build_info{")]
        check(len(info) == 1 and m[info[0]] == 1, "one ditd_build_info series, value 1", info)
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', info[0])) if info else {}
        check(labels.get("version") == args.version, "build_info version is meson's",
              labels.get("version"), args.version)
        # a commit of this checkout (HEAD when built; the tree may have moved
        # on since the binary was built, so any commit git knows)
        if subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True).returncode == 0:
            commit = labels.get("commit", "").removesuffix("-dirty")
            known = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "-q", commit + "^{commit}"],
                                   capture_output=True).returncode == 0
            check(len(commit) >= 7 and known, "build_info commit is a commit of this checkout",
                  labels.get("commit"))
        check(labels.get("backend") == "cpu", "build_info backend", labels.get("backend"), "cpu")
        cpu_model = ""
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
        check(labels.get("device") == (cpu_model or "unknown"), "build_info device is the CPU model",
              labels.get("device"), cpu_model)

        load = [v for k, v in m.items() if k.startswith("ditd_model_load_seconds{") and 'replica="0"' in k]
        check(len(load) == 1 and 0 < load[0] < time.time() - t_launch,
              "model load seconds of replica 0 within the uptime", load, time.time() - t_launch)

        statm = open(f"/proc/{p.pid}/statm").read().split()
        rss = int(statm[1]) * os.sysconf("SC_PAGESIZE")
        got = m.get("process_resident_memory_bytes", 0)
        check(abs(got - rss) < 0.1 * rss, "process RSS matches /proc/PID/statm", got, rss)
        fds = len(os.listdir(f"/proc/{p.pid}/fd"))
        got = m.get("process_open_fds", -1)
        check(abs(got - fds) <= 2, "process_open_fds matches /proc/PID/fd", got, fds)
        limit = [l for l in open(f"/proc/{p.pid}/limits") if l.startswith("Max open files")][0].split()[3]
        check(m.get("process_max_fds") == float(limit), "process_max_fds is the soft limit",
              m.get("process_max_fds"), limit)
        start = m.get("process_start_time_seconds", 0)
        check(abs(start - t_launch) < 5, "process_start_time_seconds is when we started it", start, t_launch)

        cpu0 = m.get("process_cpu_seconds_total", -1)
        body = json.dumps({"class_label": 1, "n": 4, "num_inference_steps": 40, "seed": 3}).encode()
        req = urllib.request.Request(base + "/v1/images/generations", body,
                                     {"Content-Type": "application/json"})
        check(urllib.request.urlopen(req, timeout=120).status == 200, "a generation")
        _, m2 = scrape(base)
        own = sum(int(x) for x in open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[11:13])
        own /= os.sysconf("SC_CLK_TCK")
        cpu1 = m2.get("process_cpu_seconds_total", -1)
        check(cpu1 > cpu0 >= 0, "CPU seconds grow with work", cpu1, f"> {cpu0}")
        check(abs(cpu1 - own) < 0.05 + 0.1 * own, "CPU seconds match /proc/PID/stat", cpu1, own)
        check("TYPE process_cpu_seconds_total counter" in text, "cpu seconds typed as a counter")
    finally:
        p.terminate()
        rc = p.wait(timeout=30)
        check(rc == 0, "drained and exited 0", rc, 0)
        if failures:
            print(open(log.name).read()[-2000:])
        os.unlink(log.name)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
