#!/usr/bin/env python3
"""Tests of scripts/experiment_fp8_table.py's aggregation: units in, the numbers of the table out
(pairing by seed, units left out, the step-time ratio).

  /usr/bin/python3 scripts/experiment_fp8_table_test.py
"""

import os
import sys
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


if __name__ == "__main__":
    unittest.main()
