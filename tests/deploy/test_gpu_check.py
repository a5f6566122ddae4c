#!/usr/bin/env python3
"""scripts/gpu_check.sh without a GPU: its --dry-run goes through the same step runner, timeouts
and budget as a real run (each step sleeps in place of its command), so these tests check the
order of the steps, the budget, the streaming summary.tsv and the log tarball that a GPU machine
would bring back."""

import csv
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("FP8RL_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
SCRIPT = os.path.join(SOURCE_DIR, "scripts", "gpu_check.sh")

TEST_STEPS = ["tools", "configure", "build", "device math (CPU)", "device", "gpu kernels",
              "gpu model", "gpu train ops", "gpu train state", "gpu train backend",
              "NCCL collectives"]
BENCH_STEPS = ["memcheck paged attention", "memcheck model step", "bench gemm", "bench decode",
               "bench decode torch", "bench grpo step"]


class GpuCheckDryRun(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "out")
        self.env = dict(os.environ, OUT=self.out,
                        FP8RL_GPU_BUILD_DIR=os.path.join(self.tmp.name, "build-gpu"))

    def tearDown(self):
        self.tmp.cleanup()

    def run_check(self, *args, **env):
        return subprocess.run(["bash", SCRIPT, *args], env=dict(self.env, **env),
                              capture_output=True, text=True, timeout=600)

    def rows(self):
        with open(os.path.join(self.out, "summary.tsv"), newline="") as f:
            rows = list(csv.reader(f, delimiter="\t"))
        self.assertEqual(rows[0], ["check", "result", "seconds", "detail"])
        return rows[1:]

    def logs(self):
        with tarfile.open(os.path.join(self.out, "logs.tar.gz")) as t:
            return {os.path.basename(n) for n in t.getnames()}

    def test_full_plan_order_and_files(self):
        r = self.run_check("--dry-run")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        rows = self.rows()
        self.assertEqual([row[0] for row in rows], TEST_STEPS + BENCH_STEPS)
        self.assertTrue(all(row[1] == "DRY" for row in rows), rows)
        # Every step after "tools" states its cap; the summary's worst-case sum is theirs.
        caps = [int(row[3].split("cap ")[1].split(" s")[0]) for row in rows[1:]]
        self.assertTrue(all(c > 0 for c in caps))
        summary = open(os.path.join(self.out, "summary.txt")).read()
        self.assertIn(f"sum to {sum(caps)} s", summary)
        self.assertIn("worst case is the 500 s budget", summary)
        self.assertEqual(sorted(os.listdir(self.out)), ["logs.tar.gz", "summary.tsv", "summary.txt"])
        logs = self.logs()
        for name in ("summary.tsv", "summary.txt", "configure.txt", "build.txt",
                     "fp8rl_gpu_kernels_test.txt", "bench_grpo_step.txt"):
            self.assertIn(name, logs)

    def test_quick_stops_after_the_tests(self):
        r = self.run_check("--dry-run", "--quick")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual([row[0] for row in self.rows()], TEST_STEPS)
        self.assertIn("of a 230 s budget", open(os.path.join(self.out, "summary.txt")).read())

    def test_budget_skips_the_rest_in_order(self):
        start = time.monotonic()
        r = self.run_check("--dry-run", FP8RL_GPU_BUDGET_S="6", FP8RL_GPU_MIN_STEP_S="2",
                           FP8RL_GPU_DRY_SLEEP_S="1")
        took = time.monotonic() - start
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        rows = self.rows()
        results = [row[1] for row in rows]
        self.assertIn("SKIPPED", results)
        first_skip = results.index("SKIPPED")
        self.assertGreater(first_skip, 1)  # some steps ran before the budget ran out
        self.assertTrue(all(x == "SKIPPED" for x in results[first_skip:]), rows)
        self.assertTrue(all("budget" in row[3] for row in rows[first_skip:]))
        # Every step is still accounted for, run or skipped.
        self.assertEqual([row[0] for row in rows], TEST_STEPS + BENCH_STEPS)
        self.assertLess(took, 6 + 60)  # the budget, plus the bookkeeping of a loaded machine

    def test_killed_run_still_brings_back_rows_and_logs(self):
        p = subprocess.Popen(["bash", SCRIPT, "--dry-run"],
                             env=dict(self.env, FP8RL_GPU_DRY_SLEEP_S="2"),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tsv = os.path.join(self.out, "summary.tsv")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if os.path.exists(tsv) and len(open(tsv).read().splitlines()) >= 4:
                break
            time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
        p.stdout.close()
        self.assertEqual(p.returncode, 1, out)
        rows = self.rows()
        self.assertGreaterEqual(len(rows), 3)
        self.assertEqual(rows[-1][:2], ["gpu_check", "FAILED"])
        self.assertIn("stopped early", rows[-1][3])
        self.assertLess(len(rows), len(TEST_STEPS + BENCH_STEPS))
        self.assertIn("summary.tsv", self.logs())
        self.assertTrue(os.path.exists(os.path.join(self.out, "summary.txt")))

    def test_unknown_argument_is_one_line_error(self):
        r = self.run_check("--fast")
        self.assertEqual(r.returncode, 1)
        self.assertIn("unknown argument '--fast'", r.stderr)
        self.assertFalse(os.path.exists(self.out))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[1:])
