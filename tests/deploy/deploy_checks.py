#!/usr/bin/env python3
"""Checks the deployment files (deploy/) with the real tools where they exist and cross-checks
them against each other: compose, Prometheus, Grafana and Kubernetes must agree on service
names, ports, flags, volumes and the data source.

    deploy_checks.py compose|prometheus|dashboards|k8s|docker|docs

Exit status: 0 pass, 1 a check failed (each failure on its own stderr line), 77 the tool the
check needs is not installed (ctest SKIP_RETURN_CODE).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_DIR = os.environ.get("FP8RL_SOURCE_DIR", _REPO)
DEPLOY = os.path.join(SOURCE_DIR, "deploy")
COMPOSE = os.path.join(DEPLOY, "docker-compose.yml")
COMPOSE_GPU = os.path.join(DEPLOY, "docker-compose.gpu.yml")
PROMETHEUS = os.path.join(DEPLOY, "prometheus", "prometheus.yml")
GRAFANA = os.path.join(DEPLOY, "grafana")
K8S = os.path.join(DEPLOY, "k8s")
SKIP = 77

# The fp8rl services: binary, gRPC port, metrics (HTTP) port flag and port, as
# docs/design/services.md "Services and ports".
SERVICES = {
    "coordinator": ("fp8rl-coordinator", 50051, "--http-port", 8080),
    "weight-sync": ("fp8rl-weight-sync", 50052, "--http-port", 9402),
    "trainer": ("fp8rl-trainer-worker", 50053, "--http-port", 9403),
    "generation-worker": ("fp8rl-generation-worker", 50061, "--http-port", 9461),
}
# Old flag names the services still accept with a warning; deployments use the new ones.
DEPRECATED_FLAGS = {"--metrics-port": "--http-port", "--name": "--worker-id"}
GPU_SERVICES = ("trainer", "generation-worker")
BINARIES = ["fp8rl"] + [b for b, _, _, _ in SERVICES.values()]

# The flags each binary accepts (common/service/options.h plus each binary's `extra` keys in
# services/*/main.cc and *_config.cc). When the built binaries are at FP8RL_BIN_DIR, their
# `--help` output is the source of truth instead, so this table cannot drift unnoticed.
COMMON_FLAGS = {"--config", "--listen-host", "--grpc-port", "--http-port", "--advertise-host",
                "--coordinator", "--data-dir", "--log-level", "--shutdown-grace-seconds",
                "--max-body-bytes", "--cluster-token-file", "--tls-cert", "--tls-key", "--tls-ca",
                "--tls-server-name"}
BINARY_FLAGS = {
    "fp8rl-coordinator": COMMON_FLAGS | {
        "--job-store", "--heartbeat-interval-ms", "--worker-expiry-ms",
        "--generate-deadline-seconds", "--worker-wait-seconds", "--trainer-timeout-seconds",
        "--trainer-resume-seconds", "--sync-wait-seconds", "--data-root", "--models-root",
        "--datasets-root", "--auth-token-file"},
    "fp8rl-weight-sync": COMMON_FLAGS | {
        "--keep-versions", "--chunk-bytes", "--max-version-bytes", "--deltas",
        "--delta-max-fraction", "--delta-zstd-level"},
    "fp8rl-trainer-worker": COMMON_FLAGS | {"--weight-sync", "--worker-id",
                                            "--logprob-log-dir", "--data-root", "--models-root",
                                            "--allreduce-bucket-mb"},
    "fp8rl-generation-worker": COMMON_FLAGS | {
        "--weight-sync", "--worker-id", "--precision", "--kv-cache",
        "--max-batch-tokens", "--kv-cache-tokens", "--max-queued-samples", "--batch-wait-ms",
        "--max-samples-per-request", "--kv-block-size", "--device", "--gpu-memory-fraction"},
}
_HELP_FLAGS = {}


def accepted_flags(binary):
    """(flags, source) for a service binary: from `BIN --help` when built, else BINARY_FLAGS."""
    if binary not in _HELP_FLAGS:
        path = os.path.join(os.environ.get("FP8RL_BIN_DIR", ""), binary)
        found = None
        if os.environ.get("FP8RL_BIN_DIR") and os.access(path, os.X_OK):
            r = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
            words = set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", r.stdout + r.stderr))
            if r.returncode == 0 and words:
                found = (words | {"--config"}, f"{path} --help")
        _HELP_FLAGS[binary] = found or (BINARY_FLAGS[binary], "BINARY_FLAGS")
    return _HELP_FLAGS[binary]


def check_flags_exist(c, label, name, binary, words):
    """Every --flag a deployment passes must be one the binary accepts."""
    known, source = accepted_flags(binary)
    for w in words[1:]:
        if w.startswith("--"):
            flag = w.split("=", 1)[0]
            c.expect(flag in known, f"{label}: {name} passes {flag}, which {binary} does not "
                     f"accept (per {source})")
            c.expect(flag not in DEPRECATED_FLAGS, f"{label}: {name} passes {flag}, deprecated: "
                     f"use {DEPRECATED_FLAGS.get(flag)}")


class Checker:
    def __init__(self, name):
        self.name = name
        self.failures = []
        self.passed = 0

    def expect(self, ok, message):
        if ok:
            self.passed += 1
        else:
            self.failures.append(message)
        return ok

    def done(self):
        for f in self.failures:
            print(f"{self.name}: FAIL: {f}", file=sys.stderr)
        if self.failures:
            print(f"{self.name}: {len(self.failures)} of {self.passed + len(self.failures)} "
                  "checks failed", file=sys.stderr)
            return 1
        print(f"{self.name}: OK ({self.passed} checks)")
        return 0


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def command_words(service):
    """The argv a compose service runs: entrypoint + command, with "sh -c 'exec ...'" unwrapped."""
    words = list(service.get("entrypoint") or []) + list(service.get("command") or [])
    if words[:2] == ["/bin/sh", "-c"] and len(words) == 3:
        words = words[2].split()
        if words and words[0] == "exec":
            words = words[1:]
    return words


def flags(words):
    """{--flag: value} from ["bin", "--flag=value", ...] (values unquoted)."""
    out = {}
    for w in words[1:]:
        if w.startswith("--") and "=" in w:
            key, value = w.split("=", 1)
            out[key] = value.strip('"')
    return out


# ---- compose ------------------------------------------------------------------------------------

def compose_tool():
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


def compose_config(tool, files):
    args = list(tool)
    for f in files:
        args += ["-f", f]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FP8RL_", "COMPOSE_"))}
    r = subprocess.run(args + ["config"], capture_output=True, text=True, env=env)
    return r.returncode, r.stdout, r.stderr.strip()


def check_compose_services(c, config, label):
    services = config.get("services", {})
    expected = set(SERVICES) | {"prometheus", "grafana"}
    c.expect(set(services) == expected,
             f"{label}: services {sorted(services)} != {sorted(expected)}")
    for name, (binary, grpc_port, metrics_flag, metrics_port) in SERVICES.items():
        s = services.get(name, {})
        words = command_words(s)
        f = flags(words)
        c.expect(words[:1] == [binary], f"{label}: {name} runs {words[:1]}, want {binary}")
        c.expect(f.get("--grpc-port") == str(grpc_port),
                 f"{label}: {name} --grpc-port={f.get('--grpc-port')}, want {grpc_port}")
        c.expect(f.get(metrics_flag) == str(metrics_port),
                 f"{label}: {name} {metrics_flag}={f.get(metrics_flag)}, want {metrics_port}")
        test = " ".join(s.get("healthcheck", {}).get("test", []))
        c.expect(f"localhost:{metrics_port}/" in test,
                 f"{label}: {name} health check {test!r} does not probe port {metrics_port}")
        c.expect(s.get("restart") in ("unless-stopped", "always", "on-failure"),
                 f"{label}: {name} has no restart policy")
        c.expect("build" in s and "image" in s, f"{label}: {name} needs both build and image")
        dockerfile = os.path.join(s.get("build", {}).get("context", ""),
                                  s.get("build", {}).get("dockerfile", ""))
        c.expect(os.path.isfile(dockerfile), f"{label}: {name} dockerfile {dockerfile} missing")
        c.expect(os.path.realpath(s.get("build", {}).get("context", "")) ==
                 os.path.realpath(SOURCE_DIR), f"{label}: {name} build context is not the repo")
        check_flags_exist(c, label, name, binary, words)
        if name in ("trainer", "generation-worker"):
            c.expect(f.get("--weight-sync") == "weight-sync:50052",
                     f"{label}: {name} --weight-sync={f.get('--weight-sync')}")
        if name == "coordinator":
            # Weight sync registers itself (kind WEIGHT_SYNC); the coordinator is not told.
            c.expect("--weight-sync" not in f and "--coordinator" not in f,
                     f"{label}: coordinator must take no --weight-sync/--coordinator")
            c.expect("weight-sync" not in (s.get("depends_on") or {}),
                     f"{label}: coordinator must not wait for weight-sync (it registers later)")
        if name == "weight-sync":
            c.expect(f.get("--advertise-host") == "weight-sync",
                     f"{label}: weight-sync --advertise-host={f.get('--advertise-host')}, "
                     "want its compose service name")
        if name != "coordinator":
            c.expect(f.get("--coordinator") == "coordinator:50051",
                     f"{label}: {name} --coordinator={f.get('--coordinator')}")
            c.expect("--advertise-host" in f, f"{label}: {name} has no --advertise-host")
            deps = s.get("depends_on", {})
            c.expect(isinstance(deps, dict) and
                     deps.get("coordinator", {}).get("condition") == "service_healthy",
                     f"{label}: {name} must wait for a healthy coordinator")
            deps = s.get("depends_on", {})
            c.expect(isinstance(deps, dict) and
                     deps.get("coordinator", {}).get("condition") == "service_healthy",
                     f"{label}: {name} must wait for a healthy coordinator")

    coord = services.get("coordinator", {})
    published = {(str(p.get("target")), str(p.get("published"))) for p in coord.get("ports", [])}
    c.expect({("8080", "8080"), ("50051", "50051")} <= published,
             f"{label}: coordinator must publish 8080 and 50051, has {sorted(published)}")

    gen = services.get("generation-worker", {})
    c.expect(not gen.get("ports"), f"{label}: generation-worker publishes host ports (no --scale)")
    c.expect("container_name" not in gen and "hostname" not in gen,
             f"{label}: generation-worker must not fix container_name/hostname (no --scale)")
    c.expect(gen.get("deploy", {}).get("replicas") == 2,
             f"{label}: generation-worker deploy.replicas is not 2")
    c.expect(flags(command_words(gen)).get("--advertise-host") == "$$HOSTNAME",
             f"{label}: generation-worker must advertise its own container hostname")

    volumes = set(config.get("volumes", {}))
    for name, volume in (("coordinator", "jobstore"), ("trainer", "checkpoints")):
        s = services.get(name, {})
        data_dir = flags(command_words(s)).get("--data-dir")
        mounts = [v for v in s.get("volumes", []) if isinstance(v, str)]
        c.expect(volume in volumes, f"{label}: named volume {volume} not declared")
        c.expect(any(m.split(":")[0] == volume and m.split(":")[1] == data_dir for m in mounts),
                 f"{label}: {name} --data-dir={data_dir} is not on volume {volume} ({mounts})")

    for name in ("prometheus", "grafana"):
        for m in services.get(name, {}).get("volumes", []):
            source = m.split(":")[0] if isinstance(m, str) else ""
            if source.startswith("/"):
                c.expect(os.path.exists(source), f"{label}: {name} mounts missing {source}")
    return services


def compose():
    c = Checker("compose")
    tool = compose_tool()
    if tool is None:
        print("compose: SKIP: neither docker-compose nor 'docker compose' is installed")
        return SKIP
    rc, out, err = compose_config(tool, [COMPOSE])
    if c.expect(rc == 0, f"{' '.join(tool)} config rejects docker-compose.yml: {err}"):
        check_compose_services(c, yaml.safe_load(out), "cpu")
    rc, out, err = compose_config(tool, [COMPOSE, COMPOSE_GPU])
    if c.expect(rc == 0, f"{' '.join(tool)} config rejects the gpu override: {err}"):
        services = check_compose_services(c, yaml.safe_load(out), "gpu")
        for name in GPU_SERVICES:
            s = services.get(name, {})
            devices = (s.get("deploy", {}).get("resources", {}).get("reservations", {})
                       .get("devices", []))
            c.expect(any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])
                         for d in devices), f"gpu: {name} reserves no NVIDIA GPU")
            c.expect(s.get("build", {}).get("dockerfile") == "deploy/docker/Dockerfile.cuda",
                     f"gpu: {name} does not build Dockerfile.cuda")
            c.expect("CUDA_ARCH" in (s.get("build", {}).get("args") or {}),
                     f"gpu: {name} passes no CUDA_ARCH build argument")
            c.expect(s.get("image") != "fp8rl:cpu", f"gpu: {name} still uses the CPU image")
        for name in ("coordinator", "weight-sync"):
            c.expect("deploy" not in services.get(name, {}) or
                     "resources" not in services[name]["deploy"],
                     f"gpu: {name} should not reserve a GPU")
    # A broken file must be rejected by the same tool (the check above can fail).
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as bad:
        bad.write("services:\n  coordinator:\n    depends_on:\n      weight-sync:\n"
                  "        condition: when_it_feels_like_it\n    image: x\n  weight-sync:\n"
                  "    image: x\n")
    try:
        rc, _, _ = compose_config(tool, [bad.name])
        c.expect(rc != 0, f"{' '.join(tool)} config accepted an invalid depends_on condition")
    finally:
        os.unlink(bad.name)
    return c.done()


# ---- prometheus ---------------------------------------------------------------------------------

def prometheus():
    c = Checker("prometheus")
    if not shutil.which("promtool"):
        print("prometheus: SKIP: promtool is not installed")
        return SKIP
    r = subprocess.run(["promtool", "check", "config", PROMETHEUS], capture_output=True, text=True)
    c.expect(r.returncode == 0, f"promtool check config: {(r.stdout + r.stderr).strip()}")
    config = load_yaml(PROMETHEUS)
    jobs = {j["job_name"]: j for j in config.get("scrape_configs", [])}
    for name, (_, _, _, port) in SERVICES.items():
        job = jobs.get(name)
        if not c.expect(job is not None, f"no scrape job for {name}"):
            continue
        if name in ("generation-worker", "trainer"):
            # Scaled services (trainer: a data-parallel group): every replica by DNS.
            sd = job.get("dns_sd_configs", [{}])[0]
            c.expect(sd.get("names") == [name] and sd.get("type") == "A" and
                     sd.get("port") == port,
                     f"{name} must be found by DNS A records on port {port}: {sd}")
        else:
            targets = [t for s in job.get("static_configs", []) for t in s.get("targets", [])]
            c.expect(targets == [f"{name}:{port}"], f"{name} targets {targets}, want {name}:{port}")
        c.expect(job.get("metrics_path", "/metrics") == "/metrics", f"{name}: metrics_path")
    # promtool must reject a broken copy (the check above can fail).
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as bad:
        bad.write("scrape_configs:\n  - job_name: x\n    dns_sd_configs:\n"
                  "      - names: [generation-worker]\n        type: A\n")
    try:
        r = subprocess.run(["promtool", "check", "config", bad.name], capture_output=True)
        c.expect(r.returncode != 0, "promtool accepted an A-record SD config without a port")
    finally:
        os.unlink(bad.name)
    return c.done()


# ---- dashboards ---------------------------------------------------------------------------------

def overlaps(a, b):
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and
            a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


def check_dashboard(c, file_name, d, datasource_uid):
    for key in ("uid", "title", "schemaVersion", "panels", "time", "templating"):
        c.expect(key in d, f"{file_name}: no '{key}'")
    c.expect(isinstance(d.get("schemaVersion"), int) and d["schemaVersion"] >= 36,
             f"{file_name}: schemaVersion {d.get('schemaVersion')} (Grafana 9+ needs >= 36)")
    panels = d.get("panels") or []
    c.expect(len(panels) > 0, f"{file_name}: no panels")
    ids = [p.get("id") for p in panels]
    c.expect(len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids),
             f"{file_name}: panel ids not unique integers")
    grids = []
    for p in panels:
        where = f"{file_name}: panel '{p.get('title')}' (id {p.get('id')})"
        g = p.get("gridPos", {})
        ok = all(isinstance(g.get(k), int) for k in "hwxy")
        if c.expect(ok, f"{where}: gridPos needs integer h, w, x, y"):
            c.expect(g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0 and
                     g["x"] + g["w"] <= 24, f"{where}: gridPos {g} outside the 24-column grid")
            for other_title, other in grids:
                c.expect(not overlaps(g, other), f"{where}: overlaps panel '{other_title}'")
            grids.append((p.get("title"), g))
        c.expect(bool(p.get("type")) and bool(p.get("title")), f"{where}: needs type and title")
        if p.get("type") == "row":
            continue
        c.expect((p.get("datasource") or {}).get("uid") == datasource_uid,
                 f"{where}: data source uid is not {datasource_uid}")
        targets = p.get("targets") or []
        c.expect(len(targets) > 0, f"{where}: no targets")
        refs = [t.get("refId") for t in targets]
        c.expect(len(refs) == len(set(refs)) and all(refs), f"{where}: refIds missing or repeated")
        for t in targets:
            c.expect(isinstance(t.get("expr"), str) and t["expr"].strip(),
                     f"{where}: target {t.get('refId')} has no expr")
            c.expect((t.get("datasource") or {}).get("uid") == datasource_uid,
                     f"{where}: target {t.get('refId')} data source uid is not {datasource_uid}")
    for v in (d.get("templating") or {}).get("list", []):
        if v.get("type") == "query":
            c.expect((v.get("datasource") or {}).get("uid") == datasource_uid,
                     f"{file_name}: variable {v.get('name')} data source uid")
            used = any(f"${v.get('name')}" in t.get("expr", "")
                       for p in panels for t in p.get("targets") or [])
            c.expect(used, f"{file_name}: variable {v.get('name')} is used by no query")


def dashboards():
    c = Checker("dashboards")
    sources = load_yaml(os.path.join(GRAFANA, "provisioning", "datasources", "prometheus.yml"))
    ds = sources.get("datasources", [])
    c.expect(len(ds) == 1 and ds[0].get("type") == "prometheus" and ds[0].get("uid"),
             f"provisioning: want one prometheus data source with a uid, got {ds}")
    uid = ds[0].get("uid") if ds else None
    c.expect(bool(ds) and ds[0].get("url") == "http://prometheus:9090",
             "provisioning: data source must point at the compose service prometheus:9090")

    compose_cfg = load_yaml(COMPOSE)
    grafana_mounts = {m.split(":")[0]: m.split(":")[1]
                      for m in compose_cfg["services"]["grafana"].get("volumes", [])}
    providers = load_yaml(os.path.join(GRAFANA, "provisioning", "dashboards", "fp8rl.yml"))
    paths = [p.get("options", {}).get("path") for p in providers.get("providers", [])]
    c.expect(paths == [grafana_mounts.get("./grafana/dashboards")],
             f"provisioning: provider path {paths} is not where compose mounts the dashboards")
    c.expect(grafana_mounts.get("./grafana/provisioning") == "/etc/grafana/provisioning",
             "compose: grafana provisioning not mounted at /etc/grafana/provisioning")
    home = compose_cfg["services"]["grafana"].get("environment", {}).get(
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH", "")

    folder = os.path.join(GRAFANA, "dashboards")
    files = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    c.expect(len(files) >= 4, f"want the 4 dashboards, found {files}")
    c.expect(os.path.basename(home) in files, f"compose: home dashboard {home} does not exist")
    uids = []
    for name in files:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            text = f.read()
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            c.expect(False, f"{name}: invalid JSON: {e}")
            continue
        uids.append(d.get("uid"))
        check_dashboard(c, name, d, uid)
    c.expect(len(uids) == len(set(uids)), f"dashboard uids repeat: {uids}")

    # The JSON is generated: it must equal what the generator writes now.
    sys.path.insert(0, GRAFANA)
    import generate_dashboards  # noqa: E402
    c.expect(sorted(generate_dashboards.DASHBOARDS) == files,
             f"generator makes {sorted(generate_dashboards.DASHBOARDS)}, folder has {files}")
    for name, build in generate_dashboards.DASHBOARDS.items():
        path = os.path.join(folder, name)
        current = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        c.expect(current == generate_dashboards.render(build),
                 f"{name} is stale: run /usr/bin/python3 deploy/grafana/generate_dashboards.py")

    # Required topics (issue 5): each dashboard shows the metrics it is about.
    needed = {
        "fp8rl-training.json": ["fp8rl_rl_reward_mean", "fp8rl_rl_validation_accuracy",
                                "fp8rl_trainer_is_weight", "fp8rl_trainer_token_mult_prob_error",
                                "fp8rl_rl_step_phase_seconds"],
        "fp8rl-generation.json": ["fp8rl_generation_tokens_total", "fp8rl_generation_queue_depth",
                                  "fp8rl_generation_batch_size",
                                  "fp8rl_generation_kv_cache_usage_ratio",
                                  "fp8rl_weight_sync_latest_version"],
        "fp8rl-weight-sync.json": ["fp8rl_weight_sync_push_seconds_bucket",
                                   "fp8rl_weight_sync_sent_bytes_total",
                                   "fp8rl_weight_sync_worker_version",
                                   'result=\\"rejected\\"'],
        "fp8rl-fp8.json": ["fp8rl_trainer_weight_scale_inv", "fp8rl_trainer_kv_scale",
                           "fp8rl_trainer_recalibration_seconds"],
    }
    for name, words in needed.items():
        path = os.path.join(folder, name)
        text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        for w in words:
            c.expect(w in text, f"{name}: shows nothing about {w}")
    return c.done()


# ---- kubernetes ---------------------------------------------------------------------------------

def k8s():
    c = Checker("k8s")
    kustomization = load_yaml(os.path.join(K8S, "kustomization.yaml"))
    files = sorted(n for n in os.listdir(K8S) if n.endswith((".yaml", ".yml")) and
                   n != "kustomization.yaml")
    c.expect(sorted(kustomization.get("resources", [])) == files,
             f"kustomization resources {kustomization.get('resources')} != files {files}")
    docs = []
    for name in files:
        with open(os.path.join(K8S, name), encoding="utf-8") as f:
            try:
                loaded = [d for d in yaml.safe_load_all(f) if d is not None]
            except yaml.YAMLError as e:
                c.expect(False, f"{name}: YAML does not parse: {e}")
                continue
        for d in loaded:
            ok = all(d.get(k) for k in ("apiVersion", "kind")) and d.get("metadata", {}).get("name")
            c.expect(bool(ok), f"{name}: object without apiVersion/kind/metadata.name")
            docs.append(d)
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    # The trainers are a StatefulSet (stable names for trainer groups), the rest Deployments.
    deployments = dict(by_kind.get("Deployment", {}))
    statefulsets = by_kind.get("StatefulSet", {})
    c.expect(set(statefulsets) == {"trainer"} and "trainer" not in deployments,
             f"trainer must be a StatefulSet (statefulsets {sorted(statefulsets)})")
    deployments.update(statefulsets)
    services = by_kind.get("Service", {})
    configmaps = by_kind.get("ConfigMap", {})
    c.expect(set(deployments) == set(SERVICES), f"deployments {sorted(deployments)}")
    c.expect(set(services) == set(SERVICES), f"services {sorted(services)}")
    c.expect("PersistentVolumeClaim" in by_kind and "Namespace" in by_kind and configmaps,
             "need a Namespace, a ConfigMap and PersistentVolumeClaims")

    compose_services = load_yaml(COMPOSE)["services"]
    for name, (binary, grpc_port, metrics_flag, metrics_port) in SERVICES.items():
        dep = deployments.get(name)
        if dep is None:
            continue
        spec = dep["spec"]
        pod = spec["template"]
        labels = pod["metadata"].get("labels", {})
        selector = spec["selector"]["matchLabels"]
        c.expect(selector.items() <= labels.items(), f"{name}: selector does not match its pods")
        container = pod["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        args = container.get("args") or container.get("command") or []
        f = flags(args)
        c.expect(args[:1] == [binary], f"{name}: runs {args[:1]}, want {binary}")
        check_flags_exist(c, "k8s", name, binary, args)
        if name != "coordinator":
            c.expect(f.get("--coordinator") == "$(FP8RL_COORDINATOR)",
                     f"{name}: --coordinator={f.get('--coordinator')}, want $(FP8RL_COORDINATOR)")
        if name == "trainer":
            # Each trainer is called (and its group's Gloo connections reach it) at its own pod
            # DNS name under the headless Service the StatefulSet names.
            c.expect(spec.get("serviceName") == "trainer",
                     f"trainer: StatefulSet serviceName={spec.get('serviceName')}, want trainer")
            c.expect(f.get("--advertise-host") == "$(POD_NAME).trainer",
                     f"trainer: --advertise-host={f.get('--advertise-host')}, want "
                     "$(POD_NAME).trainer (the pod's DNS name)")
            c.expect(f.get("--worker-id") == "$(POD_NAME)",
                     f"trainer: --worker-id={f.get('--worker-id')}, want $(POD_NAME) (distinct per "
                     "rank)")
            svc_spec = services.get("trainer", {}).get("spec", {})
            c.expect(svc_spec.get("clusterIP") == "None" and
                     svc_spec.get("publishNotReadyAddresses") is True,
                     "trainer Service must be headless and publish not-ready addresses (a group "
                     "forms while its pods start)")
        if name == "weight-sync":
            # The Service DNS name, which the trainer resolves when the coordinator hands it over.
            c.expect(f.get("--advertise-host") == "weight-sync" and "weight-sync" in services,
                     f"weight-sync: --advertise-host={f.get('--advertise-host')}, want its "
                     "Service name weight-sync")
        c.expect(f.get("--grpc-port") == str(grpc_port) and grpc_port in ports.values(),
                 f"{name}: gRPC port {grpc_port} not served/declared")
        c.expect(f.get(metrics_flag) == str(metrics_port) and metrics_port in ports.values(),
                 f"{name}: metrics port {metrics_port} not served/declared")
        annotations = pod["metadata"].get("annotations", {})
        c.expect(annotations.get("prometheus.io/scrape") == "true" and
                 annotations.get("prometheus.io/port") == str(metrics_port),
                 f"{name}: prometheus.io annotations missing or wrong port")
        # Same flags as the compose deployment (values differ only in addresses).
        compose_flags = set(flags(command_words(compose_services[name])))
        c.expect(set(f) == compose_flags,
                 f"{name}: k8s flags {sorted(f)} differ from compose {sorted(compose_flags)}")
        # $(VAR) references must be defined by env or by a ConfigMap key.
        defined = {e["name"] for e in container.get("env", [])}
        for ref in container.get("envFrom", []):
            cm = configmaps.get(ref.get("configMapRef", {}).get("name"), {})
            c.expect(bool(cm), f"{name}: envFrom names a missing ConfigMap")
            defined |= set(cm.get("data", {}))
        for a in args:
            for var in re.findall(r"\$\(([A-Z0-9_]+)\)", a):
                c.expect(var in defined, f"{name}: argument uses undefined $({var})")
        limits = container.get("resources", {}).get("limits", {})
        if name in GPU_SERVICES:
            c.expect(limits.get("nvidia.com/gpu") == 1, f"{name}: no nvidia.com/gpu: 1 limit")
        else:
            c.expect("nvidia.com/gpu" not in limits, f"{name}: should not take a GPU")
        for v in pod["spec"].get("volumes", []):
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim:
                c.expect(claim in by_kind.get("PersistentVolumeClaim", {}),
                         f"{name}: volume claims missing PVC {claim}")
            cm = v.get("configMap", {})
            if cm and not cm.get("optional"):
                c.expect(cm.get("name") in configmaps,
                         f"{name}: missing ConfigMap {cm.get('name')}")
        svc = services.get(name, {}).get("spec", {})
        c.expect(svc.get("selector", {}).items() <= labels.items(),
                 f"{name}: Service selector does not select the Deployment's pods")
        for p in svc.get("ports", []):
            target = p.get("targetPort")
            c.expect(target in ports or target in ports.values(),
                     f"{name}: Service targetPort {target} is not a container port")
    c.expect(services.get("generation-worker", {}).get("spec", {}).get("clusterIP") == "None",
             "generation-worker Service must be headless")
    c.expect(deployments.get("generation-worker", {}).get("spec", {}).get("replicas", 0) >= 2,
             "generation-worker needs a replica count of at least 2")
    c.expect(deployments.get("coordinator", {}).get("spec", {}).get("strategy", {}).get("type") ==
             "Recreate", "coordinator: a ReadWriteOnce volume needs strategy Recreate")

    kubectl = shutil.which("kubectl")
    if kubectl:
        r = subprocess.run([kubectl, "kustomize", K8S], capture_output=True, text=True)
        if c.expect(r.returncode == 0, f"kubectl kustomize: {r.stderr.strip()}"):
            rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
            c.expect(len(rendered) == len(docs), "kustomize output lost objects")
            c.expect(all(d["metadata"].get("namespace") == "fp8rl" for d in rendered
                         if d["kind"] != "Namespace"), "kustomize: objects outside namespace fp8rl")
    else:
        print("k8s: note: kubectl not installed, kustomize rendering not checked")
    return c.done()


# ---- dockerfiles --------------------------------------------------------------------------------

def docker():
    c = Checker("docker")
    folder = os.path.join(DEPLOY, "docker")
    for name in ("Dockerfile", "Dockerfile.cuda"):
        # Join continued lines the way the Dockerfile parser does.
        text = open(os.path.join(folder, name), encoding="utf-8").read().replace("\\\n", "")
        stages = re.findall(r"^FROM\s+(\S+)", text, re.M)
        c.expect(len(stages) == 2, f"{name}: want a builder and a runtime stage, got {stages}")
        targets = re.search(r'ARG FP8RL_TARGETS="([^"]+)"', text)
        c.expect(targets is not None and targets.group(1).split() == BINARIES,
                 f"{name}: FP8RL_TARGETS must be {BINARIES}")
        for src in re.findall(r"^COPY\s+(?!--from)(\S+)\s", text, re.M):
            if src != ".":
                c.expect(os.path.exists(os.path.join(SOURCE_DIR, src)) or src == "configs/",
                         f"{name}: COPY source {src} does not exist")
        c.expect("scripts/setup.sh" in text and "runtime_packages.sh" in text,
                 f"{name}: must install via scripts/setup.sh and runtime_packages.sh")
        c.expect(os.path.exists(os.path.join(folder, name + ".dockerignore")),
                 f"{name}: no {name}.dockerignore")
    cpu = open(os.path.join(folder, "Dockerfile"), encoding="utf-8").read()
    c.expect("-DFP8RL_ENABLE_CUDA=OFF" in cpu and "FROM debian:12" in cpu,
             "Dockerfile: Debian 12 builder with CUDA off")
    cuda = open(os.path.join(folder, "Dockerfile.cuda"), encoding="utf-8").read()
    c.expect(re.search(r"^ARG CUDA_ARCH=90a$", cuda, re.M) is not None,
             "Dockerfile.cuda: ARG CUDA_ARCH default 90a")
    c.expect("-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH}" in cuda,
             "Dockerfile.cuda: CUDA_ARCH not passed to CMake")
    c.expect(re.search(r"FROM nvidia/cuda:\S+-devel-\S+ AS builder", cuda) is not None and
             re.search(r"FROM nvidia/cuda:\S+-runtime-", cuda) is not None,
             "Dockerfile.cuda: nvidia/cuda devel builder and runtime base")

    # runtime_packages.sh maps the libraries of a real executable to their Debian packages.
    script = os.path.join(folder, "runtime_packages.sh")
    if shutil.which("dpkg-query") and shutil.which("ldd"):
        r = subprocess.run(["bash", script, sys.executable], capture_output=True, text=True)
        packages = r.stdout.split()
        c.expect(r.returncode == 0 and "libc6" in packages,
                 f"runtime_packages.sh on python: rc {r.returncode}, {packages} {r.stderr}")
        r = subprocess.run(["bash", script, os.path.join(folder, "no-such-binary")],
                           capture_output=True, text=True)
        c.expect(r.returncode != 0 and "not an executable" in r.stderr,
                 "runtime_packages.sh must fail on a missing executable")
    return c.done()


# ---- docs ---------------------------------------------------------------------------------------

def docs():
    c = Checker("docs")
    text = open(os.path.join(SOURCE_DIR, "docs", "deploy.md"), encoding="utf-8").read()
    # File paths (kubectl's "deploy/NAME" resource names are not): deploy/<folder or file>...
    pattern = r"\b((?:deploy/(?:docker|k8s|grafana|prometheus|docker-compose)|tests/deploy/)" \
              r"[A-Za-z0-9_./-]*[A-Za-z0-9_])"
    for path in sorted(set(re.findall(pattern, text))):
        c.expect(os.path.exists(os.path.join(SOURCE_DIR, path)), f"deploy.md names missing {path}")
    sys.path.insert(0, GRAFANA)
    import generate_dashboards  # noqa: E402
    for build in generate_dashboards.DASHBOARDS.values():
        title = build()["title"].split(" / ", 1)[1]
        c.expect(title in text, f"deploy.md does not describe the {title} dashboard")
    for name, (_, grpc_port, _, metrics_port) in SERVICES.items():
        c.expect(str(grpc_port) in text and str(metrics_port) in text,
                 f"deploy.md does not give the ports of {name}")
    return c.done()


# ---- secure (tokens and TLS) --------------------------------------------------------------------

SECURE_FLAGS = ("--cluster-token-file", "--tls-cert", "--tls-key", "--tls-ca", "--tls-server-name")


def check_secure_argv(c, label, name, words):
    """A service of a secure deployment passes every security flag (and the coordinator its API
    tokens), each a path under the mounted secrets."""
    binary = SERVICES[name][0]
    check_flags_exist(c, label, name, binary, words)
    f = flags(words)
    wanted = SECURE_FLAGS + (("--auth-token-file",) if name == "coordinator" else ())
    for flag in wanted:
        c.expect(flag in f, f"{label}: {name} does not pass {flag}")
    return f


def secure():
    """deploy/docker-compose.secure.yml over the base file, deploy/k8s-secure rendered by kubectl
    and prometheus.secure.yml: every fp8rl service gets the token and TLS flags, probes and
    scrapes use HTTPS."""
    c = Checker("secure")
    tool = compose_tool()
    if tool is not None:
        rc, out, err = compose_config(tool, [COMPOSE, os.path.join(DEPLOY,
                                                                   "docker-compose.secure.yml")])
        if c.expect(rc == 0, f"{' '.join(tool)} config rejects the secure override: {err}"):
            config = yaml.safe_load(out)
            for name in SERVICES:
                service = config["services"][name]
                f = check_secure_argv(c, "compose", name, command_words(service))
                mounted = {s if isinstance(s, str) else s.get("source")
                           for s in service.get("secrets", [])}
                for flag in SECURE_FLAGS[:-1] + (("--auth-token-file",)
                                                 if name == "coordinator" else ()):
                    secret = f.get(flag, "").removeprefix("/run/secrets/")
                    c.expect(secret in mounted and secret in config.get("secrets", {}),
                             f"compose: {name} {flag} names secret '{secret}', not mounted")
                test = " ".join(service.get("healthcheck", {}).get("test", []))
                c.expect("https://" in test and "--cacert" in test,
                         f"compose: {name} health check is not HTTPS with the CA: {test}")
    prom = load_yaml(os.path.join(DEPLOY, "prometheus", "prometheus.secure.yml"))
    jobs = {j["job_name"]: j for j in prom.get("scrape_configs", [])}
    for name in SERVICES:
        job = jobs.get(name, {})
        c.expect(job.get("scheme") == "https" and job.get("tls_config", {}).get("ca_file"),
                 f"prometheus.secure.yml: job {name} does not scrape over HTTPS with a CA")
    if shutil.which("kubectl"):
        r = subprocess.run(["kubectl", "kustomize", os.path.join(DEPLOY, "k8s-secure")],
                           capture_output=True, text=True)
        if c.expect(r.returncode == 0, f"kubectl kustomize deploy/k8s-secure: {r.stderr}"):
            docs = [d for d in yaml.safe_load_all(r.stdout)
                    if d and d["kind"] in ("Deployment", "StatefulSet")]
            c.expect({d["metadata"]["name"] for d in docs} == set(SERVICES),
                     "k8s-secure: not every deployment rendered")
            for d in docs:
                name = d["metadata"]["name"]
                pod = d["spec"]["template"]["spec"]
                container = pod["containers"][0]
                check_secure_argv(c, "k8s-secure", name, container["args"])
                c.expect(any(v.get("secret", {}).get("secretName") == "fp8rl-security"
                             for v in pod.get("volumes", [])),
                         f"k8s-secure: {name} does not mount the fp8rl-security Secret")
                for probe in ("readinessProbe", "livenessProbe"):
                    c.expect(container.get(probe, {}).get("httpGet", {}).get("scheme") == "HTTPS",
                             f"k8s-secure: {name} {probe} is not HTTPS")
    return c.done()


CHECKS = {"compose": compose, "prometheus": prometheus, "dashboards": dashboards, "k8s": k8s,
          "docker": docker, "docs": docs, "secure": secure}


def main(argv):
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"usage: deploy_checks.py {{{'|'.join(CHECKS)}}}", file=sys.stderr)
        return 2
    return CHECKS[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
