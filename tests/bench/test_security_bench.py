"""The security bench's estimator (``bench.security_bench``): pairs alternated A B B A, and
the sign test's interval of the median of the per-pair ratios."""

from __future__ import annotations

import math
import random

from bench.security_bench import _abba, median_interval


def test_pairs_alternate_which_side_runs_first() -> None:
    assert list(_abba(4)) == [("on", "off"), ("off", "on"), ("on", "off"), ("off", "on")]


def test_the_interval_is_the_sign_test_s_order_statistics() -> None:
    values = [float(v) for v in range(40)]
    random.Random(7).shuffle(values)
    assert median_interval(values) == (13.0, 26.0)  # binomial(40, 1/2): P(X <= 13) = 0.019
    assert median_interval([float(v) for v in range(80)]) == (30.0, 49.0)
    tail = sum(math.comb(40, k) for k in range(14)) / 2**40
    assert tail <= 0.025 < tail + math.comb(40, 14) / 2**40


def test_too_few_values_give_their_whole_range() -> None:
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert median_interval([5.0]) == (5.0, 5.0)


def test_the_interval_covers_the_median_about_as_often_as_it_says() -> None:
    generator = random.Random(11)
    covered = 0
    for _ in range(400):
        sample = [generator.lognormvariate(0.0, 0.5) for _ in range(40)]  # median 1.0
        low, high = median_interval(sample)
        covered += low <= 1.0 <= high
    assert 0.93 <= covered / 400 <= 1.0  # at least 95 % by construction, less by chance
