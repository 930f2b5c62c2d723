#!/usr/bin/env bash
# Runs one http test case with the cached virtualenv (made on first use).
# usage: run.sh VENV_DIR DITD_BINARY CASE [SCRIPT (default test_http.py)]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=$("$here/venv.sh" "$1") || exit 77
exec "$py" "$here/${4:-test_http.py}" --ditd "$2" "$3"
