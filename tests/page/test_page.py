#!/usr/bin/env python3
"""The web page at GET /, driven in headless Chromium as a person would use
it: a real `ditd serve` on 127.0.0.1, Chromium spoken to over the DevTools
protocol on a pipe (--remote-debugging-pipe: no websocket library needed).
The test fills the form, presses Generate, waits for the grid, then decodes
every result image's data: URL and compares it byte for byte with the same
request made with curl (same seed: ditd is deterministic). It also checks
the progress bar and previews the SSE stream fed, and that an error the
server returns is shown on the page as the server worded it.

With --text it serves a text model instead (the tiny FLUX pipeline the
build makes, BUILD/tests/golden/flux_pipeline/dev, or DITD_TEXT_MODEL): the
page shows a prompt box, a negative prompt and width/height fields from the
model's size range, no class picker, and its images equal curl's.

With --video it serves the tiny Wan 2.2 folder the build makes: the page
shows a frame count, makes one clip through /v1/videos, plays it, and its
MP4 equals curl's; Stop deletes a running clip's job. With --i2v it serves the
tiny Wan 2.1 I2V folder: the start image picker, a clip made from an image
(input_reference), its MP4 equal to curl's.

usage: test_page.py --ditd BUILD/ditd [--model DIR] [--text | --video | --i2v] [--screenshot OUT.png]
exit 0 pass, 1 fail, 77 skip (no Chromium; --text: no text model)."""
import argparse
import base64
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.environ.get("DITD_FIXTURES", os.path.join(ROOT, "tests", "fixtures"))

failures = []


def check(cond, what, got=None, want=None):
    if cond:
        print(f"ok   {what}")
    else:
        msg = f"FAIL {what}"
        if got is not None or want is not None:
            msg += f": got {got!r}, want {want!r}"
        print(msg)
        failures.append(what)


class Browser:
    """Chromium with the DevTools protocol on fds 3 (in) and 4 (out):
    NUL-separated JSON messages, one flat session per page."""

    def __init__(self, exe):
        self.profile = tempfile.mkdtemp(prefix="ditd-chromium-")
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()

        def fds():  # in the child: the protocol wants exactly fds 3 and 4
            os.dup2(to_r, 100)  # by way of fds that cannot collide with 3 and 4
            os.dup2(from_w, 101)
            os.dup2(100, 3)
            os.dup2(101, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-sync", "--mute-audio",
             "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             "--window-size=1100,760", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=fds, pass_fds=(3, 4), start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self.buf = b""
        self.next_id = 0
        self.session = None

    def send(self, method, params=None, session=True, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\0" not in self.buf:
                chunk = os.read(self.from_r, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe: " +
                                       self.proc.stderr.read().decode(errors="replace")[-2000:])
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise TimeoutError(method)

    def open(self, url):
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.send("Page.enable")
        self.send("Page.navigate", {"url": url})

    def js(self, expr):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                v = self.js(expr)
                if v:
                    return v
            except RuntimeError:
                pass  # the document may still be loading
            time.sleep(0.05)
        return None

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def curl_json(url, body=None):
    cmd = ["curl", "-sS", "--max-time", "120", url]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)


def png_size(data):
    check(data[:8] == b"\x89PNG\r\n\x1a\n", "result is a PNG")
    return struct.unpack(">II", data[16:24])


def ready(base):
    import urllib.request
    try:
        with urllib.request.urlopen(base + "/readyz", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def start_daemon(ditd, model, log, *extra):
    """ditd serve on a free port, its replica ready: (process, base URL)."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    daemon = subprocess.Popen([ditd, "serve", "--model", model, "--host", "127.0.0.1",
                               "--port", "0", "--threads", "1", "--max-batch", "8", *extra],
                              stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log.name).read())
        if m and ready(f"http://127.0.0.1:{m.group(1)}"):
            return daemon, f"http://127.0.0.1:{m.group(1)}"
        if daemon.poll() is not None:
            break
        time.sleep(0.05)
    daemon.kill()
    raise RuntimeError("ditd serve did not start:\n" + open(log.name).read())


def text_page(args, exe):
    """The page with a text model: its form, one generation, curl's bytes."""
    model_dir = os.environ.get("DITD_TEXT_MODEL") or os.path.join(
        os.path.dirname(os.path.abspath(args.ditd)), "tests", "golden", "flux_pipeline", "dev")
    if not os.path.exists(os.path.join(model_dir, "model_index.json")):
        print("skip: no text model (the build's tests/golden/flux_pipeline/dev; or set DITD_TEXT_MODEL)")
        return 77
    log = tempfile.NamedTemporaryFile("w+", prefix="ditd-page-", suffix=".log", delete=False)
    daemon, browser = None, None
    try:
        daemon, base = start_daemon(args.ditd, model_dir, log, "--served-model-name", "flux-alias")
        model = curl_json(base + "/v1/models")["data"][0]
        r = model["size_range"]
        check(model["conditioning"] == "text" and r["resizable"], "the test model is a resizable text model")
        browser = Browser(exe)
        browser.open(base + "/")
        # "idle" is also the state before /v1/models answers: wait for the list
        browser.wait("document.getElementById('status')?.dataset.state === 'idle' && "
                     "document.getElementById('model').options.length")
        opts = browser.js("[...document.getElementById('model').options].map(o => o.value)")
        check(opts == [model["id"]], "the model picker lists the model once, not its aliases", opts)
        shown = lambda i: browser.js(f"!document.getElementById('{i}').classList.contains('hidden')")
        check(shown("prompt-row") and shown("negative-row") and shown("size-row") and not shown("class-row"),
              "a text model: prompt, negative prompt and size shown, no class picker")
        dw, dh = (int(x) for x in r["default"].split("x"))
        got = browser.js("['width','height'].map(i => { const e = document.getElementById(i); "
                         "return [Number(e.value), Number(e.min), Number(e.max), Number(e.step)]; })")
        check(got == [[dw, r["min"], r["max"], r["multiple"]], [dh, r["min"], r["max"], r["multiple"]]],
              "width and height: the default size, bounds and step from /v1/models", got)
        w, h = max(r["min"], 4 * r["multiple"]), max(r["min"], 2 * r["multiple"])
        prompt, seed, n, steps = "a red fox in the snow", 77, 2, 2
        browser.js(f"""(() => {{
            const set = (id, v) => {{ document.getElementById(id).value = v; }};
            set('prompt', {json.dumps(prompt)}); set('width', '{w}'); set('height', '{h}');
            set('steps', '{steps}'); set('seed', '{seed}'); set('n', '{n}'); set('partials', '0');
            document.getElementById('go').click();
            return true; }})()""")
        final = browser.wait("['done', 'error'].includes(document.getElementById('status').dataset.state)"
                             " && document.getElementById('status').dataset.state", timeout=120)
        check(final == "done", "the page reports done", final,
              browser.js("document.getElementById('error').textContent"))
        srcs = browser.js("[...document.querySelectorAll('#grid figure.done')].sort((a, b) => "
                          "a.dataset.index - b.dataset.index).map(f => f.querySelector('img').src)")
        ref = curl_json(base + "/v1/images/generations",
                        {"model": model["id"], "prompt": prompt, "n": n, "seed": seed, "size": f"{w}x{h}",
                         "num_inference_steps": steps, "guidance_scale": model["defaults"]["guidance_scale"],
                         "sampler": model["defaults"]["sampler"], "true_cfg_scale": 1})
        want = [base64.b64decode(d["b64_json"]) for d in sorted(ref["data"], key=lambda d: d["index"])]
        page = [base64.b64decode(x.split(",", 1)[1]) for x in srcs]
        check(len(page) == n and all(png_size(p) == (w, h) for p in page),
              f"{n} images of {w}x{h} in the grid", [png_size(p) for p in page])
        check(page == want, "page bytes == curl bytes (prompt, size, seed)")
        if args.screenshot:
            browser.screenshot(args.screenshot)
    except Exception as e:
        check(False, f"test ran to the end ({type(e).__name__}: {e})")
    finally:
        if browser:
            browser.close()
        if daemon:
            daemon.terminate()
            try:
                rc = daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, 9)
                rc = daemon.wait()
            check(rc == 0, "ditd serve drained and exited 0", rc, 0)
        if failures:
            print(open(log.name).read()[-3000:])
        os.unlink(log.name)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


def video_page(args, exe):
    """The page with a video model (the build's tiny Wan 2.2 folder): a frame count instead of
    images and previews, one clip made through /v1/videos and played, its MP4 the bytes the
    same request gives through curl; Stop deletes a running clip."""
    model_dir = os.path.join(os.path.dirname(os.path.abspath(args.ditd)), "tests", "golden",
                             "wan_pipeline", "wan22")
    if not os.path.exists(os.path.join(model_dir, "model_index.json")):
        print("skip: no video model (the build's tests/golden/wan_pipeline/wan22)")
        return 77
    log = tempfile.NamedTemporaryFile("w+", prefix="ditd-page-", suffix=".log", delete=False)
    daemon, browser = None, None
    try:
        daemon, base = start_daemon(args.ditd, model_dir, log)
        model = curl_json(base + "/v1/models")["data"][0]
        check(model.get("video", {}).get("fps") == 16, "the test model is a video model", model.get("video"))
        browser = Browser(exe)
        browser.open(base + "/")
        browser.wait("document.getElementById('status')?.dataset.state === 'idle' && "
                     "document.getElementById('model').options.length")
        shown = lambda i: browser.js(f"!document.getElementById('{i}').classList.contains('hidden')")
        check(shown("frames-row") and shown("prompt-row") and shown("size-row") and not shown("n-row")
              and not shown("partials-row") and not shown("class-row") and not shown("start-row"),
              "a video model: frames, prompt and size shown; no image count, previews, classes "
              "or start image (text-to-video)")
        check(browser.js("Number(document.getElementById('frames').value)") == model["video"]["default_frames"],
              "the frame count defaults to the model's")
        prompt, seed, steps, frames = "a red fox running through snow", 5, 4, 5
        browser.js(f"""(() => {{
            const set = (id, v) => {{ document.getElementById(id).value = v; }};
            set('prompt', {json.dumps(prompt)}); set('width', '48'); set('height', '32');
            set('steps', '{steps}'); set('seed', '{seed}'); set('frames', '{frames}');
            document.getElementById('go').click();
            return true; }})()""")
        final = browser.wait("['done', 'error'].includes(document.getElementById('status').dataset.state)"
                             " && document.getElementById('status').dataset.state", timeout=120)
        check(final == "done", "the page reports the clip done", final,
              browser.js("document.getElementById('error').textContent"))
        b64 = browser.js("(async () => { const v = document.querySelector('#clip video'); "
                         "if (!v.src) return 'no src'; try { const b = await (await fetch(v.src)).arrayBuffer(); "
                         "let s = ''; for (const x of new Uint8Array(b)) s += String.fromCharCode(x); "
                         "return btoa(s); } catch (e) { return 'error ' + e; } })()")
        if not b64 or b64.startswith(("no src", "error")):
            check(False, "the clip's MP4 is in the page", b64)
            b64 = ""
        page_mp4 = base64.b64decode(b64 or "")
        dims = browser.wait("(() => { const v = document.querySelector('#clip video'); "
                            "return v.readyState >= 1 && v.videoWidth ? [v.videoWidth, v.videoHeight, "
                            "Math.round(v.duration * 1000)] : null; })()", timeout=20)
        check(dims is not None and dims[:2] == [48, 32] and abs(dims[2] - 312) <= 70,
              "the browser plays the clip: 48x32, 5 frames at 16 fps (~0.31 s)", dims)
        trace = browser.js("window.ditdTrace")
        check(trace and trace[-1] == "completed:100", "the page polled the job to completed", trace[-3:])
        body = {"model": model["id"], "prompt": prompt, "size": "48x32", "num_frames": frames,
                "seed": seed, "num_inference_steps": steps,
                "guidance_scale": model["defaults"]["guidance_scale"],
                "sampler": model["defaults"]["sampler"]}
        vid = curl_json(base + "/v1/videos", body)["id"]
        t0, st = time.time(), ""
        while time.time() - t0 < 120 and st not in ("completed", "failed"):
            st = curl_json(base + f"/v1/videos/{vid}")["status"]
            time.sleep(0.1)
        want = subprocess.run(["curl", "-sf", base + f"/v1/videos/{vid}/content"],
                              capture_output=True).stdout
        check(page_mp4[4:8] == b"ftyp" and page_mp4 == want,
              "the page's MP4 == curl's for the same request (%d bytes)" % len(page_mp4))
        # the key's clips: the page's and curl's, newest first, completed
        browser.js("listClips(), true")
        listed = browser.wait("(() => { const l = [...document.querySelectorAll('#clips li')]; "
                              "return l.length >= 2 ? l.map(x => [x.dataset.id, x.dataset.status]) "
                              ": null; })()", timeout=20)
        check(listed is not None and listed[0] == [vid, "completed"] and
              all(s == "completed" for _, s in listed),
              "the page lists the key's clips, newest first, each completed", listed)
        # Stop on a long clip deletes the job
        browser.js("""(() => { const set = (id, v) => { document.getElementById(id).value = v; };
            set('width', '256'); set('height', '256'); set('frames', '33'); set('steps', '200');
            document.getElementById('go').click(); return true; })()""")
        browser.wait("document.getElementById('status').dataset.state === 'running' && "
                     "window.ditdTrace.some(t => t.startsWith('in_progress'))", timeout=60)
        browser.js("document.getElementById('stop').click(), true")
        final = browser.wait("document.getElementById('status').dataset.state === 'error' && "
                             "document.getElementById('error').textContent", timeout=30)
        check(final == "Stopped.", "Stop: the page says stopped", final)
        t0, ids = time.time(), None
        while time.time() - t0 < 10:
            ids = [v["id"] for v in curl_json(base + "/v1/videos")["data"]]
            if len(ids) == 2:  # the two completed clips: the stopped one is deleted
                break
            time.sleep(0.1)
        check(ids is not None and len(ids) == 2, "Stop deleted the running clip's job", ids)
        if args.screenshot:
            browser.screenshot(args.screenshot)
    except Exception as e:
        check(False, f"test ran to the end ({type(e).__name__}: {e})")
    finally:
        if browser:
            browser.close()
        if daemon:
            daemon.terminate()
            try:
                rc = daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, 9)
                rc = daemon.wait()
            check(rc == 0, "ditd serve drained and exited 0", rc, 0)
        if failures:
            print(open(log.name).read()[-3000:])
        os.unlink(log.name)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


def i2v_page(args, exe):
    """The page with an image-to-video model (the build's tiny Wan 2.1 I2V folder, capped at
    64 px by a ditd.json): a start-image picker shown (a text-to-video model has none), a clip
    refused on the page without one, then made from one (sent as input_reference in a form) and
    played; its MP4 the bytes curl's JSON request with the same image gives."""
    src = os.path.join(os.path.dirname(os.path.abspath(args.ditd)), "tests", "golden",
                       "wan_pipeline", "i2v21")
    if not os.path.exists(os.path.join(src, "model_index.json")):
        print("skip: no image-to-video model (the build's tests/golden/wan_pipeline/i2v21)")
        return 77
    tmp = tempfile.mkdtemp(prefix="ditd-page-i2v-")
    model_dir = os.path.join(tmp, "i2v21")
    os.mkdir(model_dir)
    for f in os.listdir(src):
        os.symlink(os.path.join(src, f), os.path.join(model_dir, f))
    with open(os.path.join(model_dir, "ditd.json"), "w") as f:
        json.dump({"max_image_size": 64}, f)
    png = open(os.path.join(FIXTURES, "wan_pipeline", "expected_i2v",
                            "ti2vi_9f_32x64_resized_image.png"), "rb").read()  # 48x24
    log = tempfile.NamedTemporaryFile("w+", prefix="ditd-page-", suffix=".log", delete=False)
    daemon, browser = None, None
    try:
        daemon, base = start_daemon(args.ditd, model_dir, log)
        model = curl_json(base + "/v1/models")["data"][0]
        check(model.get("video", {}).get("input_reference") == "required",
              "/v1/models: the image-to-video model requires input_reference", model.get("video"))
        browser = Browser(exe)
        browser.open(base + "/")
        browser.wait("document.getElementById('status')?.dataset.state === 'idle' && "
                     "document.getElementById('model').options.length")
        check(browser.js("!document.getElementById('start-row').classList.contains('hidden')"),
              "an image-to-video model: the start image picker is shown")
        prompt, seed, steps, frames = "a red fox running through snow", 5, 2, 5
        browser.js(f"""(() => {{
            const set = (id, v) => {{ document.getElementById(id).value = v; }};
            set('prompt', {json.dumps(prompt)}); set('width', '48'); set('height', '32');
            set('steps', '{steps}'); set('seed', '{seed}'); set('frames', '{frames}');
            document.getElementById('go').click();
            return true; }})()""")
        final = browser.wait("['done', 'error'].includes(document.getElementById('status').dataset.state)"
                             " && document.getElementById('error').textContent", timeout=30)
        check("start image" in (final or ""), "without a start image the page says to pick one",
              final)
        browser.js(f"""(() => {{
            const b = atob({json.dumps(base64.b64encode(png).decode())});
            const u = new Uint8Array(b.length);
            for (let i = 0; i < b.length; i++) u[i] = b.charCodeAt(i);
            const dt = new DataTransfer();
            dt.items.add(new File([u], "start.png", {{ type: "image/png" }}));
            document.getElementById('start').files = dt.files;
            document.getElementById('go').click();
            return true; }})()""")
        final = browser.wait("['done', 'error'].includes(document.getElementById('status').dataset.state)"
                             " && !document.getElementById('go').disabled"
                             " && document.getElementById('status').dataset.state", timeout=120)
        check(final == "done", "the page makes the clip from the start image", final,
              browser.js("document.getElementById('error').textContent"))
        b64 = browser.js("(async () => { const v = document.querySelector('#clip video'); "
                         "if (!v.src) return 'no src'; try { const b = await (await fetch(v.src)).arrayBuffer(); "
                         "let s = ''; for (const x of new Uint8Array(b)) s += String.fromCharCode(x); "
                         "return btoa(s); } catch (e) { return 'error ' + e; } })()")
        page_mp4 = base64.b64decode(b64) if b64 and not b64.startswith(("no src", "error")) else b""
        dims = browser.wait("(() => { const v = document.querySelector('#clip video'); "
                            "return v.readyState >= 1 && v.videoWidth ? [v.videoWidth, v.videoHeight] "
                            ": null; })()", timeout=20)
        check(dims == [48, 32], "the browser plays the 48x32 clip", dims)
        body = {"model": model["id"], "prompt": prompt, "size": "48x32", "num_frames": frames,
                "seed": seed, "num_inference_steps": steps,
                "guidance_scale": model["defaults"]["guidance_scale"],
                "sampler": model["defaults"]["sampler"],
                "input_reference": "data:image/png;base64," + base64.b64encode(png).decode()}
        vid = curl_json(base + "/v1/videos", body)["id"]
        t0, st = time.time(), ""
        while time.time() - t0 < 60 and st not in ("completed", "failed"):
            st = curl_json(base + f"/v1/videos/{vid}")["status"]
            time.sleep(0.1)
        want = subprocess.run(["curl", "-sf", base + f"/v1/videos/{vid}/content"],
                              capture_output=True).stdout
        check(page_mp4[4:8] == b"ftyp" and page_mp4 == want,
              "the page's MP4 == curl's for the same request and image (%d bytes)" % len(page_mp4))
    except Exception as e:
        check(False, f"test ran to the end ({type(e).__name__}: {e})")
    finally:
        if browser:
            browser.close()
        if daemon:
            daemon.terminate()
            try:
                rc = daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, 9)
                rc = daemon.wait()
            check(rc == 0, "ditd serve drained and exited 0", rc, 0)
        if failures:
            print(open(log.name).read()[-3000:])
        os.unlink(log.name)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ditd", required=True)
    ap.add_argument("--model", default=os.path.join(FIXTURES, "models", "tiny-p4-c1-h3"))
    ap.add_argument("--screenshot")
    ap.add_argument("--class-label", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--text", action="store_true")
    ap.add_argument("--video", action="store_true")
    ap.add_argument("--i2v", action="store_true")
    args = ap.parse_args()

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        print("skip: no chromium (Debian: apt-get install chromium)")
        return 77
    if args.text:
        return text_page(args, exe)
    if args.video:
        return video_page(args, exe)
    if args.i2v:
        return i2v_page(args, exe)

    log = tempfile.NamedTemporaryFile("w+", prefix="ditd-page-", suffix=".log", delete=False)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    daemon = subprocess.Popen([args.ditd, "serve", "--model", args.model, "--host", "127.0.0.1",
                               "--port", "0", "--threads", "1", "--max-batch", "8"],
                              stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    browser = None
    try:
        port = None
        deadline = time.time() + 60
        while time.time() < deadline and port is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log.name).read())
            port = int(m.group(1)) if m else None
            if daemon.poll() is not None:
                raise RuntimeError("ditd serve exited:\n" + open(log.name).read())
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        model = curl_json(base + "/v1/models")["data"][0]
        classes = model["classes"]
        check(len(classes) >= 2, "the test model is class-conditional", len(classes), ">= 2")

        browser = Browser(exe)
        browser.open(base + "/")
        state = browser.wait("document.getElementById('status')?.dataset.state === 'idle' && "
                             "document.getElementById('class').options.length")
        check(state == len(classes), "the class list comes from /v1/models", state, len(classes))
        labels = browser.js("[...document.getElementById('class').options].map(o => o.text)")
        check(labels == [f"{c['id']}: {c['label']}" for c in classes], "class labels as served")
        check(browser.js("document.getElementById('steps').value") ==
              str(model["defaults"]["num_inference_steps"]), "steps default from the model")

        # --- one generation through the form
        seed, k = 20261201, 2
        browser.js(f"""(() => {{
            const set = (id, v) => {{ document.getElementById(id).value = v; }};
            set('class', '{args.class_label}'); set('steps', '{args.steps}'); set('guidance', '3');
            set('seed', '{seed}'); set('n', '{args.n}'); set('partials', '{k}');
            document.getElementById('go').click();
            return true; }})()""")
        t0 = time.time()
        final = browser.wait("['done', 'error'].includes(document.getElementById('status').dataset.state)"
                             " && document.getElementById('status').dataset.state", timeout=120)
        print(f"     page finished in {time.time() - t0:.2f} s: {final}")
        check(final == "done", "the page reports done", final, "done",)
        if final != "done":
            print("     page error:", browser.js("document.getElementById('error').textContent"))
        srcs = browser.js("[...document.querySelectorAll('#grid figure.done img')].map(i => i.src)")
        idx = browser.js("[...document.querySelectorAll('#grid figure.done')].map(f => Number(f.dataset.index))")
        check(len(srcs) == args.n, "one image per n in the grid", len(srcs), args.n)
        check(sorted(idx) == list(range(args.n)), "grid cells are indexes 0..n-1", idx)
        trace = browser.js("window.ditdTrace")
        check(browser.js("[document.getElementById('progress').value, document.getElementById('progress').max]")
              == [args.steps, args.steps], "progress bar full at the end")
        steps_seen = [t for t in trace if isinstance(t, int)]
        check(steps_seen == list(range(1, args.steps + 1)),
              "the page handled one progress event per step, in order", steps_seen)
        check(trace[-args.n:] == ["completed"] * args.n, "the stream ends with n completed events",
              trace[-args.n:])
        partials = int(browser.js("document.getElementById('grid').dataset.partials") or 0)
        check(partials == k * args.n, "previews shown (partial_images per image)", partials, k * args.n)

        # --- the same request over curl: the page's images must be its bytes
        ref = curl_json(base + "/v1/images/generations",
                        {"model": model["id"], "class_label": args.class_label, "n": args.n, "seed": seed,
                         "num_inference_steps": args.steps, "guidance_scale": 3,
                         "sampler": model["defaults"]["sampler"]})
        want = [base64.b64decode(d["b64_json"]) for d in sorted(ref["data"], key=lambda d: d["index"])]
        got = {}
        for i, s in zip(idx, srcs):
            check(s.startswith("data:image/png;base64,"), f"image {i} is a PNG data URL")
            got[i] = base64.b64decode(s.split(",", 1)[1])
        checked = 0
        size = [int(x) for x in model["sizes"][0].split("x")]
        for i in range(args.n):
            if i in got:
                check(png_size(got[i]) == tuple(size), f"image {i} is {size[0]}x{size[1]}")
                check(got[i] == want[i], f"image {i}: page bytes == curl bytes",
                      f"{len(got[i])} bytes", f"{len(want[i])} bytes")
                checked += 1
        check(checked >= 2, "compared at least 2 images", checked)
        check(len(set(got.values())) == len(got), "images of one request differ (noise per index)")
        caption = browser.js("document.querySelector('#grid figure.done figcaption').textContent")
        check(f"seed {seed}" in caption, "caption names the seed", caption)
        if args.screenshot:
            browser.screenshot(args.screenshot)
            print(f"     screenshot: {args.screenshot}")

        # --- an error from the server is shown as the server wrote it
        bad = {"model": model["id"], "class_label": args.class_label, "n": 1, "seed": "not-a-seed"}
        st = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                             "Content-Type: application/json", "-d", json.dumps(bad),
                             base + "/v1/images/generations"], capture_output=True, text=True).stdout
        msg = curl_json(base + "/v1/images/generations", bad)["error"]["message"]
        browser.js("document.getElementById('seed').value = 'not-a-seed'; "
                   "document.getElementById('n').value = '1'; document.getElementById('go').click(); true")
        final = browser.wait("document.getElementById('status').dataset.state === 'error'", timeout=30)
        shown = browser.js("document.getElementById('error').textContent")
        visible = browser.js("!document.getElementById('error').classList.contains('hidden')")
        check(final and visible, "a bad seed puts the page in its error state")
        check(msg in shown and st in shown, "the error shows the server's message and status",
              shown, f"{msg} ({st} ...)")
        check(browser.js("document.querySelectorAll('#grid figure').length") == 0,
              "no stale images after an error")
    except Exception as e:  # a crash is a failure with its reason, not a traceback lost in a log
        check(False, f"test ran to the end ({type(e).__name__}: {e})")
    finally:
        if browser:
            browser.close()
        daemon.terminate()
        try:
            rc = daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, 9)
            rc = daemon.wait()
        check(rc == 0, "ditd serve drained and exited 0", rc, 0)
        if failures:
            print(open(log.name).read()[-3000:])
        os.unlink(log.name)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
