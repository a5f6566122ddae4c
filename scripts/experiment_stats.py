#!/usr/bin/env python3
"""Small-sample statistics for the experiment reports (scripts/experiment*.py), standard library only.

The reports compare precision setups over a handful of paired seeds and mismatch metrics over a few
hundred sequences, so they need exact small-sample tools, not normal approximations:

  mean_ci(xs)            mean and the 95% Student-t confidence interval (n - 1 degrees of freedom)
  paired_compare(a, b)   a[i] - b[i] over pairs (same seed): mean difference, its t interval, the
                         two-sided paired t-test p-value and the exact sign-flip permutation p-value
                         (all 2^n sign patterns for n <= 16, else a seeded Monte Carlo; no
                         normality assumption)
  ratio_ci(num, den)     a ratio of sums (a token-weighted mean over sequences: num = per-sequence
                         sum, den = per-sequence token count) with a percentile bootstrap interval
                         that resamples whole sequences (tokens of one sequence are not independent)

The Student-t distribution is computed here from the regularized incomplete beta function
(continued fraction, modified Lentz), since the experiment machine has no SciPy;
scripts/experiment_stats_test.py checks it against tabulated values.
"""

import math
import random

_EPS = 1e-15
_TINY = 1e-300


def _betacf(a, b, x):
    """Continued fraction of the incomplete beta function I_x(a, b) (modified Lentz)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((a + m2 - 1.0) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return h


def betainc(a, b, x):
    """Regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t, df):
    """P(T <= t) for Student's t with df degrees of freedom."""
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def t_ppf(q, df):
    """The q-quantile of Student's t (bisection on t_cdf; |error| < 1e-10)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"t_ppf: q must be in (0, 1), got {q}")
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def _finite(xs):
    return [float(x) for x in xs if x is not None and math.isfinite(x)]


def mean_ci(xs, level=0.95):
    """{"n", "mean", "sd", "lo", "hi", "half"}: the Student-t interval of the mean. n < 2 gives
    an interval of nan (one value says nothing about the spread); n == 0 a mean of nan."""
    xs = _finite(xs)
    n = len(xs)
    nan = float("nan")
    if n == 0:
        return {"n": 0, "mean": nan, "sd": nan, "lo": nan, "hi": nan, "half": nan}
    m = sum(xs) / n
    if n < 2:
        return {"n": 1, "mean": m, "sd": nan, "lo": nan, "hi": nan, "half": nan}
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    half = t_ppf(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "sd": sd, "lo": m - half, "hi": m + half, "half": half}


def sign_flip_p(diffs, max_exact=16, draws=20000, seed=12345):
    """Two-sided p-value of the paired sign-flip permutation test of mean(diffs) == 0: the share of
    the 2^n sign patterns whose |sum| is >= the observed |sum|. Exact (all patterns) for
    n <= max_exact; above, `draws` random patterns with a fixed seed, counting the observed one
    ((k + 1) / (draws + 1), a valid p-value)."""
    diffs = _finite(diffs)
    n = len(diffs)
    if n == 0:
        return float("nan")
    observed = abs(sum(diffs))
    # Tolerance for float sums that are equal in exact arithmetic (ties count as extreme).
    tol = 1e-12 * max(1.0, sum(abs(d) for d in diffs))
    if n <= max_exact:
        extreme = 0
        for mask in range(1 << n):
            s = sum(-d if (mask >> i) & 1 else d for i, d in enumerate(diffs))
            if abs(s) >= observed - tol:
                extreme += 1
        return extreme / (1 << n)
    rng = random.Random(seed)
    extreme = 0
    for _ in range(draws):
        s = sum(d if rng.random() < 0.5 else -d for d in diffs)
        if abs(s) >= observed - tol:
            extreme += 1
    return (extreme + 1) / (draws + 1)


def paired_compare(a, b, level=0.95):
    """Paired comparison of a against b (a[i] and b[i] from the same seed). Pairs with a missing
    side are dropped. Returns {"n", "mean_diff", "lo", "hi", "t", "p_t", "p_sign_flip"}."""
    pairs = [(x, y) for x, y in zip(a, b)
             if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]
    diffs = [x - y for x, y in pairs]
    ci = mean_ci(diffs, level)
    out = {"n": ci["n"], "mean_diff": ci["mean"], "lo": ci["lo"], "hi": ci["hi"],
           "t": float("nan"), "p_t": float("nan"), "p_sign_flip": float("nan")}
    if ci["n"] >= 2:
        se = ci["sd"] / math.sqrt(ci["n"])
        if se > 0:
            out["t"] = ci["mean"] / se
            out["p_t"] = 2.0 * (1.0 - t_cdf(abs(out["t"]), ci["n"] - 1))
        else:
            out["t"] = 0.0 if ci["mean"] == 0 else math.copysign(math.inf, ci["mean"])
            out["p_t"] = 1.0 if ci["mean"] == 0 else 0.0
        out["p_sign_flip"] = sign_flip_p(diffs)
    return out


def ratio_ci(num, den, level=0.95, resamples=2000, seed=12345):
    """sum(num) / sum(den) with a percentile bootstrap interval over the pairs (num[i], den[i])
    (whole sequences). Returns {"n", "value", "lo", "hi"}; deterministic for a given seed."""
    pairs = [(float(x), float(y)) for x, y in zip(num, den) if y > 0 and math.isfinite(x)]
    n = len(pairs)
    nan = float("nan")
    if n == 0:
        return {"n": 0, "value": nan, "lo": nan, "hi": nan}
    value = sum(x for x, _ in pairs) / sum(y for _, y in pairs)
    if n < 2:
        return {"n": n, "value": value, "lo": nan, "hi": nan}
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        sx = sy = 0.0
        for _ in range(n):
            x, y = pairs[rng.randrange(n)]
            sx += x
            sy += y
        stats.append(sx / sy)
    stats.sort()
    alpha = (1.0 - level) / 2.0
    lo = stats[int(math.floor(alpha * (resamples - 1)))]
    hi = stats[int(math.ceil((1.0 - alpha) * (resamples - 1)))]
    return {"n": n, "value": value, "lo": lo, "hi": hi}


def fmt_ci(ci, digits=3):
    """'m [lo, hi]' for mean_ci / ratio_ci results; 'n/a' without a value."""
    m = ci.get("mean", ci.get("value"))
    if m is None or not math.isfinite(m):
        return "n/a"
    if not math.isfinite(ci["lo"]):
        return f"{m:.{digits}f} (n={ci['n']}, no CI)"
    return f"{m:.{digits}f} [{ci['lo']:.{digits}f}, {ci['hi']:.{digits}f}]"
