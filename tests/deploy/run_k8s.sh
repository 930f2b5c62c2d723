#!/usr/bin/env bash
# Runs test_k8s.py with the cached virtualenv (made on first use).
# usage: run_k8s.sh VENV_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=$("$here/venv.sh" "$1") || exit 77
exec "$py" "$here/test_k8s.py"
