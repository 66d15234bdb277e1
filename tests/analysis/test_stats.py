"""The report's statistics: t and bootstrap intervals, paired differences, the verdict rule."""

import math

import numpy as np
import pytest

from dietpe.analysis import stats
from dietpe.analysis.style import method_styles
from dietpe.methods import METHOD_LISTS
from dietpe.positions.registry import REGISTRY


def test_t_interval_matches_the_textbook_formula():
    e = stats.t_interval([1.0, 2.0, 3.0])
    # mean 2, s = 1, t_{0.975, 2} = 4.3027
    assert e.mean == 2 and e.n == 3
    assert e.low == pytest.approx(2 - 4.302653 / math.sqrt(3), abs=1e-5)
    assert e.high == pytest.approx(2 + 4.302653 / math.sqrt(3), abs=1e-5)
    assert stats.t_interval([5.0, 5.0]).low == 5.0 == stats.t_interval([5.0, 5.0]).high
    one = stats.t_interval([7.0])
    assert one.mean == 7 and math.isnan(one.low) and "no interval" in one.text()


def test_bootstrap_is_a_pure_function_of_its_seed_and_covers_the_mean():
    x = np.random.default_rng(1).normal(3, 1, 30)
    a, b = stats.bootstrap_interval(x, seed=5), stats.bootstrap_interval(x, seed=5)
    assert a == b
    assert a.low < x.mean() < a.high
    assert stats.bootstrap_interval(x, seed=6) != a
    t = stats.t_interval(x)
    assert abs(a.half_width - t.half_width) < 0.3 * t.half_width  # similar widths at n = 30


def test_paired_differences_use_common_seeds_in_order():
    assert stats.paired({0: 3.0, 1: 5.0, 2: 1.0}, {2: 0.5, 0: 1.0}) == [2.0, 0.5]
    assert stats.paired({0: 1.0}, {1: 1.0}) == []


@pytest.mark.parametrize("values,direction,expected", [
    ([1.0, 1.2, 0.9], 1, stats.SUPPORTED),
    ([1.0, 1.2, 0.9], -1, stats.CONTRADICTED),
    ([-1.0, 1.0, 0.1], 1, stats.UNRESOLVED),
    ([-2.0, -2.1, -1.9], -1, stats.SUPPORTED),
    ([3.0], 1, stats.UNRESOLVED),
])
def test_verdict_rule(values, direction, expected):
    assert stats.verdict(stats.t_interval(values), direction) == expected


def test_equivalence_verdict_needs_the_whole_interval_inside_the_margin():
    assert stats.equivalence_verdict(stats.Estimate(1.0, 0.98, 1.02, 3), 0.95, 1.05) == stats.SUPPORTED
    assert stats.equivalence_verdict(stats.Estimate(1.03, 1.00, 1.06, 3), 0.95, 1.05) == stats.UNRESOLVED
    assert stats.equivalence_verdict(stats.Estimate(1.3, 1.2, 1.4, 3), 0.95, 1.05) == stats.CONTRADICTED


def test_every_method_gets_its_own_colour_and_marker():
    names = list(REGISTRY) + [m for lst in METHOD_LISTS.values() for m in lst]
    names = list(dict.fromkeys(names))
    styles = method_styles(names)
    assert len(set(styles.values())) == len(names)
    first20 = [styles[n][0] for n in names[:20]]
    assert len(set(first20)) == len(first20)
    assert method_styles(["a", "b"]) == {n: method_styles(["a", "b", "c"])[n] for n in ("a", "b")}


def test_seeds_needed_is_the_least_n_whose_interval_would_exclude_zero():
    values = [1.0, 3.0, 2.0]  # mean 2, s = 1
    n = stats.seeds_needed(values)
    assert 4.303 / 3 ** 0.5 > 2  # 3 seeds are not enough
    assert n == 4 and stats.t_quantile(0.95, 3) / 2 < 2  # 3.18 / 2 = 1.59 < 2
    assert stats.seeds_needed([1.0, 1.0]) is None and stats.seeds_needed([-1.0, 1.0]) is None
