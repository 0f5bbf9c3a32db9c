"""Intervals for a study's claims about a new seed that hold when a cell's outcomes split.

A study's "± x" (a Student-t interval of the mean over seeds) and a t prediction interval for a new
seed (mean ± t s sqrt(1 + 1/n)) assume roughly normal per-seed values. Where a cell collapses on some
seeds and not on others, its paired differences are bimodal (or heavily skewed) and a t interval
misses a new seed far more often than 1 in 20 (docs/results/offpolicy/README.md, "A fresh seed").
This module gives the two statements that need no normality:

- `order_prediction`: the distribution-free prediction interval for one new seed. With n exchangeable
  values x_(1) <= ... <= x_(n) and a new one X, P(X < x_(j)) = P(X > x_(n+1-j)) = j/(n+1) exactly
  (continuous outcomes; ties only raise the coverage), so [x_(j), x_(n+1-j)] covers X with probability
  (n+1-2j)/(n+1). Chosen over a bootstrap because that coverage is exact at every n, where the
  percentile bootstrap's interval lies inside [x_(1), x_(n)] and so covers less than (n-1)/(n+1)
  without saying so. The price: a 95% interval needs n >= 39 (j = 1); with 10 seeds the widest
  finite one, [x_(1), x_(10)], is an 81.8% interval (9/11), and that is what 10 seeds can promise.
- `clopper_pearson` (with `split`): the collapse rate k/n with its exact binomial interval, for the
  statement "a new seed collapses with probability p in [lo, hi]", beside the values of the seeds
  that did not collapse.

Pure standard library (no scipy in rloo's dependencies), so study scripts can import it anywhere.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Prediction:
    """[lo, hi] covers one new exchangeable draw with probability `coverage` (exact, not nominal)."""

    lo: float
    hi: float
    coverage: float
    j: int  # the order statistics used: x_(j) and x_(n+1-j), 1-based
    n: int

    def holds(self, x: float) -> bool:
        return self.lo <= x <= self.hi


def order_prediction(xs: list[float], level: float = 0.95) -> Prediction:
    """The narrowest symmetric order-statistic interval whose coverage (n+1-2j)/(n+1) is >= level.

    j = floor((n+1)(1-level)/2); when that is 0 (n < 2/(1-level) - 1: fewer than 39 values at 95%)
    no finite interval reaches `level`, and the widest finite one, j = 1 (the range), is returned with
    its smaller coverage (n-1)/(n+1): the caller must quote `coverage`, not `level`."""
    n = len(xs)
    if n < 2:
        raise ValueError(f"a prediction interval needs at least 2 values, got {n}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    # the small epsilon: (n+1)(1-level)/2 is an integer for n = 39 at 95%, computed as 0.9999...
    j = max(1, math.floor((n + 1) * (1 - level) / 2 + 1e-9))
    s = sorted(xs)
    return Prediction(lo=s[j - 1], hi=s[n - j], coverage=(n + 1 - 2 * j) / (n + 1), j=j, n=n)


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def _bisect(f, lo: float, hi: float) -> float:
    """The root of an increasing f on [lo, hi] to 1e-12 (f(lo) <= 0 <= f(hi))."""
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided binomial interval for a rate seen k times in n: lo solves P(X >= k | lo) = a/2,
    hi solves P(X <= k | hi) = a/2 (a = 1 - level). Its coverage is >= level at every p (conservative),
    where Wilson's dips below it at small n: with 10 seeds that matters."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else _bisect(lambda p: (1 - _binom_cdf(k - 1, n, p)) - a, 0.0, 1.0)
    hi = 1.0 if k == n else _bisect(lambda p: a - _binom_cdf(k, n, p), 0.0, 1.0)
    return lo, hi


@dataclass(frozen=True)
class Split:
    """A cell's seeds split by a collapse rule: the collapse rate with its exact interval, and the
    values (e.g. paired differences) of the seeds that did not collapse."""

    collapsed: int
    n: int
    rate_lo: float
    rate_hi: float
    kept: list[float]


def split(values: list[float], collapsed: list[bool], level: float = 0.95) -> Split:
    """values[i] belongs to a seed that collapsed when collapsed[i]; see `Split`."""
    if len(values) != len(collapsed):
        raise ValueError(f"{len(values)} values but {len(collapsed)} collapse flags")
    k = sum(collapsed)
    lo, hi = clopper_pearson(k, len(values), level)
    return Split(k, len(values), lo, hi, [v for v, c in zip(values, collapsed, strict=True) if not c])


def outside_range_chance(n: int, m: int, k: int) -> float:
    """P(at least k of m new values fall outside the range of n earlier ones), all n + m exchangeable
    and distinct: the test of "the fresh seeds came from what the study's seeds showed". Exact: the
    n earlier values take a uniformly random n-subset of the N = n + m ranks; with its smallest at
    rank a and largest at rank b (0-based), a + (N - 1 - b) new values lie outside, and C(b-a-1, n-2)
    subsets have that smallest and largest."""
    if n < 2 or m < 0 or not 0 <= k <= m:
        raise ValueError(f"need n >= 2, 0 <= k <= m, got n={n}, m={m}, k={k}")
    big = n + m
    hits = sum(math.comb(b - a - 1, n - 2) for a in range(big) for b in range(a + n - 1, big) if a + big - 1 - b >= k)
    return hits / math.comb(big, n)


def main(argv: list[str] | None = None) -> int:
    """`python -m rloo.experiments.intervals X1 X2 ... [--new Y] [--level 0.95]`: the distribution-free
    prediction interval of the committed seeds' values X (a study's paired differences) and, with
    --new, whether a fresh seed's value Y falls inside it (exit 0 either way; 2 on a usage error)."""
    ap = argparse.ArgumentParser(prog="python -m rloo.experiments.intervals", description=main.__doc__)
    ap.add_argument("values", nargs="+", type=float)
    ap.add_argument("--new", type=float, default=None)
    ap.add_argument("--level", type=float, default=0.95)
    a = ap.parse_args(argv)
    try:
        pi = order_prediction(a.values, a.level)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[{pi.lo:+.2f}, {pi.hi:+.2f}]: x_({pi.j}) and x_({pi.n + 1 - pi.j}) of {pi.n} seeds, "
          f"covers a new seed with probability {pi.coverage:.3f}")  # fmt: skip
    if a.new is not None:
        print(f"new seed {a.new:+.2f}: {'inside' if pi.holds(a.new) else 'OUTSIDE'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
