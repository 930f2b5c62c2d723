#!/usr/bin/env python3
"""The Kubernetes manifests: every kustomization under deploy/k8s rendered
with `kubectl kustomize`, every resource validated offline, then the
properties a pod stop, a rollout and the MPI launch depend on checked on
the rendered objects.

Validation: built-in kinds with kubernetes-validate, strict (unknown fields
are errors), against each Kubernetes minor 1.30 to 1.37. Custom resources
(LeaderWorkerSet, ScaledObject, ServiceMonitor), which kubernetes-validate
skips with a warning, against their CRDs' own schemas, made strict
(tests/deploy/crd/, by make_schemas.py); LeaderWorkerSet's pod templates
as v1 PodTemplates with kubernetes-validate. A kind with no schema fails.

exit 0 pass, 1 fail, 77 skip (no kubectl)."""
import json
import os
import re
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
K8S = os.path.join(ROOT, "deploy", "k8s")
TARGETS = ["base", "overlays/cpu", "overlays/gpu", "overlays/multi-node", "overlays/cpu-jobs"]
VERSIONS = [f"1.{m}.0" for m in range(30, 38)]
GIB = 1 << 30
XL_WEIGHTS_GIB = 3  # DiT-XL/2 resident per rank that holds it
failures = []


def check(cond, what, got=None, want=None):
    print(("ok   " if cond else "FAIL ") + what + ("" if cond or (got is None and want is None)
                                                  else f": got {got!r}, want {want!r}"))
    if not cond:
        failures.append(what)


def crd_schemas():
    out = {}
    for f in os.listdir(os.path.join(HERE, "crd")):
        if f.endswith(".json"):
            d = json.load(open(os.path.join(HERE, "crd", f)))
            out[(d["group"] + "/" + d["version"], d["kind"])] = d["schema"]
    return out


def quantity(q):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|m)?", str(q))
    mult = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": GIB, "Ti": 1 << 40, "k": 1e3, "M": 1e6,
            "G": 1e9, "m": 1e-3}
    return float(m.group(1)) * mult[m.group(2)]


def validate(doc, where, crds):
    key = (doc["apiVersion"], doc["kind"])
    name = f"{where}: {doc['kind'].lower()}/{doc['metadata']['name']}"
    if key in crds:
        errs = sorted(jsonschema.Draft7Validator(crds[key]).iter_errors(doc), key=str)
        check(not errs, f"{name} valid against its CRD schema (strict)",
              [f"{'.'.join(map(str, e.path))}: {e.message}" for e in errs[:3]])
        if doc["kind"] == "LeaderWorkerSet":
            t = doc["spec"]["leaderWorkerTemplate"]
            for role in ("leaderTemplate", "workerTemplate"):
                validate({"apiVersion": "v1", "kind": "PodTemplate",
                          "metadata": {"name": f"{doc['metadata']['name']}-{role}"},
                          "template": t[role]}, where, crds)
        return 1
    bad = []
    for v in VERSIONS:
        try:
            kubernetes_validate.validate(doc, v, strict=True)
        except ValidationError as e:
            bad.append(f"{v}: {'.'.join(map(str, e.path))}: {e.message}")
        except SchemaNotFoundError:
            bad.append(f"{v}: no schema for {doc['apiVersion']} {doc['kind']}")
    check(not bad, f"{name} valid against Kubernetes {VERSIONS[0][:-2]}-{VERSIONS[-1][:-2]} (strict)",
          bad[:3])
    return 1


def pod_templates(docs):
    """(name, pod template, role) for each workload: Deployment, LWS roles."""
    for d in docs:
        if d["kind"] == "Deployment":
            yield f"deployment/{d['metadata']['name']}", d["spec"]["template"], "server", d
        if d["kind"] == "LeaderWorkerSet":
            t = d["spec"]["leaderWorkerTemplate"]
            yield f"lws/{d['metadata']['name']}/leader", t["leaderTemplate"], "server", d
            yield f"lws/{d['metadata']['name']}/worker", t["workerTemplate"], "worker", d


def flag(argv, name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


def check_pod(where, name, tmpl, role, owner):
    spec = tmpl["spec"]
    psc = spec.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) > 0,
          f"{where} {name}: runs as non-root")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    for c in spec["containers"]:
        sc = c.get("securityContext", {})
        check(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False
              and "ALL" in sc.get("capabilities", {}).get("drop", []),
              f"{where} {name}: read-only root, no privilege escalation, capabilities dropped")
        argv = c.get("command", []) + c.get("args", [])
        check(argv[:2] == ["/usr/local/bin/ditd-launch", "run" if role == "server" else "agent"],
              f"{where} {name}: PID 1 is ditd-launch ({'run' if role == 'server' else 'agent'})", argv[:2])
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        res = c.get("resources", {})
        gpus = int(res.get("limits", {}).get("nvidia.com/gpu", 0))
        check(gpus == int(res.get("requests", {}).get("nvidia.com/gpu", gpus)),
              f"{where} {name}: GPU request == limit")
        mem = quantity(res.get("limits", {}).get("memory", "0"))
        check(mem > 0 and quantity(res.get("requests", {}).get("memory", "0")) > 0,
              f"{where} {name}: memory request and limit set")
        model = flag(argv, "--model", env.get("DITD_MODEL", ""))
        if role == "server":
            for p in ("startupProbe", "readinessProbe", "livenessProbe"):
                check(p in c, f"{where} {name}: {p}")
            check(c.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz",
                  f"{where} {name}: readiness is /readyz")
            check(c.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz",
                  f"{where} {name}: liveness is /healthz")
            stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
            check(stop >= 5, f"{where} {name}: preStop waits for the endpoint to leave the Service", stop)
            drain = int(flag(argv, "--drain-timeout", env.get("DITD_DRAIN_TIMEOUT", "30")))
            check(grace > stop + drain, f"{where} {name}: terminationGracePeriodSeconds > preStop + "
                  "drain timeout", grace, f"> {stop} + {drain}")
            if "mpirun" in argv:
                np_ = int(flag(argv, "-np"))
                g = 1
                for f in ("--ulysses-degree", "--ring-degree", "--tp-degree", "--cfg-degree"):
                    g *= int(flag(argv, f, "1"))
                dp = int(flag(argv, "--dp", "1"))
                check(np_ == 1 + dp * g, f"{where} {name}: -np == 1 + dp x group", np_, 1 + dp * g)
                check(flag(argv, "--device") == "cuda" and gpus > 0, f"{where} {name}: --device cuda with GPUs")
                if owner["kind"] == "LeaderWorkerSet":
                    size = owner["spec"]["leaderWorkerTemplate"]["size"]
                    slots = int(flag(argv, "--lws-slots"))
                    check(slots == gpus and np_ == 1 + slots * size,
                          f"{where} {name}: -np == 1 + GPUs per pod x group size", np_, 1 + slots * size)
                    check(env.get("OMPI_MCA_plm_rsh_agent") == "/usr/local/bin/ditd-launch rsh",
                          f"{where} {name}: mpirun launches through ditd-launch rsh, no ssh")
                else:
                    check(np_ - 1 == gpus, f"{where} {name}: one GPU per serving rank", gpus, np_ - 1)
                ranks_here = gpus
            else:
                ranks_here = 1
        else:
            ranks_here = gpus
            check(c.get("livenessProbe") is not None, f"{where} {name}: liveness on the agent")
            check("DITD_LAUNCH_TOKEN_FILE" in env, f"{where} {name}: the agent has the token")
        if "XL" in model:
            need = ranks_here * XL_WEIGHTS_GIB * GIB + (GIB // 2 if role == "server" else 0)
            check(mem >= need, f"{where} {name}: memory fits DiT-XL/2 on {ranks_here} rank(s)",
                  f"{mem / GIB:.1f} GiB", f">= {need / GIB:.1f} GiB")
        for m in c.get("volumeMounts", []):
            if m["mountPath"] == "/models":
                check(m.get("readOnly") is True, f"{where} {name}: models mounted read-only")
        check(any(m["mountPath"] == "/tmp" for m in c.get("volumeMounts", [])),
              f"{where} {name}: /tmp is a volume (read-only root; Open MPI's session dir)")


def selects(sel, labels):
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())


stores = []  # pods with a job store on a claim, over every rendering


def check_wiring(where, docs):
    pods = list(pod_templates(docs))
    byname = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    for d in docs:
        if d["kind"] == "Service":
            sel = d["spec"]["selector"]
            hit = [n for n, t, r, _ in pods if selects(sel, t["metadata"]["labels"])]
            check(hit and all(r == "server" for n, t, r, _ in pods if n in hit),
                  f"{where}: Service selects the serving pods only", hit)
        if d["kind"] == "PodDisruptionBudget":
            sel = d["spec"]["selector"]["matchLabels"]
            hit = [n for n, t, r, _ in pods if selects(sel, t["metadata"]["labels"])]
            check(len(hit) == len(pods), f"{where}: PodDisruptionBudget covers every pod", hit)
        if d["kind"] == "ScaledObject":
            ref = d["spec"]["scaleTargetRef"]
            check((ref["kind"], ref["name"]) in byname, f"{where}: ScaledObject targets a rendered workload",
                  ref)
            metrics_c = open(os.path.join(ROOT, "server", "daemon", "metrics.c")).read()
            for t in d["spec"]["triggers"]:
                names = re.findall(r"(ditd_[a-z_]+)\{", t["metadata"]["query"])
                check(names and all(f'"{n}{{' in metrics_c or f"{n}{{" in metrics_c or
                                    f"# TYPE {n} " in metrics_c for n in names),
                      f"{where}: the scaling query uses series /metrics has", names)
        if d["kind"] == "ServiceMonitor":
            svc = [s for s in docs if s["kind"] == "Service"
                   and selects(d["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
            ports = {p["name"] for s in svc for p in s["spec"]["ports"]}
            check(svc and all(e["port"] in ports for e in d["spec"]["endpoints"]),
                  f"{where}: ServiceMonitor finds the Service and its port", ports)
    for n, t, r, owner in pods:
        check_pod(where, n, t, r, owner)
    # a job store (--data-dir) on a claim: one writer per store (one pod, replaced with
    # Recreate, not autoscaled), the folder a mounted volume
    for n, t, r, owner in pods:
        for c in t["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            argv = c.get("command", []) + c.get("args", [])
            data = flag(argv, "--data-dir", env.get("DITD_DATA_DIR", ""))
            if not data:
                continue
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            vols = {v["name"]: v for v in t["spec"].get("volumes", [])}
            claim = vols.get(mounts.get(data), {}).get("persistentVolumeClaim", {}).get("claimName")
            check(claim and ("PersistentVolumeClaim", claim) in byname,
                  f"{where} {n}: --data-dir {data} is a rendered PersistentVolumeClaim", claim)
            spec = owner.get("spec", {})
            scaled = [d for d in docs if d["kind"] == "ScaledObject"
                      and d["spec"]["scaleTargetRef"]["name"] == owner["metadata"]["name"]]
            check(owner["kind"] == "Deployment" and spec.get("replicas") == 1 and
                  spec.get("strategy", {}).get("type") == "Recreate" and not scaled,
                  f"{where} {n}: one writer per job store (1 replica, Recreate, no autoscaler)",
                  (spec.get("replicas"), spec.get("strategy"), len(scaled)))
            stores.append(n)


def main():
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("skip: no kubectl (kustomize is built into kubectl >= 1.14; Debian: kubernetes-client)")
        return 77
    print("     " + subprocess.run([kubectl, "version", "--client"], capture_output=True,
                                   text=True).stdout.replace("\n", "; "))
    crds = crd_schemas()
    check(len(crds) == 3, "CRD schemas for LeaderWorkerSet, ScaledObject, ServiceMonitor", sorted(crds))
    total = 0
    kinds = set()
    for target in TARGETS:
        r = subprocess.run([kubectl, "kustomize", os.path.join(K8S, target)], capture_output=True, text=True)
        check(r.returncode == 0, f"{target}: kubectl kustomize renders", r.stderr[-500:])
        if r.returncode:
            continue
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        for d in docs:
            total += validate(d, target, crds)
            kinds.add(d["kind"])
        check_wiring(target, docs)
    check(total >= 22, "validated at least 22 rendered resources", total)
    check(len(stores) >= 1, "a rendering keeps its job store on a claim (overlays/cpu-jobs)", stores)
    check({"Deployment", "LeaderWorkerSet", "ScaledObject", "ServiceMonitor", "PodDisruptionBudget",
           "Service", "NetworkPolicy", "PersistentVolumeClaim"} <= kinds, "every kind was rendered",
          sorted(kinds))
    print(f"     {total} resources in {len(TARGETS)} renderings; {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
