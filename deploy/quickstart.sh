#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and serves
# the embedded default model on 127.0.0.1:8080. Extra arguments replace the
# default ones and go to ditd (e.g. `generate --class 3 -o out.png`).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
[ -f build/build.ninja ] || meson setup build --buildtype=release >/dev/null
ninja -C build >/dev/null
export DITD_MODEL=${DITD_MODEL:-models/fashion-dit}
if [ $# -eq 0 ]; then
  set -- serve
fi
exec build/ditd "$@"
