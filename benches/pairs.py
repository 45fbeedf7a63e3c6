"""Interleaved pairs: a ratio between a baseline and the package that one run can trust.

Timing every baseline run and then every package run lets drift on a shared host (another
job, a CPU's clock, a cache warming) land on one side only. Here the two sides alternate,
baseline then package, then package then baseline, and so on, so drift falls on both; each
pair gives one ratio (baseline seconds / package seconds), and the row's ratio is the median
of the pairs' ratios. Beside it is the range where another run's median should fall, 99
times in 100, if runs differ only by the noise seen between one run's pairs (a prediction
interval, from Student's t on the log ratios): a shift of the host from one run to the
next (the second vCPU busy elsewhere) is not in it. A 95% bootstrap interval of this run's
median, as criterion gives, held another run's median only about 4 times in 5 (simulated,
4 to 32 pairs), where this one holds it 99 in 100.
Rows end on an even number of pairs: with AB, BA, AB, the median would lean to AB's order.
Pairs are added until the interval is within ``tolerance`` of the median on both sides, or
the row's time budget is spent, and the row says which. A claim is made on the interval's
lower bound. A row whose sides move with the process that runs them (where its heap and
libraries landed) is made of pairs in several fresh processes (:func:`pooled`), its
interval from the spread between them.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

#: The interval must lie within this fraction of the median for a row to be settled.
TOLERANCE = 0.05
#: A budget's most: a week (a larger one would never end a row either).
MAX_BUDGET = 7 * 24 * 3600.0
#: What ``bounds`` hold, as records say it (records without it hold a 95% bootstrap
#: interval of the run's own median, which this replaced).
INTERVAL = "99% prediction"
#: Student's t at 0.995 (a two-sided 99% interval) for 1 to 30 degrees of freedom.
_T_995 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169,
          3.106, 3.055, 3.012, 2.977, 2.947, 2.921, 2.898, 2.878, 2.861, 2.845,
          2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763, 2.756, 2.750)  # fmt: skip
#: The normal quantile at 0.995, which t tends to.
_Z_995 = 2.5758
#: A median's standard error over a mean's, for normal samples (sqrt(pi / 2); less for a
#: few samples, so the interval errs wide).
MEDIAN_OVER_MEAN = math.sqrt(math.pi / 2)
#: The widest interval, in log: a factor of e**50 either side of the median (a ratio of
#: 1e-9 s beside 1e6 s must not overflow).
_MOST_LOG = 50.0


@dataclass
class Ratio:
    """One row's verdict: the median of its pairs' ratios and the 99% interval where
    another run's median should fall."""

    median: float
    low: float
    high: float
    pairs: int
    #: The interval is within TOLERANCE of the median (else the budget ended first).
    settled: bool
    baseline_s: List[float] = field(default_factory=list)
    package_s: List[float] = field(default_factory=list)

    def said(self) -> str:
        """The ratio as a table shows it: median, interval, pairs and whether settled."""
        how = "" if self.settled else ", budget spent"
        return f"{self.median:.2f} [{self.low:.2f}-{self.high:.2f}] ({self.pairs} pairs{how})"

    def bounds(self) -> Dict[str, object]:
        """What ``--json`` gives beside the ratio."""
        return {
            "low": round(self.low, 3),
            "high": round(self.high, 3),
            "pairs": self.pairs,
            "settled": self.settled,
            "interval": INTERVAL,
        }


def seconds(text: str) -> float:
    """A time budget (``--budget``): a finite number of seconds, 0 or more (inf would
    never end a row)."""
    value = float(text)
    if not math.isfinite(value) or not 0 <= value <= MAX_BUDGET:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds from 0 to {MAX_BUDGET:.0f}"
        )
    return value


def t_995(df: int) -> float:
    """Student's t at 0.995 for ``df`` degrees of freedom (the table to 30; beyond it the
    Cornish-Fisher expansion, within 0.001 of the table at 30)."""
    if df < 1:
        raise ValueError("t needs 1 degree of freedom or more")
    if df <= len(_T_995):
        return _T_995[df - 1]
    z = _Z_995
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))  # fmt: skip


def interval(ratios: List[float]) -> Tuple[float, float]:
    """Where another run's median of as many pairs should fall, 99 times in 100: the
    median times e to the power of -h and +h, h = t(n-1) * MEDIAN_OVER_MEAN * s * sqrt(2/n),
    s the standard deviation of the log ratios (a difference of two medians: sqrt(2) times
    one's standard error). One ratio has no spread to tell; ratios of 0 or less (a measure
    that is not seconds, as a cost's growth) have no log: their lowest and highest."""
    if not all(math.isfinite(r) for r in ratios):
        raise ValueError(f"pairs: a ratio that is not a finite number: {ratios}")
    median = statistics.median(ratios)
    if len(ratios) == 1:
        return median, median
    if min(ratios) <= 0:
        return min(ratios), max(ratios)
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    half = t_995(n - 1) * MEDIAN_OVER_MEAN * statistics.stdev(logs) * math.sqrt(2 / n)
    half = min(half, _MOST_LOG)
    return median * math.exp(-half), min(median * math.exp(half), sys.float_info.max)


@dataclass(frozen=True)
class Took:
    """What one side measured itself, returned by it instead of being timed from outside
    (a fresh process's own clock: its start and imports are the same on both sides)."""

    seconds: float


def median_of(fn: Callable[[], object], times: int) -> Callable[[], Took]:
    """A side of a few milliseconds as one measure: the median of ``times`` calls (a single
    call's noise, a page fault or a collection, is of its own size)."""

    def one() -> Took:
        return Took(statistics.median(_timed(fn) for _ in range(max(1, times))))

    return one


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    said = fn()
    return said.seconds if isinstance(said, Took) else time.perf_counter() - started


def summarize(
    baseline_s: List[float], package_s: List[float], tolerance: float = TOLERANCE
) -> Ratio:
    """The ratio of paired measures, one pair at a time (each baseline over its package),
    as a :class:`Ratio`: the median, its interval, and whether it is settled. Also for
    measures that are not seconds (a cost at one size over the same cost at another, taken
    in the same round)."""
    if not baseline_s or len(baseline_s) != len(package_s):
        raise ValueError("pairs: one baseline measure for each package measure, at least one")
    if not all(math.isfinite(m) for m in [*baseline_s, *package_s]):
        raise ValueError("pairs: a measure that is not a finite number")
    ratios = [x / max(y, 1e-9) for x, y in zip(baseline_s, package_s)]  # a tick at least
    median = statistics.median(ratios)
    low, high = interval(ratios)
    settled = len(ratios) > 1 and median * (1 - tolerance) <= low <= high <= median * (
        1 + tolerance
    )
    return Ratio(median, low, high, len(ratios), settled, list(baseline_s), list(package_s))


def pooled(processes: List[Tuple[List[float], List[float]]], tolerance: float = TOLERANCE) -> Ratio:
    """One row from pairs made in several fresh processes, each ``(baseline seconds,
    package seconds)``: the median of every pair's ratio, and an interval from the spread
    of the processes' own medians (h = t(k-1) * s * sqrt(2/k) for k processes, s the
    standard deviation of their log medians). A process's state (where its heap and
    libraries landed) can move one side for all of its pairs; pairs from one process would
    hide that, processes show it (pyperf spawns processes for the same reason). One
    process: its pairs' interval (:func:`summarize`)."""
    made = [(b, p) for b, p in processes if b]
    if not made:
        raise ValueError("pairs: no process made a pair")
    baseline_s = [x for b, _ in made for x in b]
    package_s = [y for _, p in made for y in p]
    every = summarize(baseline_s, package_s, tolerance)
    if len(made) == 1:
        return every
    medians = [summarize(b, p, tolerance).median for b, p in made]
    if min(medians) <= 0:
        low, high = min(medians), max(medians)
    else:
        k = len(medians)
        logs = [math.log(m) for m in medians]
        half = min(t_995(k - 1) * statistics.stdev(logs) * math.sqrt(2 / k), _MOST_LOG)
        low = every.median * math.exp(-half)
        high = min(every.median * math.exp(half), sys.float_info.max)
    median = every.median
    settled = median * (1 - tolerance) <= low <= high <= median * (1 + tolerance)
    return Ratio(median, low, high, every.pairs, settled, baseline_s, package_s)


def rounds(
    baseline: Callable[[], object],
    packages: Dict[str, Callable[[], object]],
    floor: int = 3,
    budget_s: float = 120.0,
    tolerance: float = TOLERANCE,
) -> Dict[str, Ratio]:
    """The baseline and each package side once a round, forward one round and backward the
    next (ABC, CBA, ABC, ...), each package's ratio against the same round's baseline. A
    side after the baseline in one round is as far before it in the next, so a drift of
    the host falls on both sides of every ratio alike; a median of rounds in rotated order
    (ABC, BCA, CAB) would keep one slot's drift. An even number of rounds (but for a floor
    of 1), at least ``floor``, then more until every ratio is settled or ``budget_s``
    seconds are spent (0: the floor's). A side that returns :class:`Took` is counted by
    the seconds it says, else timed here."""
    started = time.perf_counter()
    sides = [baseline, *packages.values()]
    took: List[List[float]] = [[] for _ in sides]
    while True:
        order = list(range(len(sides)))
        for i in order if len(took[0]) % 2 == 0 else order[::-1]:
            took[i].append(_timed(sides[i]))
        got = {name: summarize(took[0], took[i], tolerance) for i, name in enumerate(packages, 1)}
        settled = all(r.settled for r in got.values())
        spent = time.perf_counter() - started >= budget_s
        n = len(took[0])
        if n >= max(1, floor) and (n % 2 == 0 or floor <= 1) and (settled or spent):
            return got


def measure(
    baseline: Callable[[], object],
    package: Callable[[], object],
    floor: int = 3,
    budget_s: float = 120.0,
    tolerance: float = TOLERANCE,
) -> Ratio:
    """Alternate ``baseline`` and ``package`` in pairs (AB, BA, AB, ...), an even number of
    them (but for a floor of 1), at least ``floor``, then more until the row is settled or
    ``budget_s`` seconds are spent (:func:`rounds` with one package side)."""
    return rounds(baseline, {"package": package}, floor, budget_s, tolerance)["package"]
