#!/usr/bin/env bash
# The CPU container image (deploy/Dockerfile) built with podman and run as
# a user would: /healthz, `podman healthcheck run` on a non-default port
# (the HEALTHCHECK follows DITD_PORT), one generation, build_info naming the
# commit, uid 10001 with a read-only root and no capabilities, and `podman
# stop` during a generation: the request is answered 200 and the container
# exits 0.
#
# No registry is reachable in CI: the Debian base is made locally
# (mmdebstrap bookworm, minbase) and imported as docker.io/library/debian:12,
# the name the Dockerfile's pinned DEBIAN argument names, passed without the
# digest (a local import has its own). The tarball and the image are cached
# ($DITD_IMAGE_CACHE, default /var/cache/ditd-ci; podman's store keeps the
# build layers), so a second run rebuilds only what the source changed.
# When podman cannot run containers here, this says why and exits 77.
# usage: test_image.sh [SOURCE_ROOT]
set -uo pipefail
root=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
cache=${DITD_IMAGE_CACHE:-/var/cache/ditd-ci}
base=docker.io/library/debian:12
image=localhost/ditd:test
name=ditd-smoke-$$
skip() { echo "skip: $*"; exit 77; }
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

command -v podman >/dev/null || skip "no podman (Debian: apt-get install podman)"
command -v curl >/dev/null || skip "no curl"

mkdir -p "$cache" || skip "cannot create $cache"
info=$(podman info --format '{{.Version.Version}} storage {{.Store.GraphDriverName}}, cgroups {{.Host.CgroupsVersion}} ({{.Host.CgroupManager}}), network {{.Host.NetworkBackend}}, rootless {{.Host.Security.Rootless}}' 2>&1) \
  || skip "podman info failed: $info"
echo "     podman $info"
# --- the base image
if ! podman image exists "$base"; then
  tar="$cache/debian-bookworm-minbase.tar"
  if [ ! -s "$tar" ]; then
    command -v mmdebstrap >/dev/null || skip "no $base image and no mmdebstrap to make one (apt-get install mmdebstrap)"
    mkdir -p "$cache" || skip "cannot create $cache"
    t0=$(date +%s)
    if ! mmdebstrap --quiet --variant=minbase --mode=root --format=tar bookworm "$tar.tmp" >"$cache/mmdebstrap.log" 2>&1; then
      rm -rf "$tar.tmp"
      skip "mmdebstrap could not make the Debian base (no Debian mirror?): $(tail -2 "$cache/mmdebstrap.log" | tr '\n' ' ')"
    fi
    mv "$tar.tmp" "$tar"
    echo "     mmdebstrap: $(( $(date +%s) - t0 )) s, $(du -h "$tar" | cut -f1)"
  fi
  podman import -q --change 'LABEL org.opencontainers.image.description=mmdebstrap-bookworm-minbase' \
    "$tar" "$base" >/dev/null || skip "podman import failed"
fi

# --- which podman options can run a container on this machine
# (no systemd here: the healthcheck has no timer, `podman healthcheck run`
# runs it; the sandbox's rootful podman: crun refuses hybrid cgroups, raising rlimits
# is not permitted, CNI networking may be missing; runc, lower limits and the
# host network are what work there)
probe_log=$(mktemp)
opts=""
for o in "" "--network host" "--runtime runc --network host" \
         "--runtime runc --network host --ulimit nofile=8192:8192 --ulimit nproc=4096:4096"; do
  # shellcheck disable=SC2086
  if podman run --rm $o "$base" /bin/true >"$probe_log" 2>&1; then
    opts=${o:-" "}
    break
  fi
  echo "     podman run ${o:-(defaults)}: $(tail -1 "$probe_log")"
done
rm -f "$probe_log"
[ -n "$opts" ] || skip "podman cannot run a container here (see the attempts above)"
echo "     podman run options that work here: ${opts# }"
runtime_opts=$(echo "$opts" | grep -o -- '--runtime [a-z]*' || true)
ulimit_opts=$(echo "$opts" | grep -o -- '--ulimit [^ ]*' | tr '\n' ' ' || true)

# --- build
commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
t0=$(date +%s)
# shellcheck disable=SC2086
if ! podman build $runtime_opts $ulimit_opts --network host --pull=never --format docker \
     --build-arg DEBIAN="$base" --build-arg DITD_COMMIT="$commit" \
     -f "$root/deploy/Dockerfile" -t "$image" "$root" >"$cache/build.log" 2>&1; then
  tail -30 "$cache/build.log"
  bad "podman build"
  echo "$fails failure(s)"
  exit 1
fi
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "     build: $(( $(date +%s) - t0 )) s; image $((size / 1000000)) MB; base $(( $(podman image inspect --format '{{.Size}}' "$base") / 1000000 )) MB"
ok "podman build -f deploy/Dockerfile"
# keep the newest build stage tagged (its apt layer is the next run's
# cache) and drop the stages of earlier runs, ~1 GB each
# shellcheck disable=SC2086
podman build $runtime_opts $ulimit_opts --network host --pull=never --format docker --target build \
  --build-arg DEBIAN="$base" --build-arg DITD_COMMIT="$commit" -q \
  -f "$root/deploy/Dockerfile" -t localhost/ditd-build:cache "$root" >/dev/null 2>&1
podman image prune -f >/dev/null 2>&1

# --- run: read-only root (no tmpfs either), no capabilities, a port of our own
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cleanup() { podman rm -f -t 0 "$name" >/dev/null 2>&1; }
trap cleanup EXIT
# shellcheck disable=SC2086
podman run -d --name "$name" ${opts# } --read-only --read-only-tmpfs=false --cap-drop=all \
  --security-opt=no-new-privileges --health-interval=disable \
  -e DITD_HOST=127.0.0.1 -e DITD_PORT="$port" "$image" --threads 2 --drain-timeout 300 >/dev/null || { bad "podman run"; exit 1; }
url=http://127.0.0.1:$port
for _ in $(seq 1 300); do
  curl -fsS "$url/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
if curl -fsS "$url/healthz" >/dev/null; then ok "/healthz answers 200 on DITD_PORT=$port"; else
  bad "/healthz"; podman logs "$name" | tail -20; exit 1; fi
if podman healthcheck run "$name" >/dev/null 2>&1; then ok "podman healthcheck run (follows DITD_PORT)"; else
  bad "podman healthcheck run: $(podman healthcheck run "$name" 2>&1 | tail -1)"; fi
pid=$(podman inspect --format '{{.State.Pid}}' "$name")
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
capeff=$(awk '/^CapEff:/ {print $2}' "/proc/$pid/status")
[ "$uid" = 10001 ] && ok "runs as uid 10001" || bad "runs as uid $uid, want 10001"
[ "$capeff" = 0000000000000000 ] && ok "no capabilities" || bad "capabilities $capeff"
comm=$(cat "/proc/$pid/comm")
[ "$comm" = ditd-launch ] && ok "PID 1 is ditd-launch" || bad "PID 1 is $comm"
if podman exec "$name" /usr/local/bin/ditd-launch probe /nonexistent-route >/dev/null 2>&1; then
  bad "probe of a 404 route should fail"; else ok "probe fails on a non-2xx answer"; fi

out=$(curl -sS -H 'Content-Type: application/json' \
  -d '{"prompt": "sneaker", "n": 2, "seed": 7, "num_inference_steps": 6}' "$url/v1/images/generations")
if echo "$out" | python3 -c '
import base64, json, struct, sys
d = json.load(sys.stdin)
assert d["seed"] == 7 and len(d["data"]) == 2, d
for im in d["data"]:
    png = base64.b64decode(im["b64_json"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (28, 28)
'; then ok "one generation: 2 PNGs of 28x28"; else bad "generation: ${out:0:300}"; fi
info=$(curl -sS "$url/metrics" | grep '^ditd_build_info')
case "$info" in *"commit=\"$commit\""*'backend="cpu"'*) ok "build_info names commit $commit";;
  *) bad "build_info: $info";; esac

# --- podman stop while a generation runs: answered, then exit 0
resp=$(mktemp)
curl -sS -o "$resp" -w '%{http_code}' -H 'Content-Type: application/json' \
  -d '{"prompt": "bag", "n": 2, "seed": 9, "num_inference_steps": 60}' "$url/v1/images/generations" >"$resp.code" &
cpid=$!
# stop once its batch runs (a busy machine may take a while to start it)
for _ in $(seq 1 600); do
  curl -sS "$url/metrics" | grep -q '^ditd_running_batches{.*} [1-9]' && break
  sleep 0.05
done
t0=$(date +%s)
podman stop -t 330 "$name" >/dev/null
wait $cpid
code=$(cat "$resp.code")
rc=$(podman inspect --format '{{.State.ExitCode}}' "$name")
[ "$code" = 200 ] && ok "the generation in flight at podman stop answered 200" || bad "in-flight request: HTTP $code"
[ "$rc" = 0 ] && ok "podman stop: drained and exited 0 in $(( $(date +%s) - t0 )) s" || bad "exit code $rc"
log=$(podman logs "$name" 2>&1)
case "$log" in *"SIGTERM -> /usr/local/bin/ditd"*"draining"*) ok "ditd-launch passed SIGTERM on, ditd drained";;
  *) bad "no drain in the log: $(echo "$log" | tail -5)";; esac
rm -f "$resp" "$resp.code"
echo "$fails failure(s)"
[ $fails -eq 0 ]
