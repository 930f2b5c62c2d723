#!/usr/bin/env python3
"""LoRA adapters at run time in `ditd serve` (issue 26, docs/lora.md): POST
/v1/loras and DELETE /v1/loras/NAME under an admin key, and the device
cache of --lora-cache-mb, on the tiny DiT (tests/fixtures/models/
tiny-p2-c1-h6) with the adapters of tests/fixtures/lora. Every image is
checked against `ditd generate --lora` with the same seed. Exit 0 pass, 1
fail, 77 skip.

usage: test_lora_live.py --ditd BUILD/ditd CASE
cases: lora_admin (keys: none, wrong, an API key, the admin key; a load then
       requests with it equal to `ditd generate --lora`; the path rule; a
       bad file refused naming the tensor while the server keeps serving;
       bad bodies; an unload refused while a request waits with it, then
       done: the request 400s naming the adapter; the same name loaded from
       another file; /metrics),
       lora_admin_off (no --admin-key: both routes 403),
       lora_cache (--lora-cache-mb holding one of two adapters: alternating
       requests each equal to `ditd generate --lora`; loads, hits, misses,
       evictions and resident bytes counted exactly),
       lora_admin_mpi (mpirun: ulysses 2 and tp 2 with the cache, dp 2:
       loads, unloads and evictions reach every rank of every replica)
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http as th  # noqa: E402
import test_lora as tl  # noqa: E402
from test_http import Daemon, check  # noqa: E402

MODEL, MODEL_ID = tl.MODEL, tl.MODEL_ID
D4, D8, FLUX4 = tl.D4, tl.D8, tl.FLUX4
ADMIN = "admin-secret-1"
API = "api-key-1"


def admin(key=ADMIN):
    return {"Authorization": f"Bearer {key}"} if key else {}


def post(d, body, key=ADMIN):
    st, _, data = d.request("POST", "/v1/loras", body, admin(key))
    return st, json.loads(data) if data else {}


def delete(d, name, key=ADMIN):
    st, _, data = d.request("DELETE", f"/v1/loras/{name}", None, admin(key))
    return st, json.loads(data) if data else {}


def err(o):
    e = o.get("error", {})
    return e.get("code"), e.get("param"), e.get("message", "")


def loras(d):
    st, _, data = d.request("GET", "/v1/loras")
    assert st == 200, (st, data[:200])
    o = json.loads(data)
    check(th.validate(o, "LoraList"), "GET /v1/loras: the LoraList schema")
    return {x["id"]: x for x in o["data"]}


def all_ready(d, timeout=120):
    """Waits until every replica said ready (/readyz is 200 with one: an
    adapter op needs them all, and answers 503 before)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        _, _, data = d.request("GET", "/healthz")
        reps = json.loads(data).get("replicas", [])
        if reps and all(r["ready"] for r in reps):
            return True
        time.sleep(0.1)
    return False


def series(m, name, adapter):
    return m.get(f'{name}{{model="{MODEL_ID}",adapter="{adapter}"}}')


def same(got, want):
    return got == want, sum(1 for a, b in zip(got, want) if a != b)


def case_lora_admin(ditd):
    tmp = tempfile.mkdtemp(prefix="ditd-lora-live-")
    root = os.path.join(tmp, "root")
    os.mkdir(root)
    shutil.copy(D4, os.path.join(root, "d4.safetensors"))
    shutil.copy(D8, os.path.join(root, "d8.safetensors"))
    shutil.copy(FLUX4, os.path.join(root, "f4.safetensors"))   # another model's adapter
    os.mkdir(os.path.join(root, "sub"))
    outside = os.path.join(tmp, "outside.safetensors")
    shutil.copy(D4, outside)
    os.symlink(outside, os.path.join(root, "link.safetensors"))  # a link out of the root
    # API keys too: the admin routes take the admin key, not an API key
    d = Daemon(ditd, "--lora-root", root, "--max-batch", "4", "--batch-window-ms", "1500",
               env={"DITD_ADMIN_KEY": ADMIN}, api_key=API, model=MODEL)
    try:
        check(loras(d) == {}, "no adapters at start")
        body = {"name": "d4", "path": "d4.safetensors"}
        for what, key, code in [("no key", None, "invalid_admin_key"),
                                ("a wrong key", "nope", "invalid_admin_key"),
                                ("an API key", API, "invalid_admin_key")]:
            h = {"Authorization": f"Bearer {key}"} if key else {"Authorization": ""}
            st, _, data = d.request("POST", "/v1/loras", body, h)
            o = json.loads(data)
            check(st == 401 and err(o)[0] == code and "admin key" in err(o)[2]
                  and th.validate(o, "ErrorResponse"), f"POST with {what}: 401 {code}", (st, o))
            st, _, data = d.request("DELETE", "/v1/loras/d4", None, h)
            check(st == 401, f"DELETE with {what}: 401", st)
        check(loras(d) == {}, "refused loads changed nothing")

        # a load, then requests with it as `ditd generate --lora`
        st, o = post(d, body)
        check(st == 200 and th.validate(o, "Lora") and o["id"] == "d4" and o["loaded"]
              and o["replicas_loaded"] == 1 and o["format"] == "peft" and o["rank"] == 4
              and o["num_modules"] == 29 and o["bytes"] > 0,
              "POST /v1/loras d4 (a path under --lora-root): 200, loaded, peft, rank 4, 29 modules",
              (st, {k: o.get(k) for k in ("id", "loaded", "format", "rank", "num_modules")}))
        check(list(loras(d)) == ["d4"], "GET /v1/loras lists d4")
        base, _ = tl.pixels(d, None)
        got, _ = tl.pixels(d, [{"name": "d4", "scale": 0.8}])
        ok, diff = same(got, tl.cli_pixels(ditd, tmp, [("d4", D4, 0.8)], "cli_d4"))
        check(ok and got != base, f"after the load, d4 at 0.8 equals `ditd generate --lora` pixel "
              f"for pixel ({len(got)} values, {diff} differ) and differs from the base")
        st, o = post(d, body)
        check(st == 409 and err(o)[:2] == ("lora_exists", "name"), "the same name again: 409",
              (st, o))

        # the path rule
        for what, path, status, code in [
                ("an absolute path outside --lora-root", outside, 403, "path_not_allowed"),
                ("'..' out of the root", "../outside.safetensors", 403, "path_not_allowed"),
                ("a link out of the root", "link.safetensors", 403, "path_not_allowed"),
                ("a missing file", "nope.safetensors", 400, "file_not_found"),
                ("a folder", "sub", 400, "invalid_value")]:
            st, o = post(d, {"name": "x", "path": path})
            check(st == status and err(o)[:2] == (code, "path") and th.validate(o, "ErrorResponse"),
                  f"{what}: {status} {code}", (st, o))
        # bad bodies
        for what, b, param in [("no name", {"path": "d8.safetensors"}, "name"),
                               ("a bad name", {"name": "a b", "path": "d8.safetensors"}, "name"),
                               ("a name as a number", {"name": 4, "path": "d8.safetensors"}, "name"),
                               ("no path", {"name": "x"}, "path"),
                               ("an empty path", {"name": "x", "path": ""}, "path"),
                               ("an unknown field", {"name": "x", "path": "d8.safetensors", "scale": 1},
                                "scale")]:
            st, o = post(d, b)
            check(st == 400 and err(o)[1] == param, f"{what}: 400 naming {param}", (st, o))
        st, _, data = d.request("POST", "/v1/loras", "{", dict(admin(), **{"Content-Type": "application/json"}))
        check(st == 400, "a body that is not JSON: 400", st)

        # a file the loader refuses: named with the tensor, nothing changes
        st, o = post(d, {"name": "f4", "path": "f4.safetensors"})
        check(st == 400 and err(o)[:2] == ("invalid_lora", "path") and "context_embedder" in err(o)[2]
              and "f4.safetensors" in err(o)[2],
              "another model's adapter: 400 naming the file and the tensor", (st, o))
        check(list(loras(d)) == ["d4"], "after the refused load: still d4 alone")
        got2, _ = tl.pixels(d, [{"name": "d4", "scale": 0.8}])
        check(got2 == got, "and the server keeps serving d4 (the same image)")
        st, _, data = d.generate(dict(tl.BASE, loras=[{"name": "f4"}]))
        check(st == 400 and "f4" in json.loads(data)["error"]["message"], "f4 is not an adapter of "
              "the server", st)

        # a second adapter, then an unload refused while a request waits with it
        st, o = post(d, {"name": "d8", "path": os.path.join(root, "d8.safetensors")})
        check(st == 200 and o["rank"] == 8, "d8 by an absolute path under the root: 200", (st, o))
        res = {}

        def waiting():
            res["img"] = tl.pixels(d, [{"name": "d8"}])[0]
        t = threading.Thread(target=waiting)
        t.start()
        time.sleep(0.5)  # inside the 1.5 s batch window: queued
        st, o = delete(d, "d8")
        check(st == 409 and err(o)[0] == "lora_in_use" and "1 request" in err(o)[2],
              "DELETE while a queued request names it: 409 lora_in_use", (st, o))
        t.join()
        ok, diff = same(res.get("img", []), tl.cli_pixels(ditd, tmp, [("d8", D8, 1)], "cli_d8"))
        check(ok, f"that request's image equals `ditd generate --lora d8` ({diff} differ)")
        st, o = delete(d, "d8")
        check(st == 200 and th.validate(o, "LoraDeleted") and o == {"id": "d8", "object": "lora",
                                                                    "deleted": True},
              "DELETE once it is done: 200 deleted", (st, o))
        st, _, data = d.generate(dict(tl.BASE, loras=[{"name": "d8"}]))
        e = json.loads(data).get("error", {})
        check(st == 400 and e.get("param") == "loras[0].name" and "'d8'" in e.get("message", "")
              and "'d4'" in e.get("message", ""),
              "a request naming the unloaded adapter: 400 naming it (and listing d4)", (st, e))
        st, o = delete(d, "d8")
        check(st == 404 and err(o)[0] == "lora_not_found", "DELETE again: 404", (st, o))
        check(list(loras(d)) == ["d4"], "GET /v1/loras: d4 alone")

        # the name again, from another file: the replica's table follows
        st, o = delete(d, "d4")
        check(st == 200, "DELETE d4: 200", st)
        check(loras(d) == {}, "no adapters")
        got, _ = tl.pixels(d, None)
        check(got == base, "without adapters: the base image")
        st, o = post(d, {"name": "d4", "path": "d8.safetensors"})
        check(st == 200 and o["rank"] == 8, "d4 loaded again from d8's file", (st, o))
        got, _ = tl.pixels(d, [{"name": "d4", "scale": -0.5}])
        ok, diff = same(got, tl.cli_pixels(ditd, tmp, [("d8", D8, -0.5)], "cli_d8m"))
        check(ok, f"the name now means d8's file: equals `ditd generate --lora d8` at -0.5 "
              f"({diff} differ)")

        m = d.metrics()
        check(series(m, "ditd_lora_loads_total", "d4") == 1 and series(m, "ditd_lora_rows_total", "d4") == 1
              and series(m, "ditd_lora_cache_misses_total", "d4") == 0
              and series(m, "ditd_lora_cache_hits_total", "d4") == 1
              and series(m, "ditd_lora_loads_total", "d8") is None
              and m.get(f'ditd_lora_adapters{{model="{MODEL_ID}"}}') == 1
              and m.get(f'ditd_lora_resident_bytes{{model="{MODEL_ID}"}}') == o["bytes"],
              "metrics: d4's series restart with its new load (1 load, 1 hit, 1 image), d8's "
              "are gone, 1 adapter resident with its bytes",
              {k: v for k, v in m.items() if "lora" in k})
    finally:
        rc = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(rc == 0, "exit 0", rc)


def case_lora_admin_off(ditd):
    d = Daemon(ditd, "--lora", f"d4={D4}", "--lora-root", os.path.dirname(D4), model=MODEL)
    try:
        for what, (st, o) in [("POST", post(d, {"name": "x", "path": D8})),
                              ("DELETE", delete(d, "d4"))]:
            check(st == 403 and err(o)[0] == "admin_disabled" and "--admin-key" in err(o)[2],
                  f"{what} without --admin-key configured: 403 admin_disabled", (st, o))
        check(list(loras(d)) == ["d4"], "d4 stays")
        st, _, _ = d.request("PUT", "/v1/loras", {})
        check(st == 405, "PUT /v1/loras: 405", st)
    finally:
        rc = d.stop()
    check(rc == 0, "exit 0", rc)


def lora_bytes(ditd):
    """Each fixture adapter's device bytes (a server without a cache)."""
    d = Daemon(ditd, "--lora", f"d4={D4}", "--lora", f"d8={D8}", model=MODEL)
    try:
        return {k: v["bytes"] for k, v in loras(d).items()}
    finally:
        d.stop()


def cache_run(ditd, d, tmp, sizes, what, check_bytes=True):
    """Alternating requests on a server whose cache holds one of d4, d8
    (given at start in that order): each image as `ditd generate`, and the
    cache's counters exactly (and the resident bytes, unless check_bytes is
    off: under tp a rank holds slices). A budget under either adapter
    evicts the same way (a batch always gets its own). Returns the number
    of images checked."""
    want = {"d4": tl.cli_pixels(ditd, tmp, [("d4", D4, 1)], "c4"),
            "d8": tl.cli_pixels(ditd, tmp, [("d8", D8, 1)], "c8"),
            "both": tl.cli_pixels(ditd, tmp, [("d4", D4, 1), ("d8", D8, 1)], "c48")}
    tol = 0 if "mpi" not in what else 1

    def close(got, w):
        return len(got) == len(w) and max(abs(a - b) for a, b in zip(got, w)) <= tol

    def counts():
        m = d.metrics()
        return {(n, a): series(m, f"ditd_lora_{n}_total", a) for n in ("loads", "cache_hits",
                "cache_misses", "evictions") for a in ("d4", "d8")}, \
            m.get(f'ditd_lora_resident_bytes{{model="{MODEL_ID}"}}')

    # start: d4 loaded, d8 loaded and d4 evicted for it
    exp = {("loads", "d4"): 1, ("loads", "d8"): 1, ("evictions", "d4"): 1, ("evictions", "d8"): 0,
           ("cache_hits", "d4"): 0, ("cache_hits", "d8"): 0, ("cache_misses", "d4"): 0,
           ("cache_misses", "d8"): 0}
    c, res = counts()
    check(c == exp and (res == sizes["d8"] or not check_bytes), f"{what}: at start d8 resident, d4 evicted "
          f"({int(res or 0)} bytes resident)", (c, res))
    g = loras(d)
    check(not g["d4"]["loaded"] and g["d8"]["loaded"] and (g["d4"]["bytes"] == sizes["d4"] or not check_bytes),
          f"{what}: GET /v1/loras: d4 known, not loaded (with its bytes); d8 loaded")
    n = 0
    # (adapters of the request, what it does to the cache)
    plan = [("d4", "miss d4, evict d8"), ("d8", "miss d8, evict d4"), ("d4", "miss d4, evict d8"),
            ("d8", "miss d8, evict d4"), ("d8", "hit d8"), ("both", "hit d8, miss d4 (over the "
            "budget for this batch)"), ("d4", "hit d4, evict d8 (back under the budget)")]
    for name, how in plan:
        req = [{"name": "d4"}, {"name": "d8"}] if name == "both" else [{"name": name}]
        got, _ = tl.pixels(d, req)
        for a in (["d4", "d8"] if name == "both" else [name]):
            other = "d8" if a == "d4" else "d4"
            if f"miss {a}" in how:
                exp[("cache_misses", a)] += 1
                exp[("loads", a)] += 1
            if f"hit {a}" in how:
                exp[("cache_hits", a)] += 1
            if f"evict {other}" in how:
                exp[("evictions", other)] += 1
        c, res = counts()
        resident = {"d4": sizes["d4"], "d8": sizes["d8"], "both": sizes["d4"] + sizes["d8"]}[name]
        ok = close(got, want[name])
        check(ok and c == exp and (res == resident or not check_bytes),
              f"{what}: {name} ({how}): the image as `ditd generate --lora`, counters exact, "
              f"{int(res or 0)} bytes resident", (ok, {k: (c[k], exp[k]) for k in c if c[k] != exp[k]}, res))
        n += 1
    return n


def case_lora_cache(ditd):
    sizes = lora_bytes(ditd)
    check(len(sizes) == 2 and all(v > 0 for v in sizes.values()), "the adapters' bytes", sizes)
    # room for the larger alone, not for both
    mb = (max(sizes.values()) + min(sizes.values()) / 2) / 2**20
    tmp = tempfile.mkdtemp(prefix="ditd-lora-live-")
    d = Daemon(ditd, "--lora", f"d4={D4}", "--lora", f"d8={D8}", "--lora-cache-mb", f"{mb:.9f}",
               model=MODEL)
    try:
        n = cache_run(ditd, d, tmp, sizes, "cache")
        check(n == 7, f"{n} cached requests checked")
    finally:
        rc = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(rc == 0, "exit 0", rc)


def case_lora_admin_mpi(ditd):
    """mpirun -np 3: ulysses 2 (one replica of two ranks: both ranks must
    load, unload and evict alike, or the image goes wrong) with the cache,
    dp 2 (two replicas: each takes the op) and tp 2 (each rank uploads its
    slices of what it loads). Images as one rank's `ditd generate --lora`
    to the 8-bit quantum (layouts promise latents within 1e-4)."""
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        return 77
    sizes = lora_bytes(ditd)
    mb = (max(sizes.values()) + min(sizes.values()) / 2) / 2**20
    tmp = tempfile.mkdtemp(prefix="ditd-lora-live-")
    root = os.path.join(tmp, "root")
    os.mkdir(root)
    shutil.copy(D4, os.path.join(root, "d4.safetensors"))
    shutil.copy(D8, os.path.join(root, "d8.safetensors"))
    shutil.copy(FLUX4, os.path.join(root, "f4.safetensors"))
    want4 = tl.cli_pixels(ditd, tmp, [("d4", D4, 1)], "m4")
    want8 = tl.cli_pixels(ditd, tmp, [("d8", D8, 1)], "m8")
    base = tl.cli_pixels(ditd, tmp, [], "mb")

    def close(got, w):
        return len(got) == len(w) and max(abs(a - b) for a, b in zip(got, w)) <= 1

    try:
        n = 0
        for what, flags in [("ulysses 2", ["--ulysses-degree", "2"]), ("dp 2", ["--dp", "2"]),
                            ("tp 2", ["--tp-degree", "2"])]:
            # the cache: under ulysses 2 holding one adapter; under tp 2 a
            # budget of a few bytes (each rank counts the whole adapter there)
            extra = {"ulysses 2": ["--lora-cache-mb", f"{mb:.9f}"],
                     "tp 2": ["--lora-cache-mb", "0.000001"]}.get(what, [])
            if extra:
                extra += ["--lora", f"d4={D4}", "--lora", f"d8={D8}"]
            d = Daemon(ditd, "--lora-root", root, *flags, *extra, mpi_np=3,
                       env={"DITD_ADMIN_KEY": ADMIN}, model=MODEL)
            try:
                check(all_ready(d), f"{what}: every replica ready")
                if extra:
                    # the group's cache: both ranks evict and reload alike
                    n += cache_run(ditd, d, tmp, sizes, f"mpi {what}", what != "tp 2")
                    for name in ("d4", "d8"):
                        st, _ = delete(d, name)
                        check(st == 200, f"{what}: DELETE {name}", st)
                st, o = post(d, {"name": "a", "path": "d4.safetensors"})
                check(st == 200 and o["loaded"] and o["replicas_loaded"] == (2 if what == "dp 2" else 1),
                      f"{what}: POST a (d4's file): 200 on every replica", (st, o))
                for k in range(2):  # dp 2: either replica may run it
                    got, _ = tl.pixels(d, [{"name": "a"}])
                    check(close(got, want4), f"{what}, request {k}: a as `ditd generate --lora d4`")
                    n += 1
                st, o = post(d, {"name": "f4", "path": "f4.safetensors"})
                check(st == 400 and "context_embedder" in err(o)[2],
                      f"{what}: a bad file: 400 naming the tensor", (st, o))
                check(sorted(loras(d)) == ["a"], f"{what}: nothing else changed")
                st, _ = delete(d, "a")
                check(st == 200, f"{what}: DELETE a: 200", st)
                st, _, _ = d.generate(dict(tl.BASE, loras=[{"name": "a"}]))
                check(st == 400, f"{what}: a request naming a: 400", st)
                st, o = post(d, {"name": "a", "path": "d8.safetensors"})
                check(st == 200, f"{what}: a again, from d8's file", (st, o))
                for k in range(2):
                    got, _ = tl.pixels(d, [{"name": "a"}])
                    check(close(got, want8), f"{what}, request {k}: a now as `ditd generate --lora "
                          f"d8` (every rank of every replica reloaded it)")
                    n += 1
                got, _ = tl.pixels(d, None)
                check(close(got, base), f"{what}: no adapters: the base image")
            finally:
                rc = d.stop()
            check(rc == 0, f"{what}: exit 0", rc)
        check(n == 26, f"{n} mpi images checked")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


CASES = {"lora_admin": case_lora_admin, "lora_admin_off": case_lora_admin_off,
         "lora_cache": case_lora_cache, "lora_admin_mpi": case_lora_admin_mpi}


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
