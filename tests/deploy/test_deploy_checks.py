#!/usr/bin/env python3
"""Proves the deployment checks can fail: each test copies deploy/ and docs/ files to a
temporary tree, breaks one thing the way a careless edit would, and expects the matching check
(deploy_checks.py or dashboard_metrics.py) to fail and name the problem."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("FP8RL_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
HAVE_COMPOSE = shutil.which("docker-compose") is not None
HAVE_PROMTOOL = shutil.which("promtool") is not None


class BrokenDeployment(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        shutil.copytree(os.path.join(SOURCE_DIR, "deploy"), os.path.join(self.root, "deploy"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(HERE, os.path.join(self.root, "tests", "deploy"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        os.makedirs(os.path.join(self.root, "docs"))
        for doc in ("metrics.md", "deploy.md"):
            shutil.copy(os.path.join(SOURCE_DIR, "docs", doc), os.path.join(self.root, "docs", doc))
        # The compose build contexts and COPY sources must exist in the copy too.
        os.makedirs(os.path.join(self.root, "scripts"))
        shutil.copy(os.path.join(SOURCE_DIR, "scripts", "setup.sh"),
                    os.path.join(self.root, "scripts", "setup.sh"))

    def tearDown(self):
        self.tmp.cleanup()

    def edit(self, rel, old, new):
        path = os.path.join(self.root, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.assertIn(old, text, f"{rel}: the text to break is gone; update this test")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new, 1))

    def run_script(self, script, *args):
        env = dict(os.environ, FP8RL_SOURCE_DIR=self.root)
        r = subprocess.run([sys.executable, os.path.join(HERE, script), *args],
                           capture_output=True, text=True, env=env)
        return r.returncode, r.stdout + r.stderr

    def assert_fails(self, script, args, needle):
        rc, out = self.run_script(script, *args)
        self.assertEqual(rc, 1, out)
        self.assertIn(needle, out)

    def test_unbroken_copy_passes(self):
        for check in ("dashboards", "k8s", "docker", "docs"):
            rc, out = self.run_script("deploy_checks.py", check)
            self.assertEqual(rc, 0, out)
        rc, out = self.run_script("dashboard_metrics.py")
        self.assertEqual(rc, 0, out)

    @unittest.skipUnless(HAVE_COMPOSE, "docker-compose not installed")
    def test_compose_breakages(self):
        # Three independent breakages in one run (each docker-compose call takes a second).
        self.edit("deploy/docker-compose.yml", "    deploy:\n      replicas: 2\n",
                  "    ports: [\"9461:9461\"]\n    deploy:\n      replicas: 2\n")
        self.edit("deploy/docker-compose.yml", "--http-port=9403", "--http-port=9999")
        self.edit("deploy/docker-compose.gpu.yml", "driver: nvidia", "driver: cdi")
        # A flag the coordinator binary does not have (weight sync registers itself).
        self.edit("deploy/docker-compose.yml", "      - --data-dir=/var/lib/fp8rl/jobs\n",
                  "      - --data-dir=/var/lib/fp8rl/jobs\n      - --weight-sync=weight-sync:50052\n")
        rc, out = self.run_script("deploy_checks.py", "compose")
        self.assertEqual(rc, 1, out)
        self.assertIn("generation-worker publishes host ports", out)
        self.assertIn("trainer --http-port=9999", out)
        self.assertIn("gpu: trainer reserves no NVIDIA GPU", out)
        self.assertIn("coordinator passes --weight-sync, which fp8rl-coordinator does not accept",
                      out)

    @unittest.skipUnless(HAVE_COMPOSE, "docker-compose not installed")
    def test_compose_weight_sync_not_registering(self):
        self.edit("deploy/docker-compose.yml", "      - --coordinator=coordinator:50051\n"
                  "      - --advertise-host=weight-sync\n", "")
        rc, out = self.run_script("deploy_checks.py", "compose")
        self.assertEqual(rc, 1, out)
        self.assertIn("weight-sync --coordinator=None", out)
        self.assertIn("weight-sync --advertise-host=None", out)

    @unittest.skipUnless(HAVE_PROMTOOL, "promtool not installed")
    def test_prometheus_wrong_worker_port(self):
        self.edit("deploy/prometheus/prometheus.yml", "port: 9461", "port: 9462")
        self.assert_fails("deploy_checks.py", ["prometheus"], "generation-worker must be found")

    @unittest.skipUnless(HAVE_PROMTOOL, "promtool not installed")
    def test_prometheus_syntax_error(self):
        self.edit("deploy/prometheus/prometheus.yml", "scrape_interval: 5s", "scrape_interval: 5")
        self.assert_fails("deploy_checks.py", ["prometheus"], "promtool check config")

    def test_dashboard_hand_edit_is_stale_and_checked(self):
        self.edit("deploy/grafana/dashboards/fp8rl-training.json", '"x": 12', '"x": 14')
        rc, out = self.run_script("deploy_checks.py", "dashboards")
        self.assertEqual(rc, 1, out)
        self.assertIn("is stale", out)
        self.assertIn("overlaps panel", out)

    def test_dashboard_wrong_datasource(self):
        self.edit("deploy/grafana/provisioning/datasources/prometheus.yml",
                  "uid: fp8rl-prometheus", "uid: other")
        self.assert_fails("deploy_checks.py", ["dashboards"], "data source uid is not other")

    def test_dashboard_metric_not_in_contract(self):
        self.edit("deploy/grafana/dashboards/fp8rl-training.json", '"expr": "fp8rl_rl_reward_mean"',
                  '"expr": "fp8rl_rl_reward_avg"')
        self.assert_fails("dashboard_metrics.py", [], "fp8rl_rl_reward_avg is not in")

    def test_dashboard_metric_missing_from_scrape(self):
        scrape = os.path.join(self.root, "scrape.prom")
        with open(scrape, "w", encoding="utf-8") as f:
            f.write("fp8rl_rl_reward_mean 0.25\n")
        self.assert_fails("dashboard_metrics.py", ["--scrape", scrape],
                          "fp8rl_rl_validation_accuracy is in no scrape")

    def test_k8s_trainer_without_gpu(self):
        self.edit("deploy/k8s/trainer.yaml", "limits: {memory: 64Gi, nvidia.com/gpu: 1}",
                  "limits: {memory: 64Gi}")
        self.assert_fails("deploy_checks.py", ["k8s"], "trainer: no nvidia.com/gpu: 1 limit")

    def test_k8s_service_selects_nothing(self):
        self.edit("deploy/k8s/weight-sync.yaml",
                  "  selector: {app.kubernetes.io/name: weight-sync}",
                  "  selector: {app.kubernetes.io/name: weightsync}")
        self.assert_fails("deploy_checks.py", ["k8s"], "weight-sync: Service selector")

    def test_k8s_undefined_variable(self):
        self.edit("deploy/k8s/trainer.yaml", "--coordinator=$(FP8RL_COORDINATOR)",
                  "--coordinator=$(FP8RL_COORD)")
        self.assert_fails("deploy_checks.py", ["k8s"], "undefined $(FP8RL_COORD)")

    def test_k8s_unknown_flag(self):
        self.edit("deploy/k8s/weight-sync.yaml", "- --http-port=9402", "- --metric-port=9402")
        self.assert_fails("deploy_checks.py", ["k8s"],
                          "weight-sync passes --metric-port, which fp8rl-weight-sync does not")

    def test_k8s_deprecated_flag(self):
        self.edit("deploy/k8s/weight-sync.yaml", "- --http-port=9402", "- --metrics-port=9402")
        self.assert_fails("deploy_checks.py", ["k8s"],
                          "weight-sync passes --metrics-port, deprecated: use --http-port")

    def test_k8s_weight_sync_advertises_pod_name(self):
        self.edit("deploy/k8s/weight-sync.yaml", "--advertise-host=weight-sync",
                  "--advertise-host=$(HOSTNAME)")
        self.assert_fails("deploy_checks.py", ["k8s"], "weight-sync: --advertise-host=$(HOSTNAME)")

    def test_k8s_trainer_advertises_the_service_name(self):
        # Every rank would advertise the same address: the group could not form.
        self.edit("deploy/k8s/trainer.yaml", "--advertise-host=$(POD_NAME).trainer",
                  "--advertise-host=trainer")
        self.assert_fails("deploy_checks.py", ["k8s"], "trainer: --advertise-host=trainer")

    def test_k8s_trainer_service_not_headless(self):
        self.edit("deploy/k8s/trainer.yaml", "  clusterIP: None\n", "")
        self.assert_fails("deploy_checks.py", ["k8s"], "trainer Service must be headless")

    def test_k8s_trainer_as_deployment(self):
        self.edit("deploy/k8s/trainer.yaml", "kind: StatefulSet", "kind: Deployment")
        self.assert_fails("deploy_checks.py", ["k8s"], "trainer must be a StatefulSet")

    def test_k8s_unparsable_yaml(self):
        self.edit("deploy/k8s/pvc.yaml", "accessModes: [ReadWriteOnce]", "accessModes: [Read")
        self.assert_fails("deploy_checks.py", ["k8s"], "pvc.yaml: YAML does not parse")

    def test_cuda_dockerfile_wrong_arch_default(self):
        self.edit("deploy/docker/Dockerfile.cuda", "ARG CUDA_ARCH=90a", "ARG CUDA_ARCH=80")
        self.assert_fails("deploy_checks.py", ["docker"], "ARG CUDA_ARCH default 90a")

    def test_docs_name_a_missing_file(self):
        self.edit("docs/deploy.md", "deploy/docker-compose.gpu.yml",
                  "deploy/docker-compose.cuda.yml")
        self.assert_fails("deploy_checks.py", ["docs"],
                          "names missing deploy/docker-compose.cuda.yml")


if __name__ == "__main__":
    unittest.main()
