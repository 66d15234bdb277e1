"""Statistics of the study's report: means with 95% intervals over seeds, paired differences and verdicts.

Every function is pure (the bootstrap draws from a generator seeded by its argument), so a report computed
twice from the same runs has the same numbers.

    t_interval(values)                 mean and Student-t interval (the default: it is honest with 3 seeds)
    bootstrap_interval(values, seed)   percentile bootstrap of the mean (an alternative for many seeds)
    paired(a, b)                       per-seed differences a[s] - b[s] over the seeds both have
    verdict(interval, direction)       supported / contradicted / not resolved, by the rule RULE below
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
SUPPORTED, CONTRADICTED, UNRESOLVED = "supported", "contradicted", "not resolved at this budget"
RULE = ("supported when the 95% interval of the difference excludes 0 in the claimed direction, contradicted "
        "when it excludes 0 in the other direction, otherwise not resolved at this budget (so is an interval of "
        "zero width: every seed gave the same difference, and the seed-to-seed spread is not measured)")


@dataclass(frozen=True)
class Estimate:
    """A mean over n values with a two-sided interval [low, high] (NaN bounds when n < 2)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def no_spread(self) -> bool:
        """Every value the same, up to float rounding (80.2 − 80.0 and 70.2 − 70.0 differ in the last bits)."""
        return self.high - self.low <= 1e-9 * max(1.0, abs(self.mean))

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def text(self, digits: int = 3, signed: bool = False) -> str:
        fmt = f"{{:{'+' if signed else ''}.{digits}f}}"
        if self.n < 2 or math.isnan(self.low):
            return fmt.format(self.mean) + f" (n={self.n}, no interval)"
        if self.no_spread:
            return fmt.format(self.mean) + f" (n={self.n}, no spread between seeds)"
        return f"{fmt.format(self.mean)} [{fmt.format(self.low)}, {fmt.format(self.high)}]"


def t_quantile(level: float, df: int) -> float:
    """The two-sided Student-t critical value: P(|T| <= q) = level with df degrees of freedom."""
    from dietpe.extras import need

    t = need("scipy.stats").t
    return float(t.ppf(0.5 + level / 2, df))


def t_interval(values, level: float = LEVEL) -> Estimate:
    """Mean ± t_{df=n-1} · s/√n. One value: its mean, NaN bounds. Identical values: a zero-width interval."""
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        raise ValueError("no values")
    mean = float(x.mean())
    if x.size < 2:
        return Estimate(mean, math.nan, math.nan, int(x.size))
    half = t_quantile(level, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Estimate(mean, mean - half, mean + half, int(x.size))


def bootstrap_interval(values, level: float = LEVEL, resamples: int = 10_000, seed: int = 0) -> Estimate:
    """Percentile bootstrap interval of the mean, from `resamples` resamples drawn with a generator seeded
    by `seed` (a pure function of its arguments)."""
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        raise ValueError("no values")
    if x.size < 2:
        return Estimate(float(x.mean()), math.nan, math.nan, int(x.size))
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(float(x.mean()), float(low), float(high), int(x.size))


def paired(a: dict, b: dict) -> list[float]:
    """Differences a[s] - b[s] for the keys (seeds) both have, in key order: the pairing removes what a seed
    does to both (initialisation of shared weights, data order, masks)."""
    return [float(a[k]) - float(b[k]) for k in sorted(set(a) & set(b))]


def verdict(estimate: Estimate, direction: int) -> str:
    """`direction` +1: the claim says the difference is > 0; -1: < 0. See RULE."""
    if direction not in (1, -1):
        raise ValueError("direction must be +1 or -1")
    if estimate.n < 2 or math.isnan(estimate.low) or estimate.no_spread:
        return UNRESOLVED
    low, high = estimate.low * direction, estimate.high * direction
    low, high = min(low, high), max(low, high)
    if low > 0:
        return SUPPORTED
    if high < 0:
        return CONTRADICTED
    return UNRESOLVED


def equivalence_verdict(estimate: Estimate, low: float, high: float) -> str:
    """For claims of 'no difference': supported when the whole interval lies inside [low, high] (the stated
    margin), contradicted when it lies wholly outside, otherwise not resolved."""
    if estimate.n < 2 or math.isnan(estimate.low) or estimate.no_spread:
        return UNRESOLVED
    if low <= estimate.low and estimate.high <= high:
        return SUPPORTED
    if estimate.low > high or estimate.high < low:
        return CONTRADICTED
    return UNRESOLVED


def seeds_needed(values, level: float = LEVEL, limit: int = 1000) -> int | None:
    """How many seeds an interval would need to exclude 0, if the mean difference and the seed-to-seed
    standard deviation stayed what `values` show: the least n with t_{n-1} · s / √n < |mean|. None when the
    values show no spread or no effect, or above `limit`. An estimate for planning, not a test."""
    x = np.asarray(list(values), dtype=float)
    if x.size < 2:
        return None
    mean, sd = abs(float(x.mean())), float(x.std(ddof=1))
    if sd == 0 or mean == 0:
        return None
    for n in range(2, limit + 1):
        if t_quantile(level, n - 1) * sd / math.sqrt(n) < mean:
            return n
    return None
