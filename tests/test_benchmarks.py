"""The benchmark script runs from a clean checkout and reports every ratio it promises.
No timing is asserted here: the numbers belong to the benchmark, not to a test."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parent.parent / "benches" / "compare.py"
sys.path.insert(0, str(BENCH.parent))
import plot  # noqa: E402  (benches/plot.py: the JSON a bench writes, drawn for the docs)

# Each runs a benchmark script end to end (on its smallest input).
pytestmark = pytest.mark.slow


def _drawn(results_dir: Path, bench: str) -> dict:
    """The bench's ``--output`` record, with the machine, as the docs draw it."""
    record = plot.load(results_dir)[bench]
    assert record["machine"]["cores"] and record["machine"]["compiler"]
    chart, table = plot.FIGURES[bench][1](record)
    assert chart.startswith(b"<?xml") and b"<svg" in chart and table.count("\n") >= 2
    return record


#: benches/compare.py's row groups, each a test of its own (they run in parallel), with
#: the keys each must report.
COMPARE_GROUPS = {
    "offline": ("fallback_speedup", "batch_speedup", "small_kernel_speedup",
                "warm_cache_speedup"),
    "dask": ("dask_batch_speedup", "dask_overhead_percent"),
    "level-zero": ("ze_warm_load_speedup", "ze_native_load_speedup", "ze_fallback_speedup",
                   "ze_batch_speedup", "ze_isolation_overhead_percent"),
    "sweep,memory": ("sweep_speedup", "sweep_baseline_split_s", "peak_rss_mb"),
}  # fmt: skip


def test_compare_groups_are_every_row():
    """The groups the tests run are all of the script's, once each; the default is every
    group but dask, which --dask adds; a group it does not know is a usage error."""
    import compare

    named = [g for groups in COMPARE_GROUPS for g in groups.split(",")]
    assert sorted(named) == sorted(compare.ROW_GROUPS)
    every = list(compare.ROW_GROUPS)
    assert compare.selected_rows(None, False) == [g for g in every if g != "dask"]
    assert compare.selected_rows(None, True) == every
    assert compare.selected_rows(("sweep",), True) == ["dask", "sweep"]
    assert compare.selected_rows(compare.row_groups(" memory,offline ,"), False) == [
        "offline", "memory"]  # fmt: skip
    for bad in ("", ",", "offline,gpu", "all"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected some of"):
            compare.row_groups(bad)


@pytest.mark.parametrize("rows", sorted(COMPARE_GROUPS))
def test_compare_script_reports_ratios(modern_ocloc, tmp_path, rows):
    """benches/compare.py on its smallest input, a group of rows at a time: every row and
    ratio it promises, and none of another group's."""
    run = subprocess.run(
        [sys.executable, str(BENCH), "--ocloc", modern_ocloc, "--smallest", "--json",
         "--rows", rows, "--output", str(tmp_path / "out" / "compare.json")],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["row_groups"] == rows.split(",")
    others = {k for g, keys in COMPARE_GROUPS.items() if g != rows for k in keys}
    assert others.isdisjoint(report), others & set(report)
    for key in COMPARE_GROUPS[rows]:
        if key.endswith("_speedup"):
            assert report[key] > 0, key
            assert report["bounds"][key]["pairs"] == 1, key
        else:
            assert key in report, key
    if "peak_rss_mb" in report:
        assert report["peak_rss_mb"]["baseline_ocloc"] > 0
        assert report["peak_rss_mb"]["package_workers"] > 0
    if rows == "offline":
        assert "| PTSS kernel, needs large GRF" in run.stdout
    rows_drawn = _drawn(tmp_path / "out", "compare")["results"]["rows"]
    printed = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    assert len(rows_drawn) == len(printed) - 1  # every printed row (less the header) is recorded


def test_fleet_script_reports_ratios(system_ocloc, tmp_path):
    """benches/fleet.py on its smallest input (one kernel, one pair), a real Redis: every
    key it promises, and no tampered entry loaded (that one is a count, not a timing)."""
    fleet = BENCH.parent / "fleet.py"
    run = subprocess.run(
        [sys.executable, str(fleet), "--ocloc", system_ocloc, "--kernels", "1", "--json",
         "--repeat", "1", "--budget", "0", "--output", str(tmp_path / "out" / "fleet.json")],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    for key in ("fleet_speedup", "triton_fleet_speedup", "vs_triton_remote",
                "local_hit_store_ratio"):  # fmt: skip
        assert report[key] > 0, key
        # Interleaved pairs: one, as asked, so its interval is that pair's ratio (the
        # report rounds to 2 decimals): a bound taken from another row or pair fails here.
        bounds = report["bounds"][key]
        assert bounds["pairs"] == 1, key
        assert bounds["low"] == pytest.approx(report[key], abs=0.011), key
        assert bounds["high"] == pytest.approx(report[key], abs=0.011), key
    assert report["b_sources"] == {"remote": 1} and report["tampered_loaded"] == 0
    assert _drawn(tmp_path / "out", "fleet")["results"] == report


def test_lean_script_reports_sizes_and_the_hit_cost(system_ocloc, tmp_path):
    """benches/lean.py on its smallest input (the samples and one Triton kernel, the
    floor's pairs): every kernel's bytes on disk and uncompressed, and the hit's cost."""
    run = subprocess.run(
        [sys.executable, str(BENCH.parent / "lean.py"), "--ocloc", system_ocloc, "--kernels",
         "1", "--budget", "0", "--json", "--output", str(tmp_path / "out" / "lean.json")],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert _drawn(tmp_path / "out", "lean")["results"] == report
    assert [r["triton"] for r in report["rows"]] == [False, False, True]
    assert all(r["stored_bytes"] < r["uncompressed_bytes"] for r in report["rows"])
    assert report["hit_cost_bounds"]["pairs"] >= 2 and report["hit_cost_ratio"] > 0


def test_ranks_script_reports_builds_and_ratios(system_ocloc, tmp_path):
    """benches/ranks.py on its smallest input (one Triton kernel, one and two ranks, one
    pair; the autotune shape, an autotuner's first call per rank, is the bench's own, as
    ``benches/autotune.py``'s child is tested there): shared, every run builds the kernel
    once; every ratio with its interval."""
    ranks = BENCH.parent / "ranks.py"
    run = subprocess.run(
        [sys.executable, str(ranks), "--ocloc", system_ocloc, "--ranks", "1,2", "--kernels", "1",
         "--pairs", "1", "--shapes", "sequence,batch", "--json", "--output",
         str(tmp_path / "out" / "ranks.json")],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(run.stdout)["rows"]
    assert _drawn(tmp_path / "out", "ranks")["results"]["rows"] == rows
    assert [(r["shape"], r["ranks"]) for r in rows] == [
        ("sequence", 1),
        ("sequence", 2),
        ("batch", 1),
        ("batch", 2),
    ]
    for r in rows:
        assert r["builds"] == [1], r
        assert r["builds_unshared"] and min(r["builds_unshared"]) >= 1, r
        for key in ("ranks_speedup", "cpu_ratio"):
            assert r[key] > 0 and r[f"{key}_bounds"]["pairs"] == 1, (key, r)
        assert r["vs_alone"] > 0, r


def _holds_its_median(report: dict, key: str, pairs: int) -> None:
    """The ratio ``key`` (rounded to 2 places) with its interval (3 places) and pairs."""
    bounds = report["bounds"][key]
    assert bounds["pairs"] == pairs, key
    assert math.isfinite(report[key]), key
    assert bounds["interval"] == "99% prediction", key  # the record says which interval
    assert bounds["low"] - 0.006 <= report[key] <= bounds["high"] + 0.006, key


def test_bundle_scale_script_reports_ratios(system_ocloc, tmp_path):
    """benches/bundle_scale.py at small sizes: a signed bundle imported (Triton's entries
    too) and looked up, every ratio it promises, the chart drawn."""
    run = subprocess.run(
        [sys.executable, str(BENCH.parent / "bundle_scale.py"), "--ocloc", system_ocloc,
         "--sizes", "40,120", "--lookups", "20", "--rounds", "2", "--json",
         "--output", str(tmp_path / "out" / "bundle.json")],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    for key in ("import_ratio", "import_memory_ratio", "index_ratio", "lookup_ratio"):
        assert key in report, key
    # A lookup's ratio is made of both rounds. At these sizes a cost per entry above the
    # ten-entry bundle's is within the noise: a round where the reference's is not above
    # 0 gives no pair.
    assert report["rounds"] == 2
    _holds_its_median(report, "lookup_ratio", pairs=2)
    assert report["lookup_ratio"] > 0
    for key in ("import_ratio", "import_memory_ratio", "index_ratio", "index_memory_ratio"):
        if report[key] is not None:  # its sign is the noise's too
            _holds_its_median(report, key, report["bounds"][key]["pairs"])
            assert report["bounds"][key]["pairs"] in (1, 2)
        else:
            assert key not in report["bounds"]
    # Triton's entries are imported too where Triton is installed (a test dependency on
    # x86-64 Linux with CPython 3.11).
    triton = importlib.util.find_spec("triton") is not None
    assert report["per_entry"]["120"]["import_s"] > 0
    assert report["per_entry"]["120"]["triton"] == triton
    assert _drawn(tmp_path / "out", "bundle_scale")["results"] == report


def test_scale_script_reports_ratios(system_ocloc, tmp_path):
    """benches/scale.py at small sizes: every key it promises, the bound held, the chart
    drawn; its entries are real ones (the nodes' stats count them all)."""
    scale = BENCH.parent / "scale.py"
    run = subprocess.run(
        [sys.executable, str(scale), "--ocloc", system_ocloc, "--sizes", "0,300", "--ops", "2",
         "--adopts", "4", "--rounds", "2", "--json",
         "--output", str(tmp_path / "out" / "scale.json")],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    for key in ("write_ratio", "hit_ratio", "adopt_ratio", "evict_ratio", "evict_stall_ratio",
                "lost_ledger_ratio", "lost_ledger_pair_ratio", "peak_rss_mib"):  # fmt: skip
        assert report[key] > 0, key
    for key in ("write_ratio", "hit_ratio", "adopt_ratio"):  # a pair a round
        _holds_its_median(report, key, pairs=2)
    assert report["file_system"] != "unknown"
    # Each node's cleaning held the bound, and removed older entries than its own.
    assert report["held"] and report["lru_kept"] and report["ms"]["300"]["evicted"] > 0
    node = report["ms"]["300"]
    assert 0.85 * node["max_bytes"] <= node["bytes"] <= node["max_bytes"]  # a tenth cleaned
    assert _drawn(tmp_path / "out", "scale")["results"] == report


def test_pairs_alternate_sides_and_stop_at_the_floor_when_the_budget_is_spent():
    """benches/pairs.py: baseline and package alternate (AB, BA, AB), one ratio a pair, and
    a budget of 0 makes exactly the floor's pairs; the interval holds the median."""
    import pairs

    order: list = []
    ratio = pairs.measure(lambda: order.append("b"), lambda: order.append("p"), 3, 0.0)
    assert order == ["b", "p", "p", "b", "b", "p", "p", "b"]  # an even number of pairs
    assert ratio.pairs == 4 and len(ratio.baseline_s) == len(ratio.package_s) == 4
    order.clear()
    pairs.measure(lambda: order.append("b"), lambda: order.append("p"), 1, 0.0)
    assert order == ["b", "p"]  # a floor of 1 (a script's smallest run): one pair
    order.clear()
    took = pairs.median_of(lambda: order.append("fast"), 5)()  # a fast side: one measure
    assert order == ["fast"] * 5 and isinstance(took, pairs.Took) and took.seconds >= 0
    assert ratio.low <= ratio.median <= ratio.high
    assert pairs.interval([2.0, 2.0, 2.0]) == (2.0, 2.0)
    low, high = pairs.interval([1.0, 3.0, 2.0])
    assert low < 2.0 < high and low * high == pytest.approx(4.0)  # even in log space


def test_rounds_go_forward_and_back_and_pair_each_side_with_its_rounds_baseline(monkeypatch):
    """benches/pairs.py's rounds: the baseline and two sides forward, then backward (ABC,
    CBA), each side's ratio against the same round's baseline, an even number of rounds;
    a settled row stops there, an unsettled one goes on until its budget is spent."""
    import pairs

    order: list = []
    seconds = {"b": [6.0] * 8, "x": [3.0] * 8, "y": [1.0, 2.0, 3.0, 6.0] * 2}

    def side(name: str):  # a side's n-th run takes its n-th seconds
        return lambda: order.append(name) or pairs.Took(seconds[name][order.count(name) - 1])

    got = pairs.rounds(side("b"), {"x": side("x"), "y": side("y")}, floor=3, budget_s=0.0)
    assert order == ["b", "x", "y", "y", "x", "b"] * 2
    assert got["x"].median == 2.0 and got["x"].settled and got["x"].pairs == 4
    assert got["y"].median == 2.5 and not got["y"].settled  # ratios 6, 3, 2, 1
    assert got["y"].baseline_s == [6.0] * 4 and got["y"].package_s == [1.0, 2.0, 3.0, 6.0]
    # Drift on the host (each measure 5% slower than the one before): equal sides come
    # out equal but for the drift's second order (the side three slots from the baseline
    # at 1.011); a rotated order would leave 5-15% on each.
    clock = iter(1.05**i for i in range(1000))
    same = {name: lambda: pairs.Took(next(clock)) for name in ("x", "y", "z")}
    for ratio in pairs.rounds(lambda: pairs.Took(next(clock)), same, 4, 0.0).values():
        assert ratio.median == pytest.approx(1.0, abs=0.012)
    # A budget: an unsettled row goes on, an even number of rounds, until it is spent
    # (a clock a second on at each reading here).
    ticks = iter(range(10**6))
    monkeypatch.setattr(pairs.time, "perf_counter", lambda: float(next(ticks)))
    order.clear()
    seconds["y"] = [1.0, 2.0, 3.0, 6.0] * 100
    seconds["b"] = seconds["x"] = [6.0] * 400
    got = pairs.rounds(side("b"), {"x": side("x"), "y": side("y")}, floor=3, budget_s=40.0)
    assert got["y"].pairs > 4 and got["y"].pairs % 2 == 0 and not got["y"].settled
    with pytest.raises(ValueError, match="one baseline measure for each"):
        pairs.summarize([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        pairs.summarize([], [])
    for silly in ("inf", "nan", "-1", "1e308"):
        with pytest.raises(argparse.ArgumentTypeError):
            pairs.seconds(silly)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-6, 1e6), st.floats(0.0, 1e6)), min_size=1, max_size=30))
def test_a_ratio_s_interval_holds_its_median(measures):
    """Any paired measures (a package side of 0 s included): a finite median inside its
    interval, one ratio a pair."""
    import pairs

    ratio = pairs.summarize([b for b, _ in measures], [p for _, p in measures])
    assert ratio.pairs == len(measures)
    assert math.isfinite(ratio.median) and ratio.low <= ratio.median <= ratio.high
    assert not (len(measures) == 1 and ratio.settled)


def test_a_ratio_s_interval_holds_another_run_s_median_99_times_in_100():
    """The interval is where another run's median of as many pairs falls: simulated runs
    (log-normal pair ratios, 10% noise, some with outliers) hold the next run's median at
    least 97 times in 100 from 4 pairs to 32 (99 to 100 in 100 here), and it is not wider
    than that asks; t is the table's, then tends to the normal's."""
    import pairs

    pick = random.Random(7)

    def run(n: int, outliers: bool) -> list:
        noise = [pick.gauss(0, 0.1) + (pick.choice((-0.5, 0.5)) if outliers and pick.random()
                 < 0.1 else 0.0) for _ in range(n)]  # fmt: skip
        return [2.0 * math.exp(e) for e in noise]

    widths: dict = {}
    for n in (4, 8, 16, 32):
        for outliers in (False, True):
            held, widths[n, outliers] = 0, []
            for _ in range(300):
                ratios = run(n, outliers)
                low, high = pairs.interval(ratios)
                held += low <= statistics.median(run(n, outliers)) <= high
                widths[n, outliers].append(high / statistics.median(ratios) - 1)
            assert held >= 0.97 * 300, (n, outliers, held)
    # 32 pairs of 10% noise: h = 2.744 * 1.2533 * 0.1 * sqrt(2 / 32), about +9%.
    assert 0.07 <= statistics.median(widths[32, False]) <= 0.11
    assert pairs.t_995(3) == 5.841 and pairs.t_995(30) == pytest.approx(2.750, abs=1e-3)
    assert pairs.t_995(31) == pytest.approx(2.744, abs=1e-3)  # the expansion from here
    assert pairs.t_995(120) == pytest.approx(2.617, abs=1e-3)
    ts = [pairs.t_995(df) for df in range(1, 200)]
    assert ts == sorted(ts, reverse=True) and ts[-1] > 2.5758
    with pytest.raises(ValueError):
        pairs.t_995(0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.floats(1e-6, 1e6), st.floats(0.0, 1e6)), min_size=1, max_size=8),
        min_size=1, max_size=8,
    )
)  # fmt: skip
def test_pooled_processes_hold_their_median(processes):
    """Pairs from any fresh processes: every pair counted, a finite median inside its
    interval; one process is its pairs' own ratio."""
    import pairs

    made = [([b for b, _ in pp], [p for _, p in pp]) for pp in processes]
    ratio = pairs.pooled(made)
    assert ratio.pairs == sum(len(pp) for pp in processes)
    assert math.isfinite(ratio.median) and ratio.low <= ratio.median <= ratio.high
    if len(made) == 1:
        assert ratio == pairs.summarize(*made[0])
    with pytest.raises(ValueError):
        pairs.pooled([([], [])])


def test_pooled_interval_holds_another_run_when_each_process_shifts_its_pairs():
    """Runs where each process moves all of its pairs alike (8% between processes, 2%
    within, as the isolation row measured): the interval from six processes holds another
    run's median at least 97 times in 100; one process's 180 pairs would not (the shift is
    not in their spread)."""
    import pairs

    pick = random.Random(11)

    def process(n: int) -> tuple:
        shift = pick.gauss(0, 0.08)
        return [1.1 * math.exp(shift + pick.gauss(0, 0.02)) for _ in range(n)], [1.0] * n

    held_pooled = held_one = 0
    for _ in range(300):
        ratio = pairs.pooled([process(30) for _ in range(6)])
        again = pairs.pooled([process(30) for _ in range(6)]).median
        held_pooled += ratio.low <= again <= ratio.high
        one = pairs.summarize(*process(180))
        held_one += one.low <= pairs.summarize(*process(180)).median <= one.high
    assert held_pooled >= 0.97 * 300, held_pooled
    assert held_one < 0.5 * 300, held_one


def test_a_ratio_of_zero_or_less_has_its_lowest_and_highest_and_a_nan_is_refused():
    """Measures that are not seconds (a cost's growth) can make a ratio of 0 or less, which
    has no log: the interval is the ratios' lowest and highest, never a zero width that
    would settle a row; a measure that is not a finite number is an error, not a row."""
    import pairs

    zero = pairs.summarize([0.0, 0.0, 5.0, 0.0], [1.0] * 4)
    assert (zero.median, zero.low, zero.high, zero.settled) == (0.0, 0.0, 5.0, False)
    assert pairs.interval([-2.0, -2.1, -1.9, -2.05]) == (-2.1, -1.9)
    assert pairs.interval([7.0]) == (7.0, 7.0)
    huge = pairs.interval([1e-12, 1e15])  # capped at e**50 either side: no overflow
    assert 0 < huge[0] < huge[1] < math.inf
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="finite"):
            pairs.summarize([1.0, bad], [1.0, 1.0])
        with pytest.raises(ValueError, match="finite"):
            pairs.interval([1.0, bad])
