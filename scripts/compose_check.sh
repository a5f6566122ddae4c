#!/usr/bin/env bash
# The compose deployment end to end with a real Docker engine (slow; not in CI): builds the fp8rl
# image (and, when prom/prometheus cannot be pulled, a Prometheus image from Debian's package),
# starts deploy/docker-compose.yml without Grafana, submits the smoke job through the published
# REST port and waits for SUCCEEDED, checks through Prometheus's HTTP API that every fp8rl target
# is up, scales the generation workers to 3 (all three scraped and registered) and back to 2,
# and tears everything down (containers, network and volumes). Prints the time of each phase and
# the image sizes. Exit status 0 only when every check passed.
#
#   bash scripts/compose_check.sh            # needs dockerd running and docker-compose (1.29 or v2)
#   KEEP=1 bash scripts/compose_check.sh     # leave the cluster running (tear down by hand)
#
# Where no image registry answers, the base images debian:12 and debian:12-slim are made with
# debootstrap + docker import from the host's Debian mirror, and Prometheus is built from Debian's
# package (deploy/docker/Dockerfile.prometheus). Builds use the host network for apt. Before any
# container starts, DOCKER-USER drops forwarded traffic to and from the uplink (as root with
# iptables), so the containers reach only each other and this host.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
COMPOSE_FILE=deploy/docker-compose.yml
PROJECT=${COMPOSE_PROJECT_NAME:-fp8rl-check}
NICE="nice -n 10"

# Debian's docker.io client has BuildKit built in; a newer client without the buildx plugin
# does not, so prefer /usr/bin/docker when it exists.
DOCKER=${DOCKER:-$(command -v /usr/bin/docker || command -v docker || true)}
[ -n "$DOCKER" ] || { echo "compose_check: docker not found" >&2; exit 2; }
if "$DOCKER" compose version >/dev/null 2>&1; then COMPOSE=("$DOCKER" compose)
elif command -v docker-compose >/dev/null; then COMPOSE=(docker-compose)
else echo "compose_check: neither 'docker compose' nor docker-compose found" >&2; exit 2; fi
"$DOCKER" info >/dev/null 2>&1 || { echo "compose_check: dockerd is not running" >&2; exit 2; }

T0=$(date +%s)
declare -a TIMES=()
phase_start=$T0
phase() {  # records the seconds since the last phase under a name
  local now; now=$(date +%s)
  TIMES+=("$1: $((now - phase_start)) s")
  echo "== $1 done in $((now - phase_start)) s"
  phase_start=$now
}
fail() { echo "compose_check: FAIL: $*" >&2; dump_logs; exit 1; }

# Free host ports for everything compose publishes.
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
export COMPOSE_PROJECT_NAME=$PROJECT
export FP8RL_HTTP_PORT=${FP8RL_HTTP_PORT:-$(free_port)}
export FP8RL_GRPC_PORT=${FP8RL_GRPC_PORT:-$(free_port)}
export FP8RL_PROMETHEUS_PORT=${FP8RL_PROMETHEUS_PORT:-$(free_port)}
REST=http://127.0.0.1:$FP8RL_HTTP_PORT
PROM=http://127.0.0.1:$FP8RL_PROMETHEUS_PORT
compose() { "${COMPOSE[@]}" -f "$COMPOSE_FILE" "$@"; }
SERVICES=(weight-sync coordinator trainer generation-worker prometheus)

dump_logs() {
  echo "--- compose ps ---" >&2
  compose ps >&2 || true
  echo "--- last log lines ---" >&2
  compose logs --tail 20 "${SERVICES[@]}" >&2 || true
}
teardown() {
  if [ -n "${KEEP:-}" ]; then
    echo "KEEP set: the cluster stays up (${COMPOSE[*]} -p $PROJECT -f $COMPOSE_FILE down -v)"
    return
  fi
  compose down -v --remove-orphans >/dev/null 2>&1 || true
}
trap teardown EXIT

# ---- firewall and base images ------------------------------------------------------------------
UPLINK=$(ip route show default 2>/dev/null | awk '{print $5; exit}')
if [ -n "$UPLINK" ] && command -v iptables >/dev/null && [ "$(id -u)" = 0 ]; then
  for dir in -o -i; do
    iptables -C DOCKER-USER "$dir" "$UPLINK" -j DROP 2>/dev/null ||
      iptables -I DOCKER-USER "$dir" "$UPLINK" -j DROP || fail "iptables DOCKER-USER rule"
  done
  echo "== containers cannot reach beyond this host (DOCKER-USER drops $UPLINK)"
else
  echo "== WARNING: no DOCKER-USER rule added (needs root, iptables and a default route)" >&2
fi

# debian:12 (builder) and debian:12-slim (runtime): pulled, or made with debootstrap.
base_image() {  # base_image TAG SLIM
  "$DOCKER" image inspect "$1" >/dev/null 2>&1 && return 0
  timeout 60 "$DOCKER" pull "$1" >/dev/null 2>&1 && return 0
  command -v debootstrap >/dev/null || fail "$1 cannot be pulled and debootstrap is missing"
  local rootfs mirror
  rootfs=$(mktemp -d /tmp/compose_check_rootfs.XXXXXX)
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
  echo "== $1 cannot be pulled: debootstrap bookworm from ${mirror:-http://deb.debian.org/debian}"
  $NICE debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" \
    "${mirror:-http://deb.debian.org/debian}" >/dev/null || fail "debootstrap"
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    rm -f "$rootfs/etc/apt/sources.list"
    cp /etc/apt/sources.list.d/debian.sources "$rootfs/etc/apt/sources.list.d/"
  fi
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  if [ "$2" = slim ]; then  # like debian:*-slim: no docs, man pages or locales, now or later
    rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
    find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
      'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
      'path-exclude /usr/share/locale/*' > "$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim"
  fi
  tar -C "$rootfs" -c . | "$DOCKER" import -c 'CMD ["bash"]' - "$1" >/dev/null || fail "import $1"
  rm -rf "$rootfs"
}
base_image debian:12 full
base_image debian:12-slim slim
phase "base images"

# ---- images -------------------------------------------------------------------------------------
echo "== building fp8rl:cpu (BuildKit, ccache in a cache mount)"
DOCKER_BUILDKIT=1 $NICE "$DOCKER" build --network host --progress plain \
  --build-arg FP8RL_JOBS="${FP8RL_JOBS:-2}" -f deploy/docker/Dockerfile -t fp8rl:cpu . \
  > /tmp/compose_check_build.log 2>&1 || { tail -40 /tmp/compose_check_build.log; fail "image build"; }
phase "build fp8rl:cpu"

PROM_IMAGE=${FP8RL_PROMETHEUS_IMAGE:-prom/prometheus:v2.53.0}
if ! "$DOCKER" image inspect "$PROM_IMAGE" >/dev/null 2>&1 &&
   ! timeout 60 "$DOCKER" pull "$PROM_IMAGE" >/dev/null 2>&1; then
  echo "== $PROM_IMAGE cannot be pulled: building local/prometheus:debian from Debian's package"
  PROM_IMAGE=local/prometheus:debian
  DOCKER_BUILDKIT=1 $NICE "$DOCKER" build --network host -q -t "$PROM_IMAGE" \
    -f deploy/docker/Dockerfile.prometheus deploy/docker >/dev/null || fail "prometheus image build"
fi
export FP8RL_PROMETHEUS_IMAGE=$PROM_IMAGE
phase "prometheus image ($PROM_IMAGE)"

# ---- up -----------------------------------------------------------------------------------------
compose config -q || fail "compose config"
compose down -v --remove-orphans >/dev/null 2>&1 || true
compose up -d --no-build --scale generation-worker=2 "${SERVICES[@]}" || fail "compose up"
wait_healthy() {  # every fp8rl container healthy, within $1 seconds
  local deadline=$(( $(date +%s) + $1 )) ids states
  while true; do
    ids=$(compose ps -q weight-sync coordinator trainer generation-worker)
    states=$(for id in $ids; do "$DOCKER" inspect -f '{{.State.Health.Status}}' "$id"; done | sort | uniq -c)
    if [ -n "$ids" ] && ! echo "$states" | grep -qv ' healthy$'; then return 0; fi
    [ "$(date +%s)" -lt "$deadline" ] || fail "containers not healthy within $1 s: $states"
    sleep 2
  done
}
wait_healthy 180
phase "up (all fp8rl containers healthy)"

# ---- the smoke job through the published REST port ----------------------------------------------
# configs/smoke.yaml with its checkpoints on the trainer's volume (inside the coordinator's
# --data-root); the model config path is relative to the image's /opt/fp8rl.
/usr/bin/python3 - "$REST" <<'EOF' || fail "smoke job"
import json, sys, time, urllib.request
import yaml
rest = sys.argv[1]
config = yaml.safe_load(open("configs/smoke.yaml"))
config["checkpoint"]["dir"] = "/var/lib/fp8rl/checkpoints"
def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(rest + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())
# The generation workers register within seconds of being healthy; wait for them.
deadline = time.time() + 60
while True:
    with urllib.request.urlopen(rest + "/metrics", timeout=10) as r:
        text = r.read().decode()
    live = [l for l in text.splitlines() if l.startswith("fp8rl_coordinator_live_workers")]
    if any('generation' in l and float(l.split()[-1]) >= 2 for l in live) or time.time() > deadline:
        break
    time.sleep(1)
status, job = call("POST", "/v1/jobs", config)
assert status == 201, (status, job)
print("submitted", job["id"])
deadline = time.time() + 300
while time.time() < deadline:
    _, job = call("GET", f"/v1/jobs/{job['id']}")
    if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
        break
    time.sleep(1)
print("job", job["id"], job["state"], "step", job.get("step"), job.get("error", ""))
assert job["state"] == "SUCCEEDED", job
_, metrics = call("GET", f"/v1/jobs/{job['id']}/metrics")
steps = [r["step"] for r in metrics["steps"]]
want = list(range(config["algorithm"]["steps"] + 1))
assert steps == want, (steps, want)
print("metrics rows", steps)
EOF
phase "smoke job SUCCEEDED"

# ---- Prometheus: every fp8rl target up ----------------------------------------------------------
# targets_up JOB COUNT: Prometheus reports exactly COUNT targets of JOB, every one up (query API).
targets_up() {
  /usr/bin/python3 - "$PROM" "$1" "$2" <<'EOF'
import json, sys, urllib.parse, urllib.request
prom, job, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": f'up{{job="{job}"}}'})
with urllib.request.urlopen(url, timeout=10) as r:
    result = json.load(r)["data"]["result"]
values = sorted((s["metric"]["instance"], s["value"][1]) for s in result)
print(f"  {job}: {values}")
sys.exit(0 if len(values) == count and all(v == "1" for _, v in values) else 1)
EOF
}
wait_targets() {  # wait_targets WORKERS: all four jobs up, WORKERS generation-worker targets
  local deadline=$(( $(date +%s) + 90 ))
  while true; do
    if targets_up coordinator 1 && targets_up weight-sync 1 && targets_up trainer 1 &&
       targets_up generation-worker "$1"; then return 0; fi
    [ "$(date +%s)" -lt "$deadline" ] || fail "Prometheus targets not all up within 90 s"
    sleep 3
  done
}
wait_targets 2
phase "Prometheus: every fp8rl target up"

# ---- scale the generation workers to 3 and back --------------------------------------------------
live_generation_workers() {
  curl -fsS "$REST/metrics" | awk '/^fp8rl_coordinator_live_workers.*generation/ {print $2}'
}
compose up -d --no-build --no-recreate --scale generation-worker=3 generation-worker ||
  fail "scale to 3"
wait_healthy 120
wait_targets 3
for _ in $(seq 30); do [ "$(live_generation_workers)" = 3 ] && break; sleep 1; done
[ "$(live_generation_workers)" = 3 ] || fail "coordinator lists $(live_generation_workers) live workers, want 3"
phase "scaled to 3 generation workers (healthy, scraped, registered)"
compose up -d --no-build --no-recreate --scale generation-worker=2 generation-worker ||
  fail "scale to 2"
[ "$(compose ps -q generation-worker | wc -l)" = 2 ] || fail "not 2 generation-worker containers"
wait_targets 2
phase "scaled back to 2"

# ---- sizes and teardown -------------------------------------------------------------------------
SIZES=$("$DOCKER" image inspect -f '{{index .RepoTags 0}} {{.Size}}' fp8rl:cpu "$PROM_IMAGE" |
  awk '{printf "%s %.0f MB\n", $1, $2 / 1e6}')
if [ -z "${KEEP:-}" ]; then
  compose down -v --remove-orphans || fail "compose down"
  [ -z "$("$DOCKER" ps -aq --filter "label=com.docker.compose.project=$PROJECT")" ] ||
    fail "containers left after down"
  trap - EXIT
  phase "down -v"
fi
echo "== image sizes"
echo "$SIZES"
echo "== timings"
printf '%s\n' "${TIMES[@]}"
echo "total: $(( $(date +%s) - T0 )) s"
echo "compose_check: PASS"
