#!/usr/bin/env python3
"""Makes the JSON schemas tests/deploy/test_k8s.py validates custom
resources against (kubernetes-validate knows only built-in kinds and skips
the rest): the openAPIV3Schema of each CRD's served version, made strict as
`kubectl apply --validate=strict` is (unknown fields rejected where the CRD
lists properties and does not preserve unknown fields).

LeaderWorkerSet's leaderTemplate/workerTemplate are v1 PodTemplateSpecs;
they are cut from its schema here (the CRD spells out the whole pod spec,
~1 MB) and test_k8s.py validates them with kubernetes-validate's own
PodTemplate schema instead.

usage: make_schemas.py LWS_REPO KEDA_REPO PROMETHEUS_OPERATOR_REPO
(git checkouts; the commits used are written into the output)."""
import json
import os
import subprocess
import sys

import yaml

OUT = os.path.dirname(os.path.abspath(__file__))
SOURCES = [
    ("leaderworkerset.json", 0, "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml", "v1"),
    ("scaledobject.json", 1, "config/crd/bases/keda.sh_scaledobjects.yaml", "v1alpha1"),
    ("servicemonitor.json", 2, "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml", "v1"),
]


def strict(s):
    if isinstance(s, dict):
        if "properties" in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            s.setdefault("additionalProperties", False)
        for k, v in s.items():
            if k != "x-kubernetes-validations":
                strict(v)
    elif isinstance(s, list):
        for v in s:
            strict(v)
    return s


def git(repo, *args):
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True,
                          text=True).stdout


def main():
    repos = sys.argv[1:4]
    for out, r, path, version in SOURCES:
        crd = yaml.safe_load(git(repos[r], "show", "HEAD:" + path))
        v = [x for x in crd["spec"]["versions"] if x["name"] == version][0]
        schema = v["schema"]["openAPIV3Schema"]
        if crd["spec"]["names"]["kind"] == "LeaderWorkerSet":
            tmpl = schema["properties"]["spec"]["properties"]["leaderWorkerTemplate"]["properties"]
            for k in ("leaderTemplate", "workerTemplate"):
                tmpl[k] = {"type": "object", "description": "v1 PodTemplateSpec: validated by "
                           "test_k8s.py with kubernetes-validate's PodTemplate schema"}
        schema.setdefault("properties", {})["metadata"] = {"type": "object"}
        schema["properties"].setdefault("apiVersion", {"type": "string"})
        schema["properties"].setdefault("kind", {"type": "string"})
        doc = {"$comment": "from %s@%s %s (version %s), made strict by make_schemas.py" % (
                   ["kubernetes-sigs/lws", "kedacore/keda", "prometheus-operator/prometheus-operator"][r],
                   git(repos[r], "rev-parse", "HEAD").strip(), path, version),
               "group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"], "version": version,
               "schema": strict(schema)}
        with open(os.path.join(OUT, out), "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        print(out, os.path.getsize(os.path.join(OUT, out)), "bytes")


if __name__ == "__main__":
    main()
