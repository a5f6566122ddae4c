#!/usr/bin/env python3
"""Tests of scripts/experiment_stats.py on inputs with known answers (tabulated Student-t
quantiles, hand-computed intervals, enumerable permutation p-values).

  /usr/bin/python3 scripts/experiment_stats_test.py
"""

import math
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import experiment_stats as st  # noqa: E402


class StudentT(unittest.TestCase):
    def test_quantiles_match_tables(self):
        # t_{0.975, df} from standard tables (6+ significant digits).
        for df, want in [(1, 12.706205), (2, 4.302653), (4, 2.776445), (9, 2.262157),
                         (30, 2.042272), (1000, 1.962339)]:
            self.assertAlmostEqual(st.t_ppf(0.975, df), want, places=5, msg=f"df={df}")
        self.assertAlmostEqual(st.t_ppf(0.995, 4), 4.604095, places=5)
        self.assertAlmostEqual(st.t_ppf(0.025, 4), -2.776445, places=5)

    def test_cdf(self):
        self.assertAlmostEqual(st.t_cdf(0.0, 7), 0.5, places=12)
        # Two-sided p of t = 2 with 10 df is 0.0733880.
        self.assertAlmostEqual(2 * (1 - st.t_cdf(2.0, 10)), 0.0733880, places=6)
        # df = 1 is the Cauchy distribution: P(T <= 1) = 3/4.
        self.assertAlmostEqual(st.t_cdf(1.0, 1), 0.75, places=10)
        self.assertAlmostEqual(st.t_cdf(-1.0, 1), 0.25, places=10)

    def test_betainc_symmetry(self):
        for a, b, x in [(2.5, 0.5, 0.3), (0.5, 7.0, 0.9), (3.0, 3.0, 0.5)]:
            self.assertAlmostEqual(st.betainc(a, b, x) + st.betainc(b, a, 1 - x), 1.0, places=12)
        # I_x(1, 1) = x.
        self.assertAlmostEqual(st.betainc(1.0, 1.0, 0.37), 0.37, places=12)


class MeanCi(unittest.TestCase):
    def test_known_interval(self):
        ci = st.mean_ci([1, 2, 3, 4, 5])
        self.assertEqual(ci["n"], 5)
        self.assertAlmostEqual(ci["mean"], 3.0)
        self.assertAlmostEqual(ci["sd"], math.sqrt(2.5))
        half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
        self.assertAlmostEqual(ci["half"], half, places=5)
        self.assertAlmostEqual(ci["lo"], 3.0 - half, places=5)

    def test_degenerate(self):
        self.assertEqual(st.mean_ci([])["n"], 0)
        one = st.mean_ci([0.4])
        self.assertEqual(one["mean"], 0.4)
        self.assertTrue(math.isnan(one["lo"]))
        # None and nan (a run without the metric) are left out.
        self.assertEqual(st.mean_ci([1.0, None, float("nan"), 3.0])["n"], 2)

    def test_coverage_near_nominal(self):
        rng = random.Random(7)
        trials, covered = 3000, 0
        for _ in range(trials):
            ci = st.mean_ci([rng.gauss(0.5, 0.1) for _ in range(5)])
            covered += ci["lo"] <= 0.5 <= ci["hi"]
        # 95% nominal; the binomial sd of the estimate is 0.004.
        self.assertAlmostEqual(covered / trials, 0.95, delta=0.015)


class Paired(unittest.TestCase):
    def test_sign_flip_enumeration(self):
        # All five differences positive: only the all-plus and all-minus patterns reach |15|.
        self.assertAlmostEqual(st.sign_flip_p([1, 2, 3, 4, 5]), 2 / 32)
        # Sum 0: every pattern is at least as extreme.
        self.assertAlmostEqual(st.sign_flip_p([1, -1]), 1.0)
        # [3, 1, 1]: |sums| 5, 3, 3, 1 (each twice) -> 2 of 8 reach 5.
        self.assertAlmostEqual(st.sign_flip_p([3, 1, 1]), 2 / 8)
        # Ties count: [1, 1] -> sums 2, 0, 0, -2 -> 2 of 4.
        self.assertAlmostEqual(st.sign_flip_p([1, 1]), 0.5)

    def test_sign_flip_monte_carlo(self):
        # 30 positive differences: the exact p is 2 / 2^30; the Monte Carlo estimate is its floor
        # 1 / (draws + 1).
        self.assertAlmostEqual(st.sign_flip_p([1.0] * 30, draws=2000), 1 / 2001)
        # Symmetric differences: p near 1, and the same value on every call (fixed seed).
        d = [(-1) ** i * (1 + i % 3) for i in range(24)]
        p = st.sign_flip_p(d, draws=2000)
        self.assertGreater(p, 0.9)
        self.assertEqual(p, st.sign_flip_p(d, draws=2000))

    def test_paired_t(self):
        a = [0.61, 0.58, 0.64, 0.60, 0.62]
        b = [0.60, 0.55, 0.60, 0.59, 0.58]
        r = st.paired_compare(a, b)
        d = [x - y for x, y in zip(a, b)]
        m = sum(d) / 5
        sd = math.sqrt(sum((x - m) ** 2 for x in d) / 4)
        t = m / (sd / math.sqrt(5))
        self.assertEqual(r["n"], 5)
        self.assertAlmostEqual(r["mean_diff"], m, places=12)
        self.assertAlmostEqual(r["t"], t, places=9)
        self.assertAlmostEqual(r["p_t"], 2 * (1 - st.t_cdf(t, 4)), places=12)
        self.assertAlmostEqual(r["lo"], m - 2.776445 * sd / math.sqrt(5), places=5)
        self.assertAlmostEqual(r["p_sign_flip"], 2 / 32)  # all five differences positive

    def test_pairs_with_a_missing_side_are_dropped(self):
        r = st.paired_compare([1.0, None, 3.0, 2.0], [0.0, 1.0, 1.0, None])
        self.assertEqual(r["n"], 2)
        self.assertAlmostEqual(r["mean_diff"], 1.5)

    def test_zero_variance(self):
        r = st.paired_compare([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
        self.assertEqual(r["p_t"], 1.0)
        r = st.paired_compare([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
        self.assertEqual(r["p_t"], 0.0)
        self.assertAlmostEqual(r["p_sign_flip"], 2 / 8)


class RatioCi(unittest.TestCase):
    def test_constant_ratio(self):
        r = st.ratio_ci([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
        self.assertAlmostEqual(r["value"], 2.0)
        self.assertAlmostEqual(r["lo"], 2.0)
        self.assertAlmostEqual(r["hi"], 2.0)

    def test_token_weighted_and_covers(self):
        rng = random.Random(3)
        den = [rng.randint(10, 200) for _ in range(200)]
        num = [d * (1.01 + rng.gauss(0, 0.005)) for d in den]
        r = st.ratio_ci(num, den, resamples=500)
        self.assertAlmostEqual(r["value"], sum(num) / sum(den), places=12)
        self.assertLess(r["lo"], r["value"])
        self.assertGreater(r["hi"], r["value"])
        self.assertLess(r["hi"] - r["lo"], 0.01)
        self.assertEqual(r, st.ratio_ci(num, den, resamples=500))  # deterministic


if __name__ == "__main__":
    unittest.main()
