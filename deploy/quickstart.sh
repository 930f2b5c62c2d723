#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs
# ditd on the embedded default model. Extra arguments go to ditd.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
[ -f build/build.ninja ] || meson setup build --buildtype=release >/dev/null
ninja -C build >/dev/null
model=models/fashion-dit
if [ ! -d "$model" ]; then
  # Until the embedded model is trained and committed, a small random-weight
  # fixture model shows the path end to end (its pictures are noise).
  model=tests/fixtures/models/tiny-p4-c1-h3
fi
if [ $# -eq 0 ]; then
  set -- generate --model "$model" --class 3 --seed 42 -o ditd-out.png
fi
exec build/ditd "$@"
