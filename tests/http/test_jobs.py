#!/usr/bin/env python3
"""Background jobs of `ditd serve` (issue 22): POST /v1/images/generations
with "background": true, /v1/jobs, the SQLite job store under --data-dir and
what survives a restart. Each case is a real daemon on 127.0.0.1 serving the
fixture model; exit 0 pass, 1 fail, 77 skip.

usage: test_jobs.py --ditd BUILD/ditd CASE
cases: jobs (create, poll, download, keys, delete mid-run, metrics),
       jobs_list (1,000 jobs through limit/after/order),
       jobs_limits (--job-ttl, --data-max-gb, the in-memory store),
       jobs_restart (SIGTERM, SIGKILL, the attempts rule; integrity_check and
       no orphan files after each),
       jobs_full_disk (a store on a full tmpfs: the job fails clearly, the rest goes on)
"""
import argparse
import base64
import http.client
import json
import os
import shutil
import signal
import subprocess
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http as th  # noqa: E402
from test_http import GEN, MODEL_ID, Daemon, check  # noqa: E402

LONG = dict(GEN, n=10, num_inference_steps=1000, seed=7)   # seconds on the tiny model
SMALL = dict(GEN, n=2, num_inference_steps=4, seed=3)


def create(d, body, key=None):
    h = {"Authorization": f"Bearer {key}"} if key else None
    st, hd, data = d.generate(dict(body, background=True), headers=h)
    return st, hd, json.loads(data) if data else None


def get(d, path, key=None):
    h = {"Authorization": f"Bearer {key}"} if key else None
    st, hd, data = d.request("GET", path, headers=h)
    return st, hd, data


def job(d, jid, key=None):
    st, _, data = get(d, f"/v1/jobs/{jid}", key)
    return st, json.loads(data)


def wait_status(d, jid, want, timeout=120, key=None, progress_over=None):
    """Polls until the job's status is in want (and its progress over
    progress_over, when given); returns the last job object."""
    t0 = time.time()
    o = None
    while time.time() - t0 < timeout:
        st, o = job(d, jid, key)
        if st == 200 and o["status"] in want and (progress_over is None or o["progress"] > progress_over):
            return o
        if st != 200 or (o["status"] == "failed" and "failed" not in want):
            return o
        time.sleep(0.05)
    return o


def results_tree(data_dir):
    """{job id: sorted file names} of data_dir/results."""
    out = {}
    root = os.path.join(data_dir, "results")
    for name in os.listdir(root):
        p = os.path.join(root, name)
        out[name] = sorted(os.listdir(p)) if os.path.isdir(p) else None
    return out


def db_rows(data_dir):
    """The jobs table as {id: row dict}, and PRAGMA integrity_check, read
    with Python's sqlite3 while no daemon holds the store."""
    c = sqlite3.connect(os.path.join(data_dir, "jobs.db"))
    c.row_factory = sqlite3.Row
    ok = c.execute("PRAGMA integrity_check").fetchone()[0]
    rows = {r["id"]: dict(r) for r in c.execute("SELECT * FROM jobs")}
    c.close()
    return ok, rows


def store_consistent(data_dir, what):
    """integrity_check ok, and results/ holds exactly the completed jobs'
    outputs: no temporary file, no folder of another job."""
    ok, rows = db_rows(data_dir)
    check(ok == "ok", f"{what}: PRAGMA integrity_check", ok)
    tree = results_tree(data_dir)
    done = {i: r for i, r in rows.items() if r["status"] == "completed"}
    want = {i: sorted(f"{k}.png" for k in range(r["n_outputs"])) for i, r in done.items()}
    check(tree == want, f"{what}: results/ holds the {len(want)} completed job(s)' files and nothing else",
          tree, want)
    return rows


def sync_pngs(d, body):
    st, _, data = d.generate(body)
    assert st == 200, (st, data[:200])
    return [base64.b64decode(x["b64_json"]) for x in json.loads(data)["data"]]


# ---------------------------------------------------------------- cases

def case_jobs(ditd):
    data_dir = tempfile.mkdtemp(prefix="ditd-jobs-")
    d = Daemon(ditd, "--data-dir", data_dir, "--api-key", "k1,k2", "--max-batch", "8", api_key="k1")
    try:
        # create: 202, Location, a Job
        st, hd, o = create(d, SMALL)
        check(st == 202 and hd.get("location") == f"/v1/jobs/{o['id']}" and th.validate(o, "Job"),
              "create: 202 with Location and a Job", (st, hd.get("location"), o))
        check(o["status"] in ("queued", "in_progress", "completed") and o["kind"] == "image"
              and o["model"] == MODEL_ID and o["size"] == "28x28", "create: a queued image job", o)
        jid = o["id"]
        # poll to completed, then download each image: the same pixels as the
        # synchronous request with the same seed
        o = wait_status(d, jid, ("completed",))
        check(o and o["status"] == "completed" and o["progress"] == 100 and o["outputs"] == 2
              and o["content_url"] == f"/v1/jobs/{jid}/content" and o["completed_at"] >= o["created_at"]
              and th.validate(o, "Job"), "poll: completed, 2 outputs, progress 100", o)
        want = sync_pngs(d, SMALL)
        for k in range(2):
            st, hd, png = get(d, f"/v1/jobs/{jid}/content?index={k}")
            check(st == 200 and hd.get("content-type") == "image/png"
                  and th.png_pixels(png) == th.png_pixels(want[k]),
                  f"content index {k}: the PNG of the synchronous request with the same seed",
                  (st, hd.get("content-type")))
        st, _, png0 = get(d, f"/v1/jobs/{jid}/content")
        check(st == 200 and png0 == get(d, f"/v1/jobs/{jid}/content?index=0")[2], "content: index 0 by default")
        st, _, data = get(d, f"/v1/jobs/{jid}/content?index=2")
        check(st == 400 and json.loads(data)["error"]["param"] == "index", "content index 2 of 2: 400", st)
        # another key sees nothing of it
        for method, path in [("GET", f"/v1/jobs/{jid}"), ("GET", f"/v1/jobs/{jid}/content"),
                             ("DELETE", f"/v1/jobs/{jid}")]:
            st, _, data = d.request(method, path, headers={"Authorization": "Bearer k2"})
            check(st == 404 and json.loads(data)["error"]["code"] == "job_not_found",
                  f"{method} {path.replace(jid, '<id>')} with another key: 404", (st, data[:100]))
        st, _, data = get(d, "/v1/jobs", "k2")
        check(st == 200 and json.loads(data)["data"] == [], "another key's list is empty", data[:200])
        st, _, data = d.request("GET", f"/v1/jobs/{jid}", headers={"Authorization": "Bearer nope"})
        check(st == 401, "a wrong key: 401", st)
        st, _, data = get(d, "/v1/jobs/job_000000000000000000000000")
        check(st == 404, "an unknown id: 404", st)
        # the route table: 405 with Allow, bad fields 400
        st, hd, _ = d.request("PUT", f"/v1/jobs/{jid}", body="{}")
        check(st == 405 and hd.get("allow") == "GET, HEAD, DELETE", "PUT /v1/jobs/<id>: 405, Allow: GET, HEAD, DELETE",
              (st, hd.get("allow")))
        st, _, data = d.generate(dict(SMALL, background=True, stream=True))
        check(st == 400 and json.loads(data)["error"]["param"] == "stream", "background with stream: 400", st)
        st, _, data = d.generate(dict(SMALL, background=True, num_inference_steps=0))
        check(st == 400 and json.loads(data)["error"]["param"] == "num_inference_steps",
              "background with a bad field: 400 naming it, as the synchronous request", st)
        st, _, data = d.generate(dict(SMALL, background="opaque"))
        check(st == 200 and "data" in json.loads(data), "background: 'opaque' (OpenAI's string) stays synchronous", st)

        # delete mid-run: the replica stops at a step boundary
        t0 = time.time()
        sync_pngs(d, LONG)
        t_long = time.time() - t0
        st, _, o = create(d, LONG)
        lid = o["id"]
        o = wait_status(d, lid, ("in_progress",), progress_over=0)
        check(o["status"] == "in_progress" and 0 < o["progress"] < 100 and o["started_at"],
              f"a long job runs with progress ({o['progress']}%)", o)
        st, _, data = get(d, f"/v1/jobs/{lid}/content")
        check(st == 409 and json.loads(data)["error"]["code"] == "job_not_completed",
              "content of a running job: 409", st)
        canceled0 = d.metrics().get(f'ditd_canceled_samples_total{{model="{MODEL_ID}"}}', 0)
        st, _, data = d.request("DELETE", f"/v1/jobs/{lid}")
        t_del = time.time()
        check(st == 200 and json.loads(data) == {"id": lid, "object": "job.deleted", "deleted": True}
              and th.validate(json.loads(data), "JobDeleted"), "DELETE a running job: 200", data[:200])
        idle = None
        while time.time() - t_del < t_long:
            st, _, data = d.request("GET", "/healthz")
            if not json.loads(data)["replicas"][0]["busy"]:
                idle = time.time() - t_del
                break
            time.sleep(0.01)
        check(idle is not None and idle < t_long / 2,
              f"the replica stops at a step boundary: idle {idle if idle is None else round(idle, 3)} s "
              f"after DELETE (the job alone takes {t_long:.2f} s)")
        m = d.metrics()
        check(m.get(f'ditd_canceled_samples_total{{model="{MODEL_ID}"}}', 0) >= canceled0 + 1,
              "metrics: the job's samples counted canceled")
        st, _ = job(d, lid)
        check(st == 404 and not os.path.exists(os.path.join(data_dir, "results", lid)),
              "the deleted job: 404, no files", st)
        t0 = time.time()
        sync_pngs(d, GEN)
        check(time.time() - t0 < t_long / 2, f"a short request right after: {time.time() - t0:.2f} s")
        # delete a completed one: its files go
        st, _, data = d.request("DELETE", f"/v1/jobs/{jid}")
        check(st == 200 and not os.path.exists(os.path.join(data_dir, "results", jid))
              and job(d, jid)[0] == 404, "DELETE a completed job: its row and files go", st)
        # metrics
        o = create(d, SMALL)[2]
        wait_status(d, o["id"], ("completed",))
        time.sleep(0.1)
        m = d.metrics()
        check(m.get('ditd_jobs{status="completed"}', 0) >= 1 and m.get("ditd_job_store_bytes", 0) > 0
              and m.get("ditd_jobs_deleted_total") == 2 and m.get("ditd_jobs_created_total") == 3
              and m.get('ditd_http_requests_total{route="/v1/jobs",status="404"}', 0) >= 3,
              "metrics: jobs by status, store bytes, created/deleted, the /v1/jobs route",
              {k: v for k, v in m.items() if "job" in k})
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)
    store_consistent(data_dir, "after SIGTERM")
    if not th.failures:
        shutil.rmtree(data_dir, ignore_errors=True)


def case_jobs_list(ditd, n=1000):
    d = Daemon(ditd, "--log-requests=0")
    try:
        c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
        ids = []
        body = json.dumps(dict(GEN, background=True, num_inference_steps=1))
        for i in range(n):
            c.request("POST", "/v1/images/generations", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            o = json.loads(r.read())
            if r.status == 202:
                ids.append(o["id"])
        check(len(ids) == n and len(set(ids)) == n, f"{n} jobs created, {len(set(ids))} distinct ids")

        def pages(order, limit):
            out, after, calls, shapes_ok = [], None, 0, True
            while True:
                q = f"/v1/jobs?limit={limit}&order={order}" + (f"&after={after}" if after else "")
                c.request("GET", q)
                r = c.getresponse()
                p = json.loads(r.read())
                calls += 1
                shapes_ok &= r.status == 200 and len(p["data"]) <= limit
                out += [j["id"] for j in p["data"]]
                if p["data"]:
                    shapes_ok &= p["first_id"] == p["data"][0]["id"] and p["last_id"] == p["data"][-1]["id"]
                if not p["has_more"] or calls > n:
                    return out, calls, shapes_ok
                after = p["last_id"]

        got, calls, ok = pages("desc", 100)
        check(got == ids[::-1] and calls == (n + 99) // 100 and ok,
              f"desc, limit 100: every job once, newest first, in {calls} pages", (len(got), calls))
        got, calls, ok = pages("asc", 37)
        check(got == ids and calls == (n + 36) // 37 and ok,
              f"asc, limit 37: every job once, oldest first, in {calls} pages", (len(got), calls))
        c.request("GET", "/v1/jobs")
        p = json.loads(c.getresponse().read())
        check(len(p["data"]) == 20 and p["has_more"] and th.validate(p, "JobList"),
              "default: 20, has_more, a JobList", len(p["data"]))
        for q, param in [("limit=0", "limit"), ("limit=101", "limit"), ("limit=x", "limit"),
                         ("order=up", "order"), ("after=job_nope", "after")]:
            c.request("GET", "/v1/jobs?" + q)
            r = c.getresponse()
            e = json.loads(r.read())
            check(r.status == 400 and e["error"]["param"] == param, f"/v1/jobs?{q}: 400 naming {param}", r.status)
        c.close()
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0 (queued jobs drop with the in-memory store)", rc)


def case_jobs_limits(ditd):
    # --job-ttl: a finished job and its content go
    d = Daemon(ditd, "--job-ttl", "1")
    try:
        st, _, o = create(d, SMALL)
        o = wait_status(d, o["id"], ("completed",))
        check(o["status"] == "completed" and o["expires_at"] is not None
              and 1 <= o["expires_at"] - o["completed_at"] <= 2, "--job-ttl 1: expires_at = completed_at + 1", o)
        t0 = time.time()
        while time.time() - t0 < 10 and job(d, o["id"])[0] == 200:
            time.sleep(0.1)
        check(job(d, o["id"])[0] == 404 and d.metrics().get("ditd_jobs_expired_total") == 1,
              f"expired and deleted {time.time() - t0:.1f} s later")
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)
    # without --data-dir: nothing survives a restart
    d = Daemon(ditd)
    try:
        st, _, o = create(d, SMALL)
        wait_status(d, o["id"], ("completed",))
    finally:
        d.stop()
    d = Daemon(ditd)
    try:
        check(job(d, o["id"])[0] == 404, "the in-memory store: a restart loses the job")
    finally:
        d.stop()
    # --max-cost: refused at creation, as the synchronous request
    d = Daemon(ditd, "--max-cost", str(2 * 4 * 49))
    try:
        st, _, data = d.generate(dict(SMALL, background=True, n=3))
        check(st == 400 and json.loads(data)["error"]["code"] == "cost_too_high",
              "a job over --max-cost: 400 cost_too_high at creation", (st, data[:120]))
        st, _, o = create(d, SMALL)
        check(st == 202 and wait_status(d, o["id"], ("completed",))["status"] == "completed",
              "a job at --max-cost runs")
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)
    # --data-max-gb: past the budget new jobs get 507; the rest is kept
    data_dir = tempfile.mkdtemp(prefix="ditd-jobs-")
    d = Daemon(ditd, "--data-max-gb", "0.0000001", "--data-dir", data_dir)  # 100 bytes
    try:
        st, _, data = d.generate(dict(SMALL, background=True))
        e = json.loads(data)["error"]
        check(st == 507 and e["code"] == "insufficient_storage" and "--data-max-gb" in e["message"]
              and th.validate(json.loads(data), "ErrorResponse"), "past --data-max-gb: 507 with the reason", (st, e))
        check(len(sync_pngs(d, GEN)) == 1, "synchronous requests still served")
        check(d.metrics().get("ditd_jobs_refused_storage_total") == 1, "metrics: the refusal counted")
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)
    shutil.rmtree(data_dir, ignore_errors=True)
    # in memory the budget is the results' bytes: jobs go in until it is passed
    d = Daemon(ditd, "--data-max-gb", "0.000002")  # 2,000 bytes
    try:
        done, refused = [], None
        for i in range(40):
            st, _, o = create(d, dict(SMALL, seed=i))
            if st == 507:
                refused = i
                break
            done.append(wait_status(d, o["id"], ("completed",)))
        check(refused is not None and len(done) >= 2, f"in memory: {len(done)} jobs fit, the next gets 507")
        check(all(get(d, f"/v1/jobs/{o['id']}/content")[0] == 200 for o in done),
              "the jobs inside the budget stay downloadable")
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def case_jobs_restart(ditd):
    data_dir = tempfile.mkdtemp(prefix="ditd-jobs-")
    args = ("--data-dir", data_dir, "--drain-timeout", "30")
    # 1. SIGTERM with one job done, one running, one queued behind it
    d = Daemon(ditd, *args)
    try:
        done = create(d, SMALL)[2]["id"]
        wait_status(d, done, ("completed",))
        png = get(d, f"/v1/jobs/{done}/content?index=1")[2]
        running = create(d, LONG)[2]["id"]
        queued = create(d, SMALL)[2]["id"]
        o = wait_status(d, running, ("in_progress",), progress_over=0)
        check(o["status"] == "in_progress" and job(d, queued)[1]["status"] == "queued",
              "before SIGTERM: one completed, one running, one queued")
        t0 = time.time()
    finally:
        rc = d.stop(signal.SIGTERM)
    check(rc == 0 and time.time() - t0 < 10,
          f"SIGTERM: exit 0 in {time.time() - t0:.1f} s (the running job stops at a step, it does not hold the drain)", rc)
    rows = store_consistent(data_dir, "after SIGTERM")
    check(rows[done]["status"] == "completed" and rows[running]["status"] == "queued"
          and rows[queued]["status"] == "queued" and rows[running]["attempts"] == 0,
          "after SIGTERM: completed stays, the running job is queued again (not counted an attempt)",
          {k: (v["status"], v["attempts"]) for k, v in rows.items()})
    # 2. restart: the completed one is listed and downloadable, the others run
    d = Daemon(ditd, *args)
    try:
        st, _, data = get(d, "/v1/jobs?order=asc")
        check(st == 200 and [j["id"] for j in json.loads(data)["data"]] == [done, running, queued],
              "after the restart all three are listed", data[:300])
        check(get(d, f"/v1/jobs/{done}/content?index=1")[2] == png, "the completed job's content is the same bytes")
        for jid in (running, queued):
            o = wait_status(d, jid, ("completed",), timeout=180)
            check(o["status"] == "completed", f"{'the interrupted' if jid == running else 'the queued'} job runs to completed", o)
        # 3. SIGKILL while a job runs
        killed = create(d, LONG)[2]["id"]
        o = wait_status(d, killed, ("in_progress",), progress_over=0)
        check(o["status"] == "in_progress", "a job runs")
    finally:
        d.stop(signal.SIGKILL)
    ok, rows = db_rows(data_dir)
    check(ok == "ok" and rows[killed]["status"] == "in_progress",
          "after SIGKILL: integrity_check ok, the row still says in_progress", (ok, rows[killed]["status"]))
    # the attempts rule: a job the server died under 3 times is failed
    c = sqlite3.connect(os.path.join(data_dir, "jobs.db"))
    cursed = "job_" + "c" * 24
    c.execute("INSERT INTO jobs(id, kind, owner, model, status, request, size, created_at, attempts)"
              " SELECT ?, kind, owner, model, 'in_progress', request, size, created_at, 2 FROM jobs WHERE id = ?",
              (cursed, killed))
    c.commit()
    c.close()
    # a stray folder and a temporary file, as a crash mid-write leaves them
    os.makedirs(os.path.join(data_dir, "results", killed))
    open(os.path.join(data_dir, "results", killed, ".0.png.tmp"), "wb").write(b"partial")
    open(os.path.join(data_dir, "results", done, ".1.png.tmp"), "wb").write(b"partial")
    # a completed job whose file went missing
    os.unlink(os.path.join(data_dir, "results", queued, "0.png"))
    d = Daemon(ditd, *args)
    try:
        log = d.logtext()
        check("1 requeued, 1 failed (interrupted too often), 1 lost results, 3 orphan files removed" in log,
              "recovery logged: 1 requeued, 1 failed, 1 lost result, 3 orphans removed "
              "(a stray folder, a temporary file, the lost job's folder)",
              [line for line in log.splitlines() if "recovery" in line])
        st, o = job(d, queued)
        check(st == 200 and o["status"] == "failed" and o["error"]["code"] == "result_lost",
              "a completed job without its file: failed, result_lost", o)
        st, o = job(d, cursed)
        check(st == 200 and o["status"] == "failed" and o["error"]["code"] == "interrupted"
              and o["expires_at"] == o["completed_at"] + 86400,
              "interrupted 3 times: failed with the reason, expiring after --job-ttl", o)
        o = wait_status(d, killed, ("completed",), timeout=180)
        check(o["status"] == "completed", "the killed job runs again to completed", o)
        check(get(d, f"/v1/jobs/{done}/content?index=1")[2] == png, "the first job's content is still the same")
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)
    rows = store_consistent(data_dir, "at the end")
    check(rows[killed]["attempts"] == 1 and all(r["status"] in ("completed", "failed") for r in rows.values()),
          "every job completed or failed; the killed one counted 1 attempt",
          {k: (v["status"], v["attempts"]) for k, v in rows.items()})
    if not th.failures:
        shutil.rmtree(data_dir, ignore_errors=True)


def case_jobs_full_disk(ditd):
    """--data-dir on a 4 MiB tmpfs filled to the brim: a job whose result cannot be written
    fails with a clear error, the server keeps serving (a synchronous request, the earlier
    job's download), nothing else is lost; with room again new jobs complete. Root and a
    tmpfs mount are needed (77 without)."""
    mnt = tempfile.mkdtemp(prefix="ditd-full-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], capture_output=True,
                       text=True)
    if r.returncode != 0:
        os.rmdir(mnt)
        print(f"skip: cannot mount a tmpfs ({r.stderr.strip()})")
        return 77
    filler = os.path.join(mnt, "filler")
    try:
        d = Daemon(ditd, "--data-dir", mnt)
        try:
            st, _, o = create(d, SMALL)
            done = wait_status(d, o["id"], ("completed",))
            check(done["status"] == "completed", "a job completes while there is room", done)
            _, _, png0 = get(d, f"/v1/jobs/{o['id']}/content?index=0")
            # fill the file system: what is left is less than one more result
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
            for size in (65536, 4096, 512, 1):
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError:
                    pass
            # room for the row (a few WAL pages), not for ten results written with fsync
            os.ftruncate(fd, os.fstat(fd).st_size - 24576)
            os.close(fd)
            # a new job: refused with 507 when its row does not fit; when the row fits
            # but the rest does not, it fails with the reason or waits queued (the
            # claim cannot be written), never hangs in_progress
            waiting = None
            for k in range(3):
                st, _, o2 = create(d, dict(SMALL, n=10))
                if st != 202:
                    msg = (o2 or {}).get("error", {}).get("message", "")
                    check(st == 507 and "full" in msg,
                          "a full disk: a new job is refused with 507, saying the disk is full",
                          (st, o2))
                    print("     the refusal:", msg)
                    break
                o2 = wait_status(d, o2["id"], ("failed",), timeout=3)
                if o2["status"] == "failed":
                    check(o2["error"]["code"] == "storage_failed" and "space" in o2["error"]["message"],
                          "a full disk: the job fails with a clear error", o2)
                else:
                    check(o2["status"] == "queued", "a full disk: the job waits queued", o2)
                    waiting = o2["id"]
            if waiting:
                check("queued jobs cannot start" in d.logtext(), "the log says why jobs wait")
            st, _, data = d.generate(dict(SMALL, n=1))
            check(st == 200, "the server keeps serving synchronous requests", st)
            st, _, again = get(d, f"/v1/jobs/{o['id']}/content?index=0")
            check(st == 200 and again == png0, "the earlier job is still downloadable, the same bytes")
            os.unlink(filler)
            if waiting:
                w = wait_status(d, waiting, ("completed", "failed"))
                check(w["status"] == "completed", "with room again the waiting job runs", w)
            st, _, o3 = create(d, SMALL)
            o3 = wait_status(d, o3["id"], ("completed", "failed")) if st == 202 else {"status": st}
            check(o3["status"] == "completed", "with room again a new job completes", o3)
        finally:
            rc = d.stop()
        check(rc == 0, "exit 0", rc)
        c = sqlite3.connect(os.path.join(mnt, "jobs.db"))
        ok = c.execute("PRAGMA integrity_check").fetchone()[0]
        c.close()
        check(ok == "ok", "the store passes integrity_check after the full disk", ok)
    finally:
        if os.path.exists(filler):
            os.unlink(filler)
        subprocess.run(["umount", mnt])
        os.rmdir(mnt)
    return 0


def make_cert(tmp, name, san):
    """A self-signed certificate (and key) for san ("IP:127.0.0.1", "DNS:localhost")."""
    cert, key = os.path.join(tmp, f"{name}.pem"), os.path.join(tmp, f"{name}.key")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                        "-addext", f"subjectAltName={san}", "-keyout", key, "-out", cert],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"openssl made the certificate {name}", r.stderr[-300:])
    return cert, key


def case_jobs_webhook(ditd):
    """Webhooks over https for image jobs: a receiver on 127.0.0.1 behind TLS (a certificate
    made here, trusted through --webhook-ca) gets job.completed for a background image job and
    job.failed for one the replica refuses, both verified by the official client's
    webhooks.unwrap; a receiver whose certificate does not lead to the given root, or does not
    name the URL's host, gets nothing (the attempts count as failed); bad --webhook-ca uses stop
    the start."""
    import http.server
    import ssl
    import threading
    import openai
    if not shutil.which("openssl"):
        print("skip: no openssl")
        return 77
    tmp = tempfile.mkdtemp(prefix="ditd-hook-tls-")
    secret = "whsec_" + base64.b64encode(b"ditd-test-webhook-key-tls-01234").decode()
    ip_cert, ip_key = make_cert(tmp, "receiver", "IP:127.0.0.1")
    other, _ = make_cert(tmp, "other", "IP:127.0.0.1")
    dns_cert, dns_key = make_cert(tmp, "named", "DNS:localhost")
    got, lock = [], threading.Lock()

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                got.append((dict(self.headers), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass

    def receiver(cert, key):
        srv = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv, f"https://127.0.0.1:{srv.server_address[1]}/hooks/ditd"

    def wait_events(k, timeout=60):
        t0 = time.time()
        while time.time() - t0 < timeout and len(got) < k:
            time.sleep(0.1)
        return len(got)

    srvs = []
    try:
        srv, url = receiver(ip_cert, ip_key)
        srvs.append(srv)
        for flags, needle in [(["--webhook-secret", secret, "--webhook-url", url, "--webhook-ca",
                                os.path.join(tmp, "none.pem")], "--webhook-ca"),
                              (["--webhook-secret", secret, "--webhook-url", "http://127.0.0.1:9/x",
                                "--webhook-ca", ip_cert], "--webhook-ca with an http://"),
                              (["--webhook-ca", ip_cert], "--webhook-ca without --webhook-url")]:
            r = subprocess.run([ditd, "serve", "--port", "0", *flags],
                               capture_output=True, text=True, timeout=60)
            check(r.returncode != 0 and needle in r.stderr,
                  f"{' '.join(flags[-2:])}: refused naming '{needle}'", r.stderr[-300:])
        client = openai.OpenAI(api_key="x", webhook_secret=secret)
        d = Daemon(ditd, "--webhook-url", url, "--webhook-ca", ip_cert,
                   env={"DITD_WEBHOOK_SECRET": secret})
        try:
            st, _, o = create(d, SMALL)
            check(st == 202, "a background image job", st)
            done = wait_status(d, o["id"], ("completed",)) if st == 202 else {}
            check(done.get("status") == "completed", "the job completed", done)
            check(wait_events(1) == 1, "one event reached the https receiver", len(got))
            if got:
                ev = client.webhooks.unwrap(got[0][1], got[0][0])
                check(ev.type == "job.completed" and ev.data.id == o["id"],
                      "webhooks.unwrap verifies it: job.completed for the job", ev)
            # the replica refuses TaylorSeer's default identifiers (no DiT module
            # matches ^blocks.*attn): the job fails
            st, _, f = create(d, dict(SMALL, cache={"method": "taylorseer_cache"}))
            fo = wait_status(d, f["id"], ("failed",)) if st == 202 else {}
            check(fo.get("status") == "failed", "a job the replica refuses fails", fo)
            check(wait_events(2) == 2, "its event came too", len(got))
            if len(got) >= 2:
                ev = client.webhooks.unwrap(got[1][1], got[1][0])
                check(ev.type == "job.failed" and ev.data.id == f["id"],
                      "webhooks.unwrap verifies it: job.failed for that job", ev)
            m = d.metrics()
            check(m.get('ditd_webhooks_total{outcome="delivered"}') == 2,
                  "metrics: 2 delivered", {k: v for k, v in m.items() if "webhook" in k})
        finally:
            d.stop()
        # the receiver's certificate checked: another root, then a name that is not the host
        for cert, key, why in [(ip_cert, ip_key, "a root that did not sign it"),
                               (dns_cert, dns_key, "a certificate for localhost, not 127.0.0.1")]:
            srv2, url2 = receiver(cert, key)
            srvs.append(srv2)
            ca = other if cert == ip_cert else dns_cert
            before = len(got)
            d = Daemon(ditd, "--webhook-url", url2, "--webhook-ca", ca,
                       env={"DITD_WEBHOOK_SECRET": secret})
            try:
                st, _, o = create(d, dict(SMALL, n=1))
                done = wait_status(d, o["id"], ("completed",)) if st == 202 else {}
                t0 = time.time()
                m = {}
                while time.time() - t0 < 20:
                    m = d.metrics()
                    if m.get("ditd_webhook_failed_attempts_total", 0) >= 2:
                        break
                    time.sleep(0.2)
                check(done.get("status") == "completed" and len(got) == before and
                      m.get("ditd_webhook_failed_attempts_total", 0) >= 2 and
                      not m.get('ditd_webhooks_total{outcome="delivered"}'),
                      f"{why}: nothing delivered, the attempts fail (and are retried)",
                      len(got) - before, {k: v for k, v in m.items() if "webhook" in k})
                log = d.logtext()
                check("TLS" in log, f"{why}: the log names the TLS failure", log[-300:])
            finally:
                d.stop()
    finally:
        for x in srvs:
            x.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


CASES = {"jobs": case_jobs, "jobs_list": case_jobs_list, "jobs_limits": case_jobs_limits,
         "jobs_restart": case_jobs_restart, "jobs_full_disk": case_jobs_full_disk,
         "jobs_webhook": case_jobs_webhook}


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
