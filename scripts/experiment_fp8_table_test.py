#!/usr/bin/env python3
"""Tests of scripts/experiment_fp8_table.py: the aggregation (units in, the numbers of the table
out: pairing by seed, units left out, the primary endpoint, Holm, the step-time ratio), the
early-stopped warm start, the weight hash and the publishing of summaries.

  /usr/bin/python3 scripts/experiment_fp8_table_test.py
"""

import copy
import hashlib
import os
import random
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import experiment_fp8_table as t  # noqa: E402
import experiment_stats as st  # noqa: E402


def unit(setup, seed, final, step_s=10.0, state="SUCCEEDED", tmpe=1.0):
    rows = [{"step": 0, "metrics": {"val_accuracy": 0.2}},
            {"step": 1, "metrics": {"reward_mean": 0.1, "token_mult_prob_error": tmpe,
                                    "time_step_seconds": step_s}},
            {"step": 2, "metrics": {"reward_mean": 0.2, "token_mult_prob_error": tmpe,
                                    "time_step_seconds": step_s, "val_accuracy": final}}]
    return {"unit": f"{setup}-s{seed}", "kind": "rl", "setup": setup, "seed": seed,
            "state": state, "wall_seconds": 60.0, **t.summarize_rl(rows)}


class ChainedWarmStart(unittest.TestCase):
    def test_parts_split_the_steps(self):
        self.assertEqual(t.warm_start_parts({"steps": 800, "parts": 8}), [100] * 8)
        self.assertEqual(t.warm_start_parts({"steps": 10, "parts": 4}), [3, 3, 2, 2])
        self.assertEqual(t.warm_start_parts({"steps": 7}), [7])
        for bad in (0, 11):
            with self.assertRaises(SystemExit):
                t.warm_start_parts({"steps": 10, "parts": bad})

    def test_a_later_part_continues_from_the_checkpoint(self):
        cfg = {"warm_start": {"precision": {"training": "bf16"}},
               "job": {"task": {"name": "jsonl", "seed": 1234}, "algorithm": {},
                       "precision": {}},
               "data": {}}
        sft = {"steps": 100, "learning_rate": 1e-3, "batch_size": 32, "parts": 8}
        first = t.sft_job_config(cfg, "/tmp/x", "warm-start-part1", "m.json", sft, 1)
        later = t.sft_job_config(cfg, "/tmp/x", "warm-start-part3", "m.json", sft, 1,
                                 start="/tmp/x/ckpt/step-1", task_seed_offset=2)
        self.assertIn("init", first["model"])
        self.assertEqual(later["model"], {"checkpoint": "/tmp/x/ckpt/step-1"})
        self.assertEqual(first["task"]["seed"], 1234)
        self.assertEqual(later["task"]["seed"], 1236)
        self.assertNotIn("parts", later["sft"])  # not a job key
        self.assertEqual(later["sft"]["steps"], 100)


class Aggregation(unittest.TestCase):
    def test_summarize_rl(self):
        u = unit("bf16", 1, 0.5, tmpe=1.02)
        self.assertEqual(u["start_accuracy"], 0.2)
        self.assertEqual(u["final_accuracy"], 0.5)
        self.assertEqual(u["best_accuracy"], 0.5)
        self.assertAlmostEqual(u["token_mult_prob_error"], 1.02)
        self.assertEqual(u["steps_done"], 2)

    def test_step_time_without_validation(self):
        rows = [{"step": 0, "metrics": {"val_accuracy": 0.1, "time_validate_seconds": 50.0}},
                {"step": 1, "metrics": {"time_step_seconds": 21.0}},
                {"step": 2, "metrics": {"time_step_seconds": 80.0, "time_validate_seconds": 61.0,
                                        "val_accuracy": 0.2}}]
        u = t.summarize_rl(rows)
        self.assertAlmostEqual(u["time_step_seconds"], 50.5)
        self.assertAlmostEqual(u["time_step_no_val_seconds"], 20.0)
        self.assertAlmostEqual(t.step_seconds(u), 20.0)
        self.assertAlmostEqual(t.step_seconds({"time_step_seconds": 9.0}), 9.0)  # design 1

    def test_paired_over_common_seeds_only(self):
        units = [unit("bf16", 1, 0.50), unit("bf16", 2, 0.60), unit("bf16", 3, 0.55),
                 unit("fp8", 1, 0.45, 20.0), unit("fp8", 2, 0.58, 30.0),
                 unit("fp8", 3, 0.10, state="FAILED"),  # left out: not SUCCEEDED
                 unit("fp8", 4, 0.90)]                    # left out of the pairing: no bf16 s4
        _, agg = t.build_report(units, {"setups": ["bf16", "fp8"], "seeds": [1, 2, 3, 4]})
        self.assertEqual(agg["bf16"]["seeds"], [1, 2, 3])
        self.assertEqual(agg["fp8"]["seeds"], [1, 2, 4])
        want = st.paired_compare([0.45, 0.58], [0.50, 0.60])
        got = agg["fp8"]["final_accuracy_vs_bf16"]
        self.assertEqual(got["n"], 2)
        self.assertAlmostEqual(got["mean_diff"], -0.035)
        self.assertAlmostEqual(got["p_t"], want["p_t"])
        self.assertAlmostEqual(agg["fp8"]["step_time_ratio_vs_bf16"]["mean"], 2.5)
        self.assertAlmostEqual(agg["fp8"]["final_accuracy"]["mean"], (0.45 + 0.58 + 0.90) / 3)


def curve_unit(setup, seed, curve, step_s=10.0):
    """A finished unit whose held-out curve is [(step, accuracy)]."""
    rows = [{"step": st_, "metrics": {"val_accuracy": acc, "time_step_seconds": step_s,
                                      "token_mult_prob_error": 1.0 + 0.001 * seed}}
            for st_, acc in curve]
    rows[0]["metrics"].pop("time_step_seconds")
    return {"unit": f"{setup}-s{seed}", "kind": "rl", "setup": setup, "seed": seed,
            "state": "SUCCEEDED", "wall_seconds": 60.0, **t.summarize_rl(rows)}


class Endpoints(unittest.TestCase):
    def test_primary_is_the_mean_after_step_0(self):
        rng = random.Random(7)
        curve = [(0, 0.9)] + [(s, rng.uniform(0.05, 0.95)) for s in (5, 10, 15, 20)]
        u = curve_unit("bf16", 1, curve)
        self.assertAlmostEqual(t.mean_val_after_start(u), sum(v for _, v in curve[1:]) / 4)
        self.assertAlmostEqual(t.val_at(u, 10), curve[2][1])
        self.assertIsNone(t.val_at(u, 7))
        self.assertIsNone(t.mean_val_after_start(curve_unit("bf16", 1, [(0, 0.3)])))

    def test_primary_paired_against_bf16_with_holm(self):
        rng = random.Random(11)
        steps = (0, 5, 10, 15)
        units, prim = [], {}
        for seed in (1, 2, 3, 4):
            for setup, shift in (("bf16", 0.0), ("fp8", -0.05), ("fp8-gen-none", 0.02),
                                 ("fp8-gen-tis", 0.0)):
                curve = [(s, min(1.0, 0.2 + 0.03 * s + shift + rng.uniform(-0.03, 0.03)))
                         for s in steps]
                units.append(curve_unit(setup, seed, curve))
                prim[(setup, seed)] = sum(v for s, v in curve if s > 0) / 3
        setups = ["bf16", "fp8", "fp8-gen-none", "fp8-gen-tis"]
        lines, agg = t.build_report(units, {"setups": setups, "seeds": [1, 2, 3, 4],
                                            "early_step": 10})
        ps = []
        for s in setups[1:]:
            want = st.paired_compare([prim[(s, x)] for x in (1, 2, 3, 4)],
                                     [prim[("bf16", x)] for x in (1, 2, 3, 4)])
            got = agg[s]["primary_vs_bf16"]
            self.assertEqual(got["n"], 4)
            self.assertAlmostEqual(got["mean_diff"], want["mean_diff"])
            self.assertAlmostEqual(got["p_t"], want["p_t"])
            ps.append(want["p_t"])
        self.assertLess(agg["fp8"]["primary_vs_bf16"]["hi"], 0.0)  # a real -0.05 shift shows
        for s, p in zip(setups[1:], t.holm(ps)):
            self.assertAlmostEqual(agg[s]["primary_vs_bf16"]["p_t_holm"], p)
        self.assertTrue(any("p_holm=" in ln for ln in lines))
        self.assertAlmostEqual(agg["fp8"]["early_accuracy"]["mean"],
                               sum(t.val_at(u, 10) for u in units if u["setup"] == "fp8") / 4)

    def test_holm(self):
        self.assertEqual(t.holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
        self.assertEqual(t.holm([0.5, 0.9]), [1.0, 1.0])


class EarlyStoppedWarmStart(unittest.TestCase):
    CFG = {"warm_start": {"precision": {}, "val_prompts": 50},
           "job": {"task": {"name": "jsonl"}, "algorithm": {}, "precision": {}}, "data": {}}
    SFT = {"steps": 200, "extend_steps": 25, "max_extensions": 4, "target_accuracy": 0.1,
           "learning_rate": 1e-3, "batch_size": 32}

    def run_chain(self, accuracies, expect=None):
        calls = []

        def fake_sft_unit(cluster, cfg, out, name, model_config, sft, seed, start=None,
                          task_seed_offset=0):
            acc = accuracies[len(calls)]
            calls.append((name, sft["steps"], start, task_seed_offset))
            return {"unit": name, "sft": sft, "val_accuracy": [[0, acc], [1, acc]],
                    "checkpoint": f"/ck/{name}", "wall_seconds": 10.0, "sft_seconds": 9.0,
                    "weights_sha256": f"h{len(calls)}"}
        real, t.sft_unit = t.sft_unit, fake_sft_unit
        try:
            with tempfile.TemporaryDirectory() as out:
                return t.chained_sft_unit(None, self.CFG, out, "warm-start", "m.json", self.SFT,
                                          1, expect_sha256=expect), calls
        finally:
            t.sft_unit = real

    def test_stops_at_the_first_part_that_reaches_the_target(self):
        summary, calls = self.run_chain([0.0, 0.02, 0.13, 0.5, 0.9])
        self.assertEqual([c[1] for c in calls], [200, 25, 25])
        self.assertEqual(calls[1][2], "/ck/warm-start-part1")  # continues from the part before
        self.assertEqual([c[3] for c in calls], [0, 1, 2])
        self.assertEqual(summary["sft_steps_total"], 250)
        self.assertEqual([p[1:] for p in summary["part_accuracy"]],
                         [[200, 0.0], [225, 0.02], [250, 0.13]])
        self.assertEqual(summary["weights_sha256"], "h3")

    def test_not_reaching_the_target_is_an_error(self):
        with self.assertRaises(SystemExit) as e:
            self.run_chain([0.0, 0.01, 0.02, 0.03, 0.04])
        self.assertIn("target_accuracy", str(e.exception))

    def test_a_different_hash_stops_the_run(self):
        with self.assertRaises(SystemExit) as e:
            self.run_chain([0.2], expect="h-committed")
        self.assertIn("warm_start.sha256", str(e.exception))
        summary, _ = self.run_chain([0.2], expect="h1")
        self.assertEqual(summary["weights_sha256"], "h1")

    def test_job_sft_has_only_job_keys(self):
        job = t.sft_job_config(self.CFG, "/tmp/x", "warm-start-part1", "m.json", self.SFT, 1)
        self.assertEqual(sorted(job["sft"]), ["batch_size", "learning_rate", "steps"])
        self.assertEqual(job["validation"]["num_prompts"], 50)


class Config(unittest.TestCase):
    def test_the_committed_configs_pass(self):
        import yaml
        for name in ("fp8-table.yaml", "fp8-table-design1.yaml"):
            with open(os.path.join(t.REPO, "configs", "experiments", name)) as fh:
                t.check_config(yaml.safe_load(fh))

    def test_bad_fields_are_named(self):
        import yaml
        with open(os.path.join(t.REPO, "configs", "experiments", "fp8-table.yaml")) as fh:
            good = yaml.safe_load(fh)
        for path, value, field in ((("analysis", "early_step"), 7, "analysis.early_step"),
                                   (("analysis", "early_step"), 40, "analysis.early_step"),
                                   (("warm_start", "sft", "target_accuracy"), 1.5,
                                    "warm_start.sft.target_accuracy"),
                                   (("warm_start", "sft", "extend_steps"), 0,
                                    "warm_start.sft.extend_steps")):
            cfg = copy.deepcopy(good)
            node = cfg
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = value
            with self.assertRaises(SystemExit) as e:
                t.check_config(cfg)
            self.assertIn(field, str(e.exception))


class Storage(unittest.TestCase):
    def test_weights_sha256_hashes_the_safetensors_file(self):
        data = random.Random(3).randbytes(3 << 19)  # more than one read block
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "model.safetensors"), "wb") as fh:
                fh.write(data)
            self.assertEqual(t.weights_sha256(d), hashlib.sha256(data).hexdigest())

    def test_publisher_writes_into_the_design_folder(self):
        with tempfile.TemporaryDirectory() as docs:
            pub = t.Publisher(docs, {"design": "design2"}, commit=False)
            pub("bf16-s1", {"unit": "bf16-s1", "final_accuracy": 0.4})
            path = os.path.join(docs, "experiment-runs", "fp8-table", "design2", "bf16-s1.json")
            self.assertEqual(t.read_json(path)["final_accuracy"], 0.4)
            self.assertTrue(t.runs_dir(docs, {}).endswith("design1-ceiling"))

    def test_restore_copies_finished_grpo_units_only(self):
        with tempfile.TemporaryDirectory() as runs, tempfile.TemporaryDirectory() as out:
            for name, kind, state in (("bf16-s1", "rl", "SUCCEEDED"), ("fp8-s1", "rl", "FAILED"),
                                      ("warm-start", "sft", "SUCCEEDED"),
                                      ("repro", "repro", None), ("timing", "timing", "SUCCEEDED")):
                t.write_json(os.path.join(runs, f"{name}.json"),
                             {"unit": name, "kind": kind, "state": state})
            t.write_json(os.path.join(runs, "aggregate.json"), {"finished_units": 1})
            args = type("A", (), {"runs": runs, "out": out})
            t.restore_main(args)
            self.assertEqual(sorted(os.listdir(os.path.join(out, "units"))),
                             ["bf16-s1", "timing"])
            with self.assertRaises(SystemExit):  # never over a unit that is there
                t.restore_main(args)


if __name__ == "__main__":
    unittest.main()
