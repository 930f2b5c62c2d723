#!/usr/bin/env bash
# Makes (once) the virtualenv the http tests use: the official `openai`
# client, `jsonschema` and `schemathesis` (the abuse suite's schema case),
# from PyPI. Idempotent and quiet: a ready venv is
# left alone (a stamp file records that the install finished).
# usage: venv.sh DIR   -> prints DIR/bin/python, or exits 77 when it cannot
set -uo pipefail
dir=$1
stamp="$dir/.ditd-http-ready-2"
if [ -f "$stamp" ] && "$dir/bin/python" -c 'import openai, jsonschema, schemathesis' 2>/dev/null; then
  echo "$dir/bin/python"
  exit 0
fi
lock="$dir.lock"
mkdir -p "$(dirname "$dir")"
exec 9>"$lock"
flock 9
if [ ! -f "$stamp" ]; then
  rm -rf "$dir"
  if ! python3 -m venv "$dir" >/dev/null 2>&1; then
    echo "venv.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2
    exit 77
  fi
  if ! "$dir/bin/pip" install -q --disable-pip-version-check 'openai>=1.40' 'jsonschema>=4' \
      'schemathesis>=4.3,<5' >"$dir.log" 2>&1; then
    echo "venv.sh: pip install openai jsonschema schemathesis failed (no PyPI?); see $dir.log" >&2
    exit 77
  fi
  touch "$stamp"
fi
echo "$dir/bin/python"
