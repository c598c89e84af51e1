"""The G-test of a sample against an exact law, and the power analysis that sizes samples.

G = 2 * sum(o * ln(o / e)) over cells is asymptotically chi-square with (cells - 1) degrees
of freedom when the law holds, and noncentral chi-square with noncentrality
lambda = 2 * N * KL(true || claimed) when it does not. Cells expected to hold fewer than
``MIN_EXPECTED`` samples are pooled so the chi-square approximation holds. An outcome the law
gives probability zero is conclusive on its own: one observation rejects the law.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

#: Significance level of every statistical check: a correct plugin fails a check with
#: probability at most ALPHA (the seeds are fixed, so a given run is reproducible).
ALPHA = 1e-6
MIN_EXPECTED = 5.0


@dataclass
class Cell:
    key: Any
    observed: int
    expected: float

    @property
    def residual(self) -> float:
        """Standardised residual (o - e) / sqrt(e)."""
        return (
            (self.observed - self.expected) / math.sqrt(self.expected)
            if self.expected > 0
            else math.inf
        )


@dataclass
class GTest:
    statistic: float
    df: int
    p_value: float
    n: int
    cells: list[Cell] = field(default_factory=list)  # after pooling, worst first
    impossible: Any = None  # an observed outcome of probability zero

    def rejects(self, alpha: float = ALPHA) -> bool:
        return self.p_value < alpha

    def worst(self) -> Cell | None:
        return self.cells[0] if self.cells else None

    def describe(self) -> str:
        if self.impossible is not None:
            return (
                f"outcome {self.impossible} was observed but has probability 0 under the exact law"
            )
        text = f"G = {self.statistic:.1f} on {self.df} df, p = {self.p_value:.3g} (N = {self.n})"
        w = self.worst()
        if w is not None:
            text += f"; worst cell {w.key}: observed {w.observed}, expected {w.expected:.1f}"
        return text


def g_test(
    observed: Mapping[Any, int],
    law: Mapping[Any, float],
    min_expected: float = MIN_EXPECTED,
) -> GTest:
    """Test observed counts against an exact law.

    :param observed: outcome -> count.
    :param law: outcome -> probability (normalised here; outcomes missing have probability 0).
    :returns: the test; ``impossible`` is set when an outcome of probability 0 was observed.
    """
    n = sum(observed.values())
    total = sum(v for v in law.values() if v > 0)
    for key, count in observed.items():
        if count > 0 and law.get(key, 0.0) <= 0:
            return GTest(statistic=math.inf, df=0, p_value=0.0, n=n, impossible=key)
    if n == 0:
        return GTest(statistic=0.0, df=0, p_value=1.0, n=0)
    cells = sorted(
        (
            Cell(key, observed.get(key, 0), n * prob / total)
            for key, prob in law.items()
            if prob > 0
        ),
        key=lambda c: c.expected,
    )
    # Pool the smallest cells until the pool itself is large enough.
    pooled: list[Cell] = []
    while cells and cells[0].expected < min_expected:
        pooled.append(cells.pop(0))
    if pooled:
        pool = Cell(
            ("pooled", len(pooled)),
            sum(c.observed for c in pooled),
            sum(c.expected for c in pooled),
        )
        if pool.expected < min_expected and cells:
            first = cells.pop(0)
            pool = Cell(
                ("pooled", len(pooled) + 1),
                pool.observed + first.observed,
                pool.expected + first.expected,
            )
        cells.append(pool)
    g = 2.0 * sum(c.observed * math.log(c.observed / c.expected) for c in cells if c.observed > 0)
    df = len(cells) - 1
    cells.sort(key=lambda c: -abs(c.residual))
    return GTest(statistic=g, df=df, p_value=chi2_sf(g, df), n=n, cells=cells)


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X chi-square with ``df`` degrees of freedom. With df = 0 (a single cell)
    there is nothing to test and the answer is 1."""
    if df <= 0:
        return 1.0
    if x <= 0:
        return 1.0
    a = torch.tensor(df / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(x / 2.0, dtype=torch.float64)))


def chi2_critical(df: int, alpha: float = ALPHA) -> float:
    """The x with P(X > x) = alpha, by bisection."""
    lo, hi = 0.0, float(df) + 10.0
    while chi2_sf(hi, df) > alpha:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if chi2_sf(mid, df) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def power(df: int, noncentrality: float, alpha: float = ALPHA) -> float:
    """P(reject) for a G-test when the truth is noncentral chi-square(df, noncentrality)."""
    crit = chi2_critical(df, alpha)
    noncentrality = max(noncentrality, 0.0)
    mean, sd = df + noncentrality, math.sqrt(2.0 * (df + 2.0 * noncentrality))
    if crit < mean - 12.0 * sd:  # the critical value is far below the bulk: power is 1
        return 1.0
    half = noncentrality / 2.0
    if half == 0:
        return chi2_sf(crit, df)
    # Poisson mixture of central chi-squares: sum_j Pois(j; half) * P(chi2_{df + 2j} > crit).
    total = 0.0
    top = int(half + 12.0 * math.sqrt(half) + 60)
    for j in range(top + 1):
        weight = math.exp(-half + j * math.log(half) - math.lgamma(j + 1))
        total += weight * chi2_sf(crit, df + 2 * j)
    return min(total, 1.0)


def required_samples(kl: float, df: int, alpha: float = ALPHA, target_power: float = 0.999) -> int:
    """Smallest N at which a law ``kl`` nats (KL(true || claimed)) away is rejected with
    probability at least ``target_power``."""
    if kl <= 0:
        raise ValueError("kl must be positive")
    lo, hi = 1, 2
    while power(df, 2.0 * hi * kl, alpha) < target_power:
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if power(df, 2.0 * mid * kl, alpha) >= target_power:
            hi = mid
        else:
            lo = mid + 1
    return lo


def kl_divergence(true: Mapping[Any, float], claimed: Mapping[Any, float]) -> float:
    """KL(true || claimed) in nats; infinite when ``true`` puts mass where ``claimed`` has none."""
    t_total = sum(true.values())
    c_total = sum(claimed.values())
    out = 0.0
    for key, t in true.items():
        if t <= 0:
            continue
        c = claimed.get(key, 0.0)
        if c <= 0:
            return math.inf
        out += (t / t_total) * math.log((t / t_total) / (c / c_total))
    return out


def detection_probability(
    true: Mapping[Any, float],
    claimed: Mapping[Any, float],
    n: int,
    df: int,
    alpha: float = ALPHA,
) -> float:
    """A lower bound on the probability that N samples from ``true`` fail the G-test against
    ``claimed``: through an impossible outcome, or through the statistic."""
    t_total = sum(true.values())
    impossible = sum(t for k, t in true.items() if t > 0 and claimed.get(k, 0.0) <= 0) / t_total
    by_impossible = 1.0 - (1.0 - impossible) ** n
    possible = {k: t for k, t in true.items() if claimed.get(k, 0.0) > 0}
    by_statistic = power(df, 2.0 * n * kl_divergence(possible, claimed), alpha) if possible else 0.0
    return max(by_impossible, by_statistic)
