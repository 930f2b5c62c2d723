#!/usr/bin/env bash
# Installs the Debian 12 packages that ditd's build and tests need, when any
# is missing. Run as root (or with sudo). Idempotent and quiet when all is
# there, so the README's commands and CI can call it every time.
set -euo pipefail

pkgs=(
  build-essential pkg-config meson ninja-build
  libopenblas-openmp-dev libjansson-dev libpng-dev
  libjpeg62-turbo-dev libwebp-dev
  libavcodec-dev libavformat-dev libswscale-dev libavutil-dev ffmpeg
  libutf8proc-dev
  libdnnl-dev
  libmicrohttpd-dev libuv1-dev libprotobuf-c-dev protobuf-c-compiler
  libsqlite3-dev libgnutls28-dev
  libopenmpi-dev openmpi-bin
  clang libclang-rt-14-dev
  curl python3 python3-venv ca-certificates openssl
  chromium
  podman runc mmdebstrap
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
