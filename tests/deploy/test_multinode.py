#!/usr/bin/env python3
"""The multi-node launch of deploy/k8s/overlays/multi-node, on one machine:
the leader's and the workers' container commands run as separate process
trees, the workers "on" 127.0.0.2 and 127.0.0.3 (Linux routes all of
127/8 to lo, and Open MPI sees those as other hosts), and form one MPI
group with no ssh: the workers run `ditd-launch agent`, the leader runs
`ditd-launch run -- mpirun ...` with plm_rsh_agent = `ditd-launch rsh`.

Checked: the ranks land where the hostfile says (rank 0 and 1 in the
leader's tree, rank 2 under the first worker's agent, rank 3 under the
second); one replica spanning the three "pods" (Ulysses 3) gives the same
PNG bytes as a single-process server; SIGTERM to the leader's PID-1
process (what the kubelet sends) reaches rank 0, which drains: the request
in flight is answered 200 and every process exits 0. Also: a client with a
wrong token is refused, and the LeaderWorkerSet hostfile has the layout
the manifest expects.

usage: test_multinode.py --ditd BUILD/ditd --launch BUILD/deploy/ditd-launch"""
import argparse
import base64
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.environ.get("DITD_FIXTURES", os.path.join(ROOT, "tests", "fixtures"))
MODEL = os.path.join(FIXTURES, "models", "tiny-p4-c1-h3")
failures = []


def check(cond, what, got=None, want=None):
    print(("ok   " if cond else "FAIL ") + what + ("" if cond or (got is None and want is None)
                                                  else f": got {got!r}, want {want!r}"))
    if not cond:
        failures.append(what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def children(pid):
    """Every descendant of pid, from /proc."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, pending = [], [pid]
    while pending:
        for k in kids.get(pending.pop(), []):
            out.append(k)
            pending.append(k)
    return out


def ranks_under(pid):
    ranks = set()
    for p in children(pid):
        try:
            env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
            comm = open(f"/proc/{p}/comm").read().strip()
        except OSError:
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK=") and comm == "ditd":
                ranks.add(int(e.split(b"=")[1]))
    return ranks


def post(port, body, timeout=180):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/images/generations", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def wait_listening(log, proc, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log).read())
        if m:
            port = int(m.group(1))
            while time.time() < deadline:
                try:
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    c.request("GET", "/readyz")
                    if c.getresponse().status == 200:
                        return port
                except OSError:
                    pass
                time.sleep(0.1)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError("no ready server:\n" + open(log).read()[-3000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ditd", required=True)
    ap.add_argument("--launch", required=True)
    args = ap.parse_args()
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        return 77
    tmp = tempfile.mkdtemp(prefix="ditd-multinode-")
    token = os.path.join(tmp, "token")
    with open(token, "w") as f:
        f.write(base64.b64encode(os.urandom(32)).decode() + "\n")
    port = free_port()
    # the environment both manifests give the containers (overlays/multi-node)
    env = dict(os.environ, DITD_LAUNCH_TOKEN_FILE=token, DITD_LAUNCH_PORT=str(port),
               DITD_LAUNCH_CONNECT_TIMEOUT="30", OMP_NUM_THREADS="1", TMPDIR=tmp,
               OMPI_MCA_plm_rsh_agent=f"{args.launch} rsh", OMPI_MCA_plm_rsh_no_tree_spawn="1",
               OMPI_MCA_orte_keep_fqdn_hostnames="1", OMPI_MCA_orte_leave_session_attached="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1",
               # one machine only: the "pods" share a hostname, which would
               # let Open MPI pick shared memory between them; in a cluster
               # each pod has its own name and its own interface
               OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo",
               OMPI_MCA_oob_tcp_if_include="lo", OMPI_MCA_rtc_hwloc_vmhole="none")
    procs = []

    def spawn(cmd, log, tmpdir=tmp):
        # each "pod" has its own /tmp (Open MPI's session directories)
        os.makedirs(tmpdir, exist_ok=True)
        p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             env=dict(env, TMPDIR=tmpdir), start_new_session=True)
        procs.append(p)
        return p

    try:
        # the LWS hostfile: leader first with rank 0's slot, workers after
        lws = dict(env, LWS_LEADER_ADDRESS="ditd-0.ditd.ml", LWS_GROUP_SIZE="3")
        out = subprocess.run([args.launch, "hostfile", "--slots", "2"], env=lws, capture_output=True,
                             text=True).stdout
        check(out == "ditd-0.ditd.ml slots=3\nditd-0-1.ditd.ml slots=2\nditd-0-2.ditd.ml slots=2\n",
              "LWS hostfile: leader S+1 slots, workers <group>-<i> with S", out)

        agents = [spawn([args.launch, "agent", "--listen", h], os.path.join(tmp, f"agent-{h}.log"),
                        os.path.join(tmp, f"pod-{h}"))
                  for h in ("127.0.0.2", "127.0.0.3")]
        time.sleep(0.3)
        bad = os.path.join(tmp, "bad-token")
        with open(bad, "w") as f:
            f.write("x" * 32 + "\n")
        r = subprocess.run([args.launch, "rsh", "127.0.0.2", "true"], capture_output=True, text=True,
                           env=dict(env, DITD_LAUNCH_TOKEN_FILE=bad))
        check(r.returncode == 126, "a wrong token is refused", r.returncode, 126)
        r = subprocess.run([args.launch, "rsh", "127.0.0.2", "echo", "hello;", "exit", "3"],
                           capture_output=True, text=True, env=env)
        check((r.stdout, r.returncode) == ("hello\n", 3), "rsh relays output and exit status",
              (r.stdout, r.returncode))

        hostfile = os.path.join(tmp, "hosts")
        with open(hostfile, "w") as f:
            f.write("127.0.0.1 slots=2\n127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
        leader_log = os.path.join(tmp, "leader.log")
        leader = spawn([args.launch, "run", "--", "mpirun", "--hostfile", hostfile, "-np", "4",
                        "--bind-to", "none", args.ditd, "serve", "--model", MODEL, "--host", "127.0.0.1",
                        "--port", "0", "--threads", "1", "--ulysses-degree", "3",
                        "--drain-timeout", "60"], leader_log, os.path.join(tmp, "pod-leader"))
        hport = wait_listening(leader_log, leader)
        print(f"     group up on port {hport}")
        check(ranks_under(leader.pid) == {0, 1}, "ranks 0, 1 in the leader's tree", ranks_under(leader.pid))
        check(ranks_under(agents[0].pid) == {2}, "rank 2 under worker 127.0.0.2's agent",
              ranks_under(agents[0].pid))
        check(ranks_under(agents[1].pid) == {3}, "rank 3 under worker 127.0.0.3's agent",
              ranks_under(agents[1].pid))

        body = {"class_label": 2, "n": 2, "seed": 77, "num_inference_steps": 250, "sampler": "ddim"}
        res = {}
        def client():
            res.update(zip(("st", "data"), post(hport, body)))
            res["t_done"] = time.time()
        t = threading.Thread(target=client)
        t.start()
        time.sleep(1.0)  # the request is in flight on the group
        t_sig = time.time()
        leader.send_signal(signal.SIGTERM)  # the kubelet's SIGTERM to the leader's PID 1
        t.join(180)
        check(res.get("t_done", 0) > t_sig, "the request was still running at SIGTERM",
              round(res.get("t_done", 0) - t_sig, 2), "> 0")
        check(res.get("st") == 200, "the request in flight when the pod stopped is answered 200",
              res.get("st"))
        rc = leader.wait(timeout=120)
        log = open(leader_log).read()
        check(rc == 0, "the leader drained and exited 0", rc, 0)
        sent = re.search(r"SIGTERM -> MPI rank 0 \(pid (\d+)\)", log)
        front = re.search(r"listening on .* pid (\d+)\)", log)
        check(sent and front and sent.group(1) == front.group(1),
              "SIGTERM went to this job's rank 0 (the front-end's pid), not mpirun",
              sent and sent.group(1), front and front.group(1))
        check("draining" in log, "rank 0 drained")
        time.sleep(0.5)
        check(all(p.poll() is None for p in agents), "the agents outlived the job (they wait for it)")
        for p in agents:
            p.send_signal(signal.SIGTERM)
        check([p.wait(timeout=30) for p in agents] == [0, 0], "workers exit 0 on SIGTERM once idle")

        # the same request on one process: the same bytes
        solo_log = os.path.join(tmp, "solo.log")
        solo = spawn([args.ditd, "serve", "--model", MODEL, "--host", "127.0.0.1", "--port", "0",
                      "--threads", "1"], solo_log)
        sport = wait_listening(solo_log, solo)
        st, data = post(sport, body)
        solo.send_signal(signal.SIGTERM)
        solo.wait(timeout=60)
        if res.get("st") == 200 and st == 200:
            a = [d["b64_json"] for d in json.loads(res["data"])["data"]]
            b = [d["b64_json"] for d in json.loads(data)["data"]]
            check(len(a) == 2 and a == b, "3-pod Ulysses group == single process, byte for byte")
    except Exception as e:
        check(False, f"test ran to the end ({type(e).__name__}: {e})")
    finally:
        if failures:
            for f in sorted(os.listdir(tmp)):
                if f.endswith(".log"):
                    print(f"--- {f}\n" + open(os.path.join(tmp, f)).read()[-3000:])
                    if f == "leader.log":
                        for p in procs:  # each started in its own session
                            print(subprocess.run(["ps", "--forest", "-o", "pid,stat,args", "-s",
                                                  str(p.pid)], capture_output=True, text=True).stdout[-1500:])
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
