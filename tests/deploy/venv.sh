#!/usr/bin/env bash
# Makes (once) the virtualenv the manifest test uses: kubernetes-validate
# (it brings PyYAML and jsonschema) from PyPI. Idempotent and quiet; a
# ready venv is left alone (a stamp file records that the install finished).
# usage: venv.sh DIR   -> prints DIR/bin/python, or exits 77 when it cannot
set -uo pipefail
dir=$1
stamp="$dir/.ditd-deploy-ready"
if [ -f "$stamp" ] && "$dir/bin/python" -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
  echo "$dir/bin/python"
  exit 0
fi
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ ! -f "$stamp" ]; then
  rm -rf "$dir"
  if ! python3 -m venv "$dir" >/dev/null 2>&1; then
    echo "venv.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2
    exit 77
  fi
  if ! "$dir/bin/pip" install -q --disable-pip-version-check 'kubernetes-validate==1.37.0' >"$dir.log" 2>&1; then
    echo "venv.sh: pip install kubernetes-validate failed (no PyPI?); see $dir.log" >&2
    exit 77
  fi
  touch "$stamp"
fi
echo "$dir/bin/python"
