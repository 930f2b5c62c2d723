#!/usr/bin/env python3
"""`ditd serve` under hostile and careless clients (issue 12): one case per
defect found, each a real daemon on 127.0.0.1 and raw sockets or real
clients, each bounded in time. Exit 0 pass, 1 fail, 77 skip.

Loopback is all of 127.0.0.0/8: a test that needs "another client address"
binds its socket to 127.0.0.2.. and still talks to 127.0.0.1 only.

usage: test_abuse.py --ditd BUILD/ditd CASE
"""
import argparse
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http as th  # noqa: E402
from test_http import GEN, MODEL, MODEL_ID, Daemon, check  # noqa: E402


# ---------------------------------------------------------------- helpers

_pending = {}  # bytes read past a response, by socket (pipelining)

def conn(port, src="127.0.0.1", timeout=5.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    if src != "127.0.0.1":
        s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    _pending.pop(s.fileno(), None)  # a closed socket's leftovers are not this one's
    return s


def read_response(s, timeout=5.0):
    """One whole HTTP/1.1 response from s (skipping 1xx): (status, headers, body),
    or (None, {}, b"") when the peer closed or nothing came in time. Bytes
    past the response (pipelining) are kept for the next call."""
    s.settimeout(timeout)
    buf = _pending.pop(s.fileno(), b"")
    deadline = time.time() + timeout

    def more():
        if time.time() > deadline:
            return False
        try:
            chunk = s.recv(65536)
        except (socket.timeout, OSError):
            return False
        return chunk

    while True:
        while b"\r\n\r\n" not in buf:
            chunk = more()
            if not chunk:
                return None, {}, buf
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            return "bad status line: " + lines[0][:40], {}, b""
        status = int(parts[1])
        hdrs = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if 100 <= status < 200:
            continue
        n = int(hdrs.get("content-length", "0"))
        while len(buf) < n:
            chunk = more()
            if not chunk:
                break
            buf += chunk
        if len(buf) > n:
            _pending[s.fileno()] = buf[n:]
        return status, hdrs, buf[:n]


def raw_get(path, rid=None):
    extra = f"X-Request-Id: {rid}\r\n" if rid else ""
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def raw_post(path, body, ctype="application/json", extra=""):
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def timed_health(port, src="127.0.0.2", timeout=5.0):
    """(status, seconds) of GET /healthz on a fresh connection from src."""
    t0 = time.time()
    try:
        s = conn(port, src, timeout)
        s.sendall(raw_get("/healthz"))
        st, _, _ = read_response(s, timeout)
        s.close()
    except OSError:
        st = None
    return st, time.time() - t0


def counter(m, route, status):
    return m.get('ditd_http_requests_total{route="%s",status="%d"}' % (route, status), 0)


# ---------------------------------------------------------------- cases

def case_conn_limit(ditd):
    """Defect 1: past --max-connections a client gets a 503 at once, and when
    connections close again new ones are served at once (8 of 8 tries); at
    the limit, a connection idle (or trickling) for over a second gives its
    place to a newcomer."""
    d = Daemon(ditd, "--max-connections", "8")
    try:
        served = 0
        for attempt in range(8):
            hold = [conn(d.port) for _ in range(8)]
            time.sleep(0.2)
            t0 = time.time()
            s = conn(d.port)
            s.sendall(raw_get("/healthz"))
            st, h, body = read_response(s, 3)
            dt = time.time() - t0
            s.close()
            if attempt == 0:
                check(st == 503 and dt < 2.0, f"over the limit: 503 at once ({dt:.2f} s)", st, 503)
                check(b"max-connections" in body and h.get("connection") == "close",
                      "the 503 names --max-connections and closes", body[:120])
            for x in hold:
                x.close()
            deadline = time.time() + 2.0
            while time.time() < deadline:
                st, dt = timed_health(d.port, "127.0.0.1", 2.0)
                if st == 200:
                    served += 1
                    break
                time.sleep(0.05)
        check(served == 8, "after the burst closes, a new connection is served within 2 s (8 tries)",
              served, 8)
        m = d.metrics()
        check(m.get('ditd_http_connections_refused_total{reason="capacity"}', 0) >= 8,
              "metrics: refused connections counted",
              m.get('ditd_http_connections_refused_total{reason="capacity"}'))
        # connections that sit for over a second without a request give
        # their place to a newcomer: idle sockets cannot hold every slot
        hold = [conn(d.port) for _ in range(8)]
        hold[3].sendall(b"GET /heal")  # one trickles
        time.sleep(1.3)
        served = sum(timed_health(d.port, "127.0.0.1", 3)[0] == 200 for _ in range(4))
        check(served == 4, "at the limit, connections idle over 1 s make room: 4 of 4 served", served, 4)
        m = d.metrics()
        check(m.get("ditd_http_evicted_total", 0) >= 1, "metrics: the eviction counted",
              m.get("ditd_http_evicted_total"))
        for x in hold:
            x.close()
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def case_slow_clients(ditd, n_slow=1000):
    """Defect 2: 1,000 clients trickling a byte at a time: the header deadline
    is total (bytes do not reset it), one address gets at most its cap, and
    /healthz from elsewhere answers at once all along."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n_slow + 200
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < want:
            n_slow = max(400, new - 200)
            print(f"note: descriptor limit {hard}: {n_slow} slow clients")
    d = Daemon(ditd, "--max-connections", "2000", "--max-connections-per-client", "300",
               "--header-timeout", "2", "--body-timeout", "2")
    socks = []
    try:
        # 300 from 127.0.0.1 are allowed, the 301st is refused at once
        for i in range(n_slow):
            src = "127.0.0.1" if i < 301 else f"127.0.1.{1 + i % 200}"
            try:
                s = conn(d.port, src, 5)
                s.setblocking(False)
                socks.append(s)
            except OSError as e:
                print(f"note: connection {i} failed: {e}")
        time.sleep(0.3)
        refused = 0
        for s in socks[:301]:
            try:
                if s.recv(4096).startswith(b"HTTP/1.1 503"):
                    refused += 1
            except (BlockingIOError, OSError):
                pass
        check(refused == 1, "a client address gets at most --max-connections-per-client", refused, 1)
        # trickle a byte every 0.25 s (a request that never ends) and probe
        # /healthz from another address meanwhile
        lat, bad, t0, closed = [], [], time.time(), 0
        line = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 10000
        pos = 0
        while time.time() - t0 < 4.0:
            for s in socks:
                try:
                    s.send(line[pos:pos + 1])
                except OSError:
                    pass
            pos += 1
            st, dt = timed_health(d.port, "127.0.0.2", 5)
            lat.append(dt)
            if st != 200:
                bad.append(st)
            time.sleep(0.25)
        check(not bad, f"/healthz answers 200 while {len(socks)} clients trickle", bad)
        lat.sort()
        check(lat[len(lat) // 2] < 0.5 and lat[-1] < 2.0,
              f"/healthz from another address stays fast (p50 {lat[len(lat)//2]*1e3:.0f} ms, "
              f"max {lat[-1]*1e3:.0f} ms, {len(lat)} probes)")
        # by now (4 s > --header-timeout 2 s) every trickler is closed,
        # although it sent a byte every 0.25 s
        for s in socks:
            try:
                data = s.recv(65536)
                if data == b"" or data.startswith(b"HTTP/1.1 408") or data.startswith(b"HTTP/1.1 503"):
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        check(closed >= len(socks) - 5, "the header deadline is total: the tricklers were closed",
              closed, len(socks))
        m = d.metrics()
        check(m.get("ditd_http_read_timeouts_total", 0) >= len(socks) - 301,
              "metrics: read timeouts counted", m.get("ditd_http_read_timeouts_total"))
    finally:
        for s in socks:
            s.close()
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def case_utf8(ditd):
    """Defect 3: an error message that quotes the client's bytes is still valid
    JSON: a prompt of 300 euro signs, a path of %ff; and /metrics counts them."""
    d = Daemon(ditd)
    try:
        st, h, body = d.generate(dict(GEN, prompt="\u20ac" * 300))
        ok = False
        try:
            ok = json.loads(body)["error"]["param"] == "prompt"
        except ValueError:
            pass
        check(st == 400 and ok, "a 300-character prompt of '\u20ac': 400 with a JSON body", (st, body[:80]))
        st, h, body = d.request("POST", "/v1/models/%ff")
        check(st == 405 and json.loads(body)["error"]["code"] == "method_not_allowed",
              "POST /v1/models/%ff: 405 with a JSON body", (st, body[:80]))
        st, h, body = d.request("GET", "/v1/models/%ff")
        check(st == 404 and "error" in json.loads(body), "GET /v1/models/%ff: 404 with a JSON body",
              (st, body[:80]))
        st, h, body = d.request("GET", "/nowhere/%e2%82%ac%e2%82")
        check(st == 404 and "error" in json.loads(body), "a cut UTF-8 path: 404 with a JSON body", st)
        m = d.metrics()
        check(counter(m, "/v1/images/generations", 400) == 1, "metrics count the 400",
              counter(m, "/v1/images/generations", 400))
        check(counter(m, "/v1/models", 405) == 1 and counter(m, "/v1/models", 404) == 1,
              "metrics count the 405 and the 404")
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def case_chunked(ditd):
    """Defect 4: a chunked body over --max-body-bytes gets 413, not a drop."""
    d = Daemon(ditd, "--max-body-bytes", "1024")
    try:
        s = conn(d.port)
        s.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b" " * 512
        for _ in range(8):
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        s.sendall(b"0\r\n\r\n")
        st, h, body = read_response(s, 5)
        s.close()
        check(st == 413 and json.loads(body)["error"]["code"] == "body_too_large",
              "a chunked body over the limit: 413 with the error envelope", (st, body[:100]))
        # a chunked body under the limit still works
        s = conn(d.port, timeout=60)
        raw = json.dumps(GEN).encode()
        s.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(raw) + raw + b"\r\n0\r\n\r\n")
        st, _, _ = read_response(s, 60)
        s.close()
        check(st == 200, "a chunked body under the limit: 200", st)
        # a declared Content-Length over the limit: 413 before reading
        s = conn(d.port)
        s.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n")
        st, h, _ = read_response(s, 5)
        s.close()
        check(st == 413 and h.get("connection") == "close", "Content-Length over the limit: 413 unread", st)
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def file_gets(path, text, timeout=5.0):
    """True once `text` is in the file at `path`: the access line of a request
    is written when libmicrohttpd reports it completed, which may be just
    after the client has read its answer."""
    end = time.monotonic() + timeout
    while True:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.05)


def case_signals(ditd):
    """Defect 5: SIGHUP reopens the log, SIGUSR1/SIGUSR2 are harmless, SIGQUIT
    drains: the request in flight is answered 200 and the exit is 0."""
    tmp = tempfile.mkdtemp(prefix="ditd-sig-")
    logf = os.path.join(tmp, "ditd.log")
    d = Daemon(ditd, "--log-file", logf)
    try:
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            os.kill(d.front_pid, sig)
            time.sleep(0.2)
            st, _, _ = d.request("GET", "/healthz")
            check(d.proc.poll() is None and st == 200, f"{sig.name}: still serving", st)
        check(file_gets(logf, "SIGUSR1: status"), "SIGUSR1 logs a status line")
        os.rename(logf, logf + ".1")
        os.kill(d.front_pid, signal.SIGHUP)
        time.sleep(0.3)
        st, _, _ = d.request("GET", "/healthz", headers={"X-Request-Id": "after-hup"})
        check(d.proc.poll() is None and st == 200, "SIGHUP: still serving", st)
        check(file_gets(logf, "after-hup"), "SIGHUP reopened --log-file: the new file gets the lines")
        # SIGQUIT while a generation runs: it finishes, then the exit is 0
        res = {}
        long_body = dict(GEN, num_inference_steps=300)
        t = threading.Thread(target=lambda: res.update(r=d.generate(long_body, timeout=60)))
        t.start()
        time.sleep(0.5)
        os.kill(d.front_pid, signal.SIGQUIT)
        t.join(60)
        check(res.get("r", (None,))[0] == 200, "SIGQUIT drains: the request in flight gets 200",
              res.get("r", (None,))[0])
        d.proc.wait(30)
        check(d.proc.returncode == 0, "SIGQUIT: exit 0", d.proc.returncode)
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def case_keepalive(ditd):
    """Defect 6: answers keep the connection (GET, 404, 405, 415, 400), and
    pipelined requests are all answered."""
    d = Daemon(ditd)
    try:
        s = conn(d.port, timeout=30)
        for what, req, want in [
                ("GET /healthz", raw_get("/healthz"), 200),
                ("GET /metrics", raw_get("/metrics"), 200),
                ("404", raw_get("/nowhere"), 404),
                ("405", raw_post("/healthz", "{}"), 405),
                ("415", raw_post("/v1/images/generations", "x", ctype="text/plain"), 415),
                ("400", raw_post("/v1/images/generations", "{"), 400),
                ("200 generation", raw_post("/v1/images/generations", GEN), 200)]:
            s.sendall(req)
            st, h, _ = read_response(s, 30)
            check(st == want and h.get("connection", "") != "close",
                  f"{what}: {want} on a kept-alive connection", (st, h.get("connection")))
        # three GETs in one write
        s.sendall(raw_get("/healthz") + raw_get("/readyz") + raw_get("/v1/models"))
        got = [read_response(s, 10)[0] for _ in range(3)]
        check(got == [200, 200, 200], "three pipelined requests: three answers", got)
        s.close()
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def case_quote_model(ditd):
    """Defect 7: a model folder named with a quote serves: the name is escaped
    in the response JSON and in the metrics labels."""
    tmp = tempfile.mkdtemp(prefix="ditd-q-")
    name = 'tiny"q\\x'
    shutil.copytree(MODEL, os.path.join(tmp, name))
    d = None
    try:
        d = Daemon(ditd, "--model", os.path.join(tmp, name))
        st, _, body = d.generate(dict(GEN, model=name))
        ok = st == 200 and json.loads(body)["model"] == name
        check(ok, "a generation with a quote in the model's name: 200, the name intact", (st, body[:100]))
        _, _, text = d.request("GET", "/metrics")
        labels = [ln for ln in text.decode().splitlines() if ln.startswith("ditd_images_total{")]
        check(labels == ['ditd_images_total{model="tiny\\"q\\\\x"} 1'],
              "metrics: the label is escaped (Prometheus text format)", labels)
    finally:
        if d:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def case_size(ditd):
    """Defect 8: sizes that wrap or carry blanks are refused."""
    d = Daemon(ditd)
    try:
        for size in ["4294967324x4294967324", " 28x28", "28x28 ", "+28x28", "028x28", "28x-28",
                     "28x", "x28", "0x0", "28X28", "28x28x28", "99999999999x28"]:
            st, _, body = d.generate(dict(GEN, size=size))
            check(st == 400 and json.loads(body)["error"]["param"] == "size", f"size {size!r}: 400", st)
        st, _, _ = d.generate(dict(GEN, size="28x28"))
        check(st == 200, "size '28x28': 200", st)
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def case_half_close(ditd):
    """Defect 9: a client that half-closes after its request still gets the
    answer; one that closes for good is canceled."""
    d = Daemon(ditd)
    try:
        s = conn(d.port, timeout=60)
        s.sendall(raw_post("/v1/images/generations", dict(GEN, num_inference_steps=60)))
        s.shutdown(socket.SHUT_WR)
        st, h, body = read_response(s, 60)
        s.close()
        check(st == 200 and json.loads(body)["data"][0]["b64_json"],
              "half-closed after the request: 200 with the image", st)
        m = d.metrics()
        check(m.get('ditd_canceled_samples_total{model="%s"}' % MODEL_ID, 0) == 0,
              "nothing was canceled", m.get('ditd_canceled_samples_total{model="%s"}' % MODEL_ID))
        # a request long enough (about a second) for the watch to see the half-close:
        # HTTP/1.1 gets the 102 probe before its 200; HTTP/1.0 must never get a 1xx
        # answer (RFC 9110 15.2): its 200 comes first
        for ver in ("HTTP/1.1", "HTTP/1.0"):
            s = conn(d.port, timeout=60)
            s.sendall(raw_post("/v1/images/generations", dict(GEN, n=4, num_inference_steps=1000))
                      .replace(b"HTTP/1.1", ver.encode(), 1))
            s.shutdown(socket.SHUT_WR)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            s.close()
            if ver == "HTTP/1.1":
                check(data.startswith(b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200"),
                      "HTTP/1.1, half-closed, a long request: the 102 probe, then 200", data[:60])
            else:
                check(data.startswith(b"HTTP/1.1 200") and b" 102 " not in data,
                      "HTTP/1.0, half-closed, a long request: 200 first, no 102", data[:60])
        # http.client (what urllib and requests use) reads the answer of a long request
        import http.client
        hc = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
        hc.request("POST", "/v1/images/generations", json.dumps(dict(GEN, n=4, num_inference_steps=1000)),
                   {"Content-Type": "application/json"})
        r = hc.getresponse()
        check(r.status == 200 and json.loads(r.read())["data"], "http.client: 200 with the image",
              r.status)
        hc.close()
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def case_stalled(ditd):
    """Defect 10: with two replicas, one stalled (SIGSTOP) leaves /healthz 200
    ("degraded", the stalled one not alive) and generations served by the other."""
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        return 77
    d = Daemon(ditd, "--dp", "2", "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1000",
               mpi_np=3, env={"DITD_LOG_RANKS": "1"})
    stopped = None
    try:
        pids = dict((int(r), int(p)) for r, p in re.findall(r"rank (\d+) \(pid (\d+)\)", d.logtext()))
        check(2 in pids, "rank 2 (replica 1) logged its pid", pids)
        stopped = pids[2]
        os.kill(stopped, signal.SIGSTOP)
        time.sleep(1.6)
        st, _, body = d.request("GET", "/healthz")
        h = json.loads(body)
        check(st == 200 and h["status"] == "degraded" and [r["alive"] for r in h["replicas"]] == [True, False],
              "one replica stalled: /healthz 200, degraded, the stalled one not alive", (st, h))
        t0 = time.time()
        rs = [d.generate(dict(GEN, seed=i), timeout=30)[0] for i in range(4)]
        check(rs == [200] * 4, f"generations served by the live replica ({time.time() - t0:.1f} s)", rs)
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        time.sleep(0.5)
        st, _, body = d.request("GET", "/healthz")
        check(st == 200 and json.loads(body)["status"] == "ok", "resumed: ok again", body[:80])
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def case_logs(ditd):
    """Defect 11: every request is logged once with its real status (400, 404,
    405, 415 too), the client's X-Request-Id is kept and echoed; --log-format
    json writes one JSON object a line."""
    for fmt in ["text", "json"]:
        d = Daemon(ditd, "--log-requests", *(["--log-format", fmt] if fmt == "json" else []))
        try:
            cases = [("GET", "/healthz", None, {}, 200), ("GET", "/nowhere", None, {}, 404),
                     ("PUT", "/healthz", "{}", {}, 405),
                     ("POST", "/v1/images/generations", "x", {"Content-Type": "text/plain"}, 415),
                     ("POST", "/v1/images/generations", {"n": 99}, {}, 400),
                     ("POST", "/v1/images/generations", GEN, {}, 200)]
            for i, (method, path, body, hdrs, want) in enumerate(cases):
                rid = f"client-{fmt}-{i}"
                st, h, _ = d.request(method, path, body, dict(hdrs, **{"X-Request-Id": rid}))
                check(st == want and h.get("x-request-id") == rid,
                      f"{fmt}: {method} {path}: {want}, X-Request-Id echoed", (st, h.get("x-request-id")))
            time.sleep(0.2)
            text = d.logtext()
            for i, (method, path, body, hdrs, want) in enumerate(cases):
                rid = f"client-{fmt}-{i}"
                if fmt == "json":
                    recs = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{") and rid in ln]
                    ok = (len(recs) == 1 and recs[0]["status"] == want and recs[0]["method"] == method
                          and recs[0]["request_id"] == rid and recs[0]["bytes"] > 0
                          and recs[0]["latency_ms"] >= 0)
                else:
                    recs = [ln for ln in text.splitlines() if f"id={rid} " in ln]
                    ok = len(recs) == 1 and f" status={want} " in recs[0] and f"request {method} " in recs[0]
                check(ok, f"{fmt}: one access line for {method} {path} with status {want}", recs)
            if fmt == "json":
                bad = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("{")]
                check(not bad, "json: every line of the log is JSON", bad[:3])
            # an id a client cannot smuggle into the log
            st, h, _ = d.request("GET", "/healthz", headers={"X-Request-Id": "a b\"c"})
            check(h.get("x-request-id", "").startswith("req-"), "an id with blanks or quotes is replaced",
                  h.get("x-request-id"))
        finally:
            rc = d.stop()
        check(rc == 0, f"{fmt}: exit 0", rc)
    # --log-level warn: the access lines (info) are not written, warnings are
    d = Daemon(ditd, "--log-level", "warn", "--log-requests")
    try:
        d.request("GET", "/healthz", headers={"X-Request-Id": "quiet-1"})
        os.kill(d.front_pid, signal.SIGUSR1)  # an info line: not written either
        time.sleep(0.3)
        text = d.logtext()
        check("quiet-1" not in text and "SIGUSR1" not in text,
              "--log-level warn drops info lines (access lines, the status line)", text[-300:])
    finally:
        rc = d.stop()
    check(rc == 0, "warn: exit 0", rc)


def case_auth(ditd):
    """API keys: several from DITD_API_KEY and a file, checked as the OpenAI
    clients send them (Authorization: Bearer), 401 in the OpenAI envelope;
    /healthz, /readyz, /openapi.json open, /metrics as --metrics-auth says."""
    tmp = tempfile.mkdtemp(prefix="ditd-auth-")
    kf = os.path.join(tmp, "keys")
    with open(kf, "w") as f:
        f.write("# team keys\n\nk3-from-file\n")
    for metrics_auth in [False, True]:
        args = ["--api-key-file", kf] + (["--metrics-auth"] if metrics_auth else [])
        d = Daemon(ditd, *args, env={"DITD_API_KEY": "k1-env,k2-env"})
        try:
            for hdr, want in [(None, 401), ("Bearer wrong", 401), ("k1-env", 401), ("Basic k1-env", 401),
                              ("Bearer k1-env", 200), ("Bearer k2-env", 200), ("bearer  k3-from-file", 200)]:
                st, h, body = d.generate(GEN, headers={"Authorization": hdr} if hdr else {})
                ok = st == want
                if want == 401:
                    e = json.loads(body).get("error", {})
                    ok = ok and e.get("code") == "invalid_api_key" and e.get("type") == "invalid_request_error" \
                        and h.get("www-authenticate") == "Bearer"
                check(ok, f"generation with Authorization {hdr!r}: {want}", (st, body[:100]))
            for path in ["/healthz", "/readyz", "/openapi.json"]:
                st, _, _ = d.request("GET", path)
                check(st == 200, f"{path} is open without a key", st)
            st, _, _ = d.request("GET", "/v1/models")
            check(st == 401, "/v1/models needs a key", st)
            st, _, _ = d.request("GET", "/metrics")
            check(st == (401 if metrics_auth else 200),
                  f"/metrics {'needs a key' if metrics_auth else 'is open'} (--metrics-auth {metrics_auth})", st)
            if not metrics_auth:
                import openai
                good = openai.OpenAI(base_url=d.url("/v1"), api_key="k2-env")
                res = good.images.generate(model=MODEL_ID, prompt="dress", size="28x28",
                                           response_format="b64_json", extra_body={"num_inference_steps": 2})
                check(len(res.data) == 1 and res.data[0].b64_json, "openai client with a key: an image")
                try:
                    openai.OpenAI(base_url=d.url("/v1"), api_key="nope", max_retries=0).images.generate(
                        model=MODEL_ID, prompt="dress", size="28x28", response_format="b64_json")
                    check(False, "openai client with a wrong key raises AuthenticationError")
                except openai.AuthenticationError as e:
                    check(e.status_code == 401 and "API key" in str(e),
                          "openai client with a wrong key: AuthenticationError (401)", str(e)[:100])
                out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                                      "Authorization: Bearer k3-from-file", d.url("/v1/models")],
                                     capture_output=True, text=True, timeout=30).stdout
                check(out == "200", "curl with a key from the file: 200", out)
        finally:
            rc = d.stop()
        check(rc == 0, "exit 0", rc)
    shutil.rmtree(tmp, ignore_errors=True)


def case_tls(ditd):
    """TLS through libmicrohttpd's GnuTLS: a certificate made here, curl and
    the openai client trust it and get images; a plain-HTTP client on the
    TLS port does not take the server down."""
    if not shutil.which("openssl"):
        print("skip: no openssl")
        return 77
    tmp = tempfile.mkdtemp(prefix="ditd-tls-")
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, "openssl made a certificate", r.stderr[-300:])
    d = Daemon(ditd, "--tls-cert", cert, "--tls-key", key, "--api-key", "tls-key-1",
               "--header-timeout", "2", tls_ca=cert, api_key="tls-key-1")
    try:
        out = subprocess.run(["curl", "-s", "--cacert", cert, "-H", "Authorization: Bearer tls-key-1",
                              "-H", "Content-Type: application/json", "-d", json.dumps(GEN),
                              d.url("/v1/images/generations")],
                             capture_output=True, text=True, timeout=60)
        ok = False
        try:
            ok = len(json.loads(out.stdout)["data"]) == 1
        except (ValueError, KeyError):
            pass
        check(ok, "curl over HTTPS (the test's CA): an image", out.stdout[:100] + out.stderr[-200:])
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", d.url("/healthz")],
                             capture_output=True, text=True, timeout=30)
        check(out.returncode != 0, "curl without the CA refuses the certificate", out.returncode)
        import openai
        client = openai.OpenAI(base_url=d.url("/v1"), api_key="tls-key-1",
                               http_client=openai.DefaultHttpxClient(verify=cert))
        res = client.images.generate(model=MODEL_ID, prompt="dress", size="28x28", response_format="b64_json",
                                     extra_body={"num_inference_steps": 2, "seed": 3})
        check(len(res.data) == 1 and res.data[0].b64_json, "openai client over HTTPS: an image")
        # plain HTTP on the TLS port: refused or dropped, and the server goes on
        try:
            s = conn(d.port, timeout=3)
            s.sendall(raw_get("/healthz"))
            s.recv(100)
            s.close()
        except OSError:
            pass
        st, _, _ = d.request("GET", "/healthz")
        check(st == 200, "after a plain-HTTP client, HTTPS still serves", st)
        # a client that connects and never says hello is closed at the
        # header deadline (it counts from the accept, handshake included)
        s = conn(d.port, timeout=5)
        t0 = time.time()
        try:
            gone = s.recv(100) == b""
        except OSError:
            gone = True
        s.close()
        check(gone and time.time() - t0 < 3.5,
              f"a silent TLS client is closed at --header-timeout ({time.time() - t0:.1f} s)")
    finally:
        rc = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(rc == 0, "exit 0", rc)



def case_fairness(ditd):
    """Fairness and cost: a light request that arrives behind three heavy
    ones waits for the one running, not for all three (the queue is earliest
    deadline first, deadline = arrival + cost x measured seconds per unit),
    the heavy ones all finish, and --max-cost refuses a request over it."""
    heavy = dict(GEN, n=8, num_inference_steps=150)
    light = dict(GEN, n=1, num_inference_steps=3)
    tokens = 49  # (28 / 4)^2 for the fixture model
    d = Daemon(ditd, "--max-batch", "8", "--max-cost", str(8 * 150 * tokens))
    try:
        d.generate(light)  # the first batch times the rate
        t0 = time.time()
        st = d.generate(heavy)[0]
        t_heavy = time.time() - t0
        check(st == 200, f"a heavy request alone takes {t_heavy:.2f} s", st)
        res, lock = {}, threading.Lock()

        def run(key, body):
            t1 = time.time()
            st = d.generate(body, timeout=120)[0]
            with lock:
                res[key] = (st, time.time() - t1)
        ths = [threading.Thread(target=run, args=(f"heavy{i}", dict(heavy, seed=10 + i))) for i in range(3)]
        for th_ in ths:
            th_.start()
            time.sleep(0.05)
        time.sleep(0.2)
        lt = threading.Thread(target=run, args=("light", light))
        lt.start()
        for th_ in ths + [lt]:
            th_.join(120)
        st_l, t_light = res.get("light", (None, 0))
        print(f"note: light request behind 3 heavy: {t_light:.2f} s; a heavy alone {t_heavy:.2f} s; "
              f"FIFO would wait about {3 * t_heavy:.2f} s")
        check(st_l == 200 and t_light < 1.6 * t_heavy,
              f"the light request overtakes the waiting heavy ones ({t_light:.2f} s < 1.6 x {t_heavy:.2f} s)")
        check(all(res.get(f"heavy{i}", (None,))[0] == 200 for i in range(3)),
              "every heavy request finishes (no starvation)", res)
        st, _, body = d.generate(dict(heavy, num_inference_steps=151))
        e = json.loads(body).get("error", {})
        check(st == 400 and e.get("code") == "cost_too_high" and "--max-cost" in e.get("message", ""),
              "over --max-cost: 400 cost_too_high naming the flag", (st, body[:160]))
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)



def case_mpirun_term(ditd):
    """A SIGTERM to the launcher (server/ditd-mpirun, not rank 0) drains: the
    request in flight is answered 200 and the launcher exits 0."""
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        return 77
    wrapper = os.path.join(th.ROOT, "server", "ditd-mpirun")
    log = tempfile.NamedTemporaryFile("w+", prefix="ditd-mpirun-", suffix=".log", delete=False)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
    p = subprocess.Popen([wrapper, "-np", "2", "--oversubscribe", "--bind-to", "none", ditd, "serve",
                          "--model", MODEL, "--host", "127.0.0.1", "--port", "0", "--threads", "1"],
                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        port, deadline = None, time.time() + 60
        while time.time() < deadline and port is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log.name).read())
            port = int(m.group(1)) if m else None
            time.sleep(0.1)
        check(port is not None, "the front-end listens under ditd-mpirun")
        d = Daemon.__new__(Daemon)
        d.port, d.tls_ca, d.api_key = port, None, None
        while time.time() < deadline and not d.ready():
            time.sleep(0.1)
        res = {}
        t = threading.Thread(target=lambda: res.update(r=d.generate(dict(GEN, num_inference_steps=400), timeout=60)))
        t.start()
        time.sleep(0.5)
        os.kill(p.pid, signal.SIGTERM)
        t.join(60)
        check(res.get("r", (None,))[0] == 200, "SIGTERM to the launcher: the request in flight gets 200",
              res.get("r", (None,))[0])
        rc = p.wait(60)
        check(rc == 0, "the launcher exits 0 after the drain", rc)
        check("SIGTERM: draining" in open(log.name).read(), "rank 0 logged the drain")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if not th.failures:
            os.unlink(log.name)
        else:
            print(open(log.name).read()[-2000:])



def case_schema(ditd):
    """schemathesis against /openapi.json: every operation, bounded examples,
    every check but positive_data_acceptance (a class-conditional model's
    prompt must name one of its classes, which a static schema cannot say):
    no 5xx, no status, header, content type or body outside the schema."""
    st_bin = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    if not os.path.exists(st_bin):
        print("skip: no schemathesis in the venv")
        return 77
    # --max-cost keeps generated generations cheap (10 images x 50 steps); an
    # admin key turns the admin routes (POST, DELETE /v1/loras) on, so that
    # their required Authorization is judged as documented (401 without it)
    d = Daemon(ditd, "--max-cost", str(10 * 50 * 49), "--log-requests=0",
               env={"DITD_ADMIN_KEY": "schema-admin-key"})
    tmp = tempfile.mkdtemp(prefix="ditd-schema-")  # schemathesis writes .schemathesis/ there
    try:
        t0 = time.time()
        r = subprocess.run([st_bin, "run", d.url("/openapi.json"), "--checks", "all",
                            "--exclude-checks", "positive_data_acceptance", "-n", "25",
                            "--generation-deterministic", "--request-timeout", "30", "--no-color"],
                           capture_output=True, text=True, timeout=240, cwd=tmp,
                           env=dict(os.environ, SCHEMATHESIS_TELEMETRY="false"))
        out = r.stdout + r.stderr
        m = re.search(r"(\d+) generated, (\d+) passed", out)
        print("\n".join(out.strip().splitlines()[-12:]))
        check(r.returncode == 0 and m and int(m.group(1)) == int(m.group(2)) and int(m.group(1)) >= 200,
              f"schemathesis: every generated case passed ({m.group(0) if m else '?'}, "
              f"{time.time() - t0:.1f} s)", out[-1500:])
        check(d.proc.poll() is None, "the server is still up")
    finally:
        rc = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(rc == 0, "exit 0", rc)



def case_garbage(ditd, n=150):
    """Mutated HTTP requests (bit flips, cuts, repeats, splices of valid
    ones; a fixed seed) against a live daemon: each gets an answer that is
    HTTP with a status ditd sends, or a close; the daemon survives, still
    answers, and every JSON error body it sent parses. The end-to-end
    complement of fuzz_genreq (libmicrohttpd's parser and our routes)."""
    import random
    rnd = random.Random(12)
    seeds = [raw_get("/healthz"), raw_get("/v1/models"), raw_get("/metrics"),
             raw_post("/v1/images/generations", dict(GEN, num_inference_steps=1)),
             raw_post("/v1/images/generations", dict(GEN, stream=True, num_inference_steps=1)),
             b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"n\":\r\n2\r\n1}\r\n0\r\n\r\n",
             raw_get("/v1/models/%ff", rid="x" * 100),
             # background jobs: a creation, the list's query parameters
             raw_post("/v1/images/generations", dict(GEN, background=True, num_inference_steps=1)),
             raw_get("/v1/jobs?limit=5&order=asc")]
    d = Daemon(ditd, "--header-timeout", "0.3", "--body-timeout", "0.3", "--log-requests=0")
    statuses, bad_json = {}, []
    try:
        for i in range(n):
            m = bytearray(rnd.choice(seeds))
            for _ in range(rnd.randint(1, 4)):
                k = rnd.random()
                at = rnd.randrange(len(m))
                if k < 0.4:
                    m[at] ^= 1 << rnd.randrange(8)
                elif k < 0.55:
                    del m[at:]
                    m = m or bytearray(b"G")
                elif k < 0.7:
                    m[at:at] = bytes(m[at:at + rnd.randint(1, 40)]) * rnd.randint(1, 20)
                elif k < 0.85:
                    m[at:at] = rnd.choice(seeds)
                else:
                    m[at] = rnd.choice(b"\r\n\x00\xff :%")
            try:
                s = conn(d.port, timeout=3)
                s.sendall(bytes(m))
                st, h, body = read_response(s, 2.5)
                s.close()
            except OSError:
                st, h, body = "reset", {}, b""
            statuses[st] = statuses.get(st, 0) + 1
            if isinstance(st, int) and st >= 400 and h.get("content-type", "").startswith("application/json"):
                try:
                    json.loads(body)
                except ValueError:
                    bad_json.append((st, body[:80]))
        print(f"note: {n} mutated requests: {dict(sorted(statuses.items(), key=str))}")
        check(d.proc.poll() is None, "the daemon survived every mutated request")
        check(not bad_json, "every JSON error body parses", bad_json[:3])
        allowed = {200, 202, 400, 401, 404, 405, 408, 409, 413, 415, 429, 503, None, "reset"}
        odd = {k: v for k, v in statuses.items() if k not in allowed and not (isinstance(k, int) and k in
               (411, 414, 417, 431, 501, 505))}
        check(not odd, "only statuses ditd (or libmicrohttpd's parser) sends", odd)
        check(statuses.get(200, 0) + statuses.get(202, 0) >= 10 and sum(v for k, v in statuses.items() if isinstance(k, int)) >= n // 3,
              "many mutated requests were still answered", statuses)
        st, _, _ = d.request("GET", "/healthz")
        check(st == 200, "after the garbage, /healthz is 200", st)
        st, _, _ = d.generate(GEN)
        check(st == 200, "and a generation is 200", st)
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def case_text_prompts(ditd):
    """A text model's prompts from careless and hostile clients: bytes that
    are not UTF-8, NUL and lone surrogates are refused (400, a JSON body);
    any real Unicode (CJK, emoji, RTL, combining marks, zero-width and
    control characters, runs of blanks) is drawn; the byte limit holds at
    its edge, in 4-byte characters too; sizes that wrap or sit off the grid
    are refused; the daemon serves on. Skips without the text model."""
    model = th.text_model(ditd)
    if not model:
        print("skip: no text model (the build's tests/golden/flux_pipeline/dev; or set DITD_TEXT_MODEL)")
        return 77
    d = Daemon(ditd, "--log-requests=0", model=model)
    try:
        info = json.loads(d.request("GET", "/v1/models")[2])["data"][0]
        r = info["size_range"]
        sz = f"{r['min']}x{r['min']}"
        base = {"prompt": "x", "size": sz, "seed": 1, "num_inference_steps": 1}
        raw = json.dumps(base).encode()
        for bad, what in [(b'"\xff\xfe"', "bytes that are not UTF-8"), (b'"a\xc3"', "a cut UTF-8 sequence"),
                          (b'"\xed\xa0\x80"', "an encoded surrogate"), (b'"a\\u0000b"', "an escaped NUL"),
                          (b'"\\ud800"', "a lone surrogate escape")]:
            body = raw.replace(b'"x"', bad)
            st, _, data = d.generate(body, headers={"Content-Type": "application/json"})
            ok = False
            try:
                ok = "error" in json.loads(data)
            except ValueError:
                pass
            check(st == 400 and ok, f"a prompt with {what}: 400 with a JSON body", (st, data[:80]))
        for prompt, what in [("\u732b\u304c\u5ea7\u3063\u3066\u3044\u308b", "CJK"),
                             ("\U0001F98A\U0001F332\u2744\ufe0f", "emoji"),
                             ("\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627", "RTL"),
                             ("e\u0301te\u0301 \u200b\u200d\ufeff", "combining and zero-width"),
                             ("a\x01\x1f\x7f\tb\r\n", "control characters"),
                             (" " * 3000 + "fox" + "\n" * 3000, "runs of blanks"),
                             ("\U0001F98A" * 2048, "8192 bytes of 4-byte characters"),
                             ("!" * 8192, "8192 bytes of '!'")]:
            st, _, data = d.generate(dict(base, prompt=prompt))
            check(st == 200 and json.loads(data)["data"][0]["b64_json"], f"a prompt of {what}: 200", (st, data[:80]))
        for prompt, what in [("\U0001F98A" * 2048 + "a", "8193 bytes"), ("\u20ac" * 6000, "18000 bytes")]:
            st, _, data = d.generate(dict(base, prompt=prompt))
            e = json.loads(data)["error"]
            check(st == 400 and e["param"] == "prompt" and "8192" in e["message"],
                  f"a prompt of {what}: 400 naming the limit", (st, e))
        st, _, _ = d.generate(dict(base, prompt="x" * 70000))
        check(st == 413, "a body over --max-body-bytes: 413", st)
        for size in ["4294967312x16", f"{r['min']}x0", f"{r['min'] + 1}x{r['min']}",
                     f"{r['max'] + r['multiple']}x{r['min']}", f"{r['min']}x{r['max'] * 16}"]:
            st, _, data = d.generate(dict(base, size=size))
            check(st == 400 and json.loads(data)["error"]["param"] == "size", f"size {size!r}: 400", st)
        check(d.proc.poll() is None and d.ready(), "the daemon is still serving")
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


CASES = {"text_prompts": case_text_prompts, "conn_limit": case_conn_limit, "slow_clients": case_slow_clients, "utf8": case_utf8,
         "chunked": case_chunked, "signals": case_signals, "keepalive": case_keepalive,
         "quote_model": case_quote_model, "size": case_size, "half_close": case_half_close,
         "stalled": case_stalled, "logs": case_logs, "auth": case_auth, "tls": case_tls,
         "fairness": case_fairness, "mpirun_term": case_mpirun_term,
         "schema": case_schema, "garbage": case_garbage}


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
