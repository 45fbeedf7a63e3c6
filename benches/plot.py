"""The benchmarks' JSON (``--output`` of each bench, kept in ``benches/results/``) as charts
(SVG, matplotlib) and tables, for the documentation's benchmarks page.

    python benches/plot.py [RESULTS_DIR] [--out DIR]   # writes DIR/<bench>.svg
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
from pathlib import Path
from typing import Callable, Dict, List, Tuple

HERE = Path(__file__).resolve().parent


def load(results_dir: Path = HERE / "results") -> Dict[str, dict]:
    """Every bench's latest record in ``results_dir``, by the bench it names."""
    records = (json.loads(p.read_text()) for p in sorted(Path(results_dir).glob("*.json")))
    return {r["bench"]: r for r in records}


def _svg(fig) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    return out.getvalue()


def _bars(title: str, xlabel: str, labels: List[str], series: List[Tuple[str, List[float]]],
          log: bool = False, parity: bool = False) -> bytes:  # fmt: skip
    """Horizontal bars, one group per label, one bar per series."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "xpu-zebin"  # the same SVG for the same data
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 1.0 + 0.45 * len(labels) * max(1, len(series))))
    height = 0.8 / len(series)
    for i, (name, values) in enumerate(series):
        ys = [j + i * height for j in range(len(labels))]
        ax.barh(ys, values, height=height, label=name)
        for y, v in zip(ys, values):
            text = f"{v:.0f}" if v >= 100 else f"{v:.3g}"
            ax.annotate(text, (v, y), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=8)  # fmt: skip
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(labels))], labels)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    if parity:
        ax.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.set_xlim(right=ax.get_xlim()[1] * (4 if log else 1.15))  # room for the labels
    if len(series) > 1:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=len(series), fontsize=8)
    fig.tight_layout()
    svg = _svg(fig)
    plt.close(fig)
    return svg


def _spread(seconds: List[float]) -> str:
    return f"{statistics.median(seconds):.3f} [{min(seconds):.3f}-{max(seconds):.3f}]"


def _ratio(x: dict, key: str) -> str:
    """A ratio with its interval and pairs, where the bench measured them."""
    b = x.get("bounds", {}).get(key)
    if not isinstance(b, dict) or x[key] is None:
        return str(x[key])
    return f"{x[key]} [{b['low']:.2f}-{b['high']:.2f}, {b['pairs']} pairs, {_kind(b)}]"


def _kind(bounds: dict) -> str:
    """Which interval a record holds: older ones, without the word, a 95% bootstrap one."""
    return str(bounds.get("interval", "95% bootstrap"))


def _compare(r: dict) -> Tuple[bytes, str]:
    rows = r["results"]["rows"]
    labels = [row["label"] for row in rows]
    ratios = [row["ratio"] for row in rows]
    chart = _bars("xpu-zebin against upstream's way (higher is better)", "speedup (log scale)",
                  labels, [("speedup", ratios)], log=True, parity=True)  # fmt: skip
    table = ["| case | baseline, median [min-max] s | xpu-zebin, median [min-max] s | ratio "
             "| interval (pairs, kind) |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for row, ratio in zip(rows, ratios):
        b, p = (_spread(row["baseline_s"]), _spread(row["package_s"]))
        spread = "-"
        if "low" in row:
            spread = f"{row['low']:.2f}-{row['high']:.2f} ({row['pairs']}, {_kind(row)})"
        table.append(f"| {row['label']} | {b} | {p} | {ratio:.1f} | {spread} |")
    return chart, "\n".join(table)


def _fleet(r: dict) -> Tuple[bytes, str]:
    x = r["results"]
    chart = _bars("A fresh node's time for the model's kernels (lower is better)", "seconds (log)",
                  ["compile from scratch", "from the signed store"],
                  [("seconds", [x["b_scratch_s"], x["b_remote_s"]])], log=True)  # fmt: skip
    table = ["| measure | value |", "| --- | --- |",
             f"| kernel-config pairs | {x['kernels']} |",
             f"| node B from scratch / from the store "
             f"| {x['b_scratch_s']} s / {x['b_remote_s']} s |",
             f"| `fleet_speedup` (target: at least 150) | {_ratio(x, 'fleet_speedup')} |",
             *([f"| bytes node B pulled (uncompressed) | {x['b_pulled_bytes']:,} "
                f"({x['b_pulled_uncompressed_bytes']:,}) |"] if "b_pulled_bytes" in x else []),
             f"| `triton_fleet_speedup` (Triton's front end skipped) "
             f"| {_ratio(x, 'triton_fleet_speedup')} |",
             f"| `vs_triton_remote` (against Triton's own Redis cache; target: at most 1.0) "
             f"| {_ratio(x, 'vs_triton_remote')} |",
             f"| `tampered_loaded` (must be 0) | {x['tampered_loaded']} |"]  # fmt: skip
    return chart, "\n".join(table)


def _scale(r: dict) -> Tuple[bytes, str]:
    x = r["results"]
    sizes = [str(s) for s in x["sizes"]]
    kinds = [k for k in ("write", "hit", "adopt", "evict") if k in x["ms"][sizes[0]]]
    chart = _bars("The cache's cost per operation as it grows (lower is better)", "ms (log)",
                  [f"{int(s):,} entries" for s in sizes],
                  [(k, [x["ms"][s][k] for s in sizes]) for k in kinds], log=True)  # fmt: skip
    table = ["| entries | " + " | ".join(f"{k} (ms)" for k in kinds)
             + " | evicted | peak RSS (MiB) |", "| --- " * (len(kinds) + 3) + "|"]  # fmt: skip
    table += [f"| {int(s):,} | " + " | ".join(str(x["ms"][s][k]) for k in kinds)
              + f" | {x['ms'][s].get('evicted', '')} | {x['ms'][s]['rss_mib']} |"
              for s in sizes]  # fmt: skip
    table += ["", "| ratio, largest over empty (evict: over the first size evicting 1,000) "
              "(target: at most 1.25) | value |", "| --- | --- |"]  # fmt: skip
    table += [f"| `{k}_ratio` | {_ratio(x, f'{k}_ratio')} |" for k in kinds if f"{k}_ratio" in x]
    if "evict_stall_ratio" in x:
        stalls = ", ".join(f"{int(s):,}: {x['ms'][s]['evict_stall']} ms" for s in sizes)
        table += [f"| the most one write paid for a cleaning ({stalls}) | "
                  f"`evict_stall_ratio` {x['evict_stall_ratio']} |"]  # fmt: skip
    if "lost_ledger_ratio" in x:
        table += [f"| the slowest compile while a lost ledger is rebuilt, over the slowest with "
                  f"it (pairs' median: {x['lost_ledger_pair_ratio']}) | "
                  f"`lost_ledger_ratio` {x['lost_ledger_ratio']} |"]  # fmt: skip
    table += [f"| size against its bound | {x['size_bytes']:,} of {x['bound_bytes']:,} bytes "
              f"(held: {x['held']}) |"]  # fmt: skip
    if "lru_kept" in x:
        table += [f"| the entries used last kept by every cleaning | {x['lru_kept']} |"]
    return chart, "\n".join(table)


def _cold_start(r: dict) -> Tuple[bytes, str]:
    x = r["results"]
    labels = ["load every kernel: JIT / bundle"]
    series = [("upstream's way", [x["jit_load_s"]]), ("xpu-zebin", [x["bundle_load_s"]])]
    if "model_start_jit_s" in x and "model_start_bundle_s" in x:
        labels.append("model start: nothing / after bundle import")
        series[0][1].append(x["model_start_jit_s"])
        series[1][1].append(x["model_start_bundle_s"])
    chart = _bars("A cold start on a new node (lower is better)", "seconds (log)", labels, series,
                  log=True)  # fmt: skip
    table = ["| measure | value |", "| --- | --- |"]
    table += [f"| `{k}` | {_ratio(x, k)} |" for k, v in sorted(x.items())
              if not isinstance(v, (dict, list))]  # fmt: skip
    return chart, "\n".join(table)


def _autotune(r: dict) -> Tuple[bytes, str]:
    x = r["results"]
    runs = [(k[: -len("_seconds")], v) for k, v in x.items()
            if k.endswith("_seconds") and isinstance(v, (int, float))]  # fmt: skip
    chart = _bars("An autotuner's first call (lower is better)", "seconds",
                  [k for k, _ in runs], [("seconds", [v for _, v in runs])])  # fmt: skip
    table = ["| measure | value |", "| --- | --- |"]
    table += [f"| `{k}` | {_ratio(x, k)} |" if k in x.get("bounds", {})
              else f"| `{k}` | {v:.3f} |" if isinstance(v, float) else f"| `{k}` | {v} |"
              for k, v in sorted(x.items()) if not isinstance(v, (dict, list))]  # fmt: skip
    return chart, "\n".join(table)


def _ranks(r: dict) -> Tuple[bytes, str]:
    rows = r["results"]["rows"]
    labels = [f"{x['shape']}, {x['ranks']} ranks" for x in rows]
    chart = _bars("N ranks on a cold cache: sharing builds (off / on, higher is better)",
                  "ratio", labels, [("wall time", [x["ranks_speedup"] for x in rows]),
                                    ("CPU", [x["cpu_ratio"] for x in rows])],
                  parity=True)  # fmt: skip

    def said(x: dict, key: str) -> str:
        b = x[f"{key}_bounds"]
        return f"{x[key]:.2f} [{b['low']:.2f}-{b['high']:.2f}]"

    table = [
        "| shape | ranks | builds (shared / not) | wall off/on | CPU off/on | shared "
        "wall / one rank's |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    table += [f"| {x['shape']} | {x['ranks']} | {x['builds']} / {x['builds_unshared']} | "
              f"{said(x, 'ranks_speedup')} | {said(x, 'cpu_ratio')} | {x['vs_alone']:.2f} |"
              for x in rows]  # fmt: skip
    return chart, "\n".join(table)


def _lean(r: dict) -> Tuple[bytes, str]:
    x = r["results"]
    rows = x["rows"]
    chart = _bars("Entries compressed: stored / uncompressed bytes (higher is better)", "ratio",
                  [row["kernel"][:40] for row in rows],
                  [("smaller on disk", [row["ratio"] for row in rows])])  # fmt: skip
    table = ["| kernel | uncompressed | on disk | ratio |", "| --- | --- | --- | --- |"]
    table += [f"| {row['kernel']} | {row['uncompressed_bytes']:,} | {row['stored_bytes']:,} | "
              f"{row['ratio']:.2f} |" for row in rows]  # fmt: skip
    b, us = x["hit_cost_bounds"], x["hit_microseconds"]
    table += ["", "| measure | value |", "| --- | --- |",
              f"| Triton kernels together, smaller on disk (goal 3.5) | {x['triton_ratio']:.2f} |",
              f"| a warm hit, compressed / uncompressed (goal 1.25) | {x['hit_cost_ratio']:.2f} "
              f"[{b['low']:.2f}-{b['high']:.2f}] ({us['compressed']:.0f} / "
              f"{us['uncompressed']:.0f} us) |"]  # fmt: skip
    return chart, "\n".join(table)


def _bundle_scale(r: dict) -> Tuple[bytes, str]:
    x = r["results"]
    sizes = [str(s) for s in x["sizes"]]
    kinds = ("import_ms", "index_ms", "lookup_ms")
    chart = _bars("A bundle's cost per entry as it grows (lower is better)", "ms (log)",
                  [f"{int(s):,} entries" for s in sizes],
                  [(k, [max(x["per_entry"][s][k], 1e-6) for s in sizes]) for k in kinds],
                  log=True)  # fmt: skip
    columns = ("import_ms", "import_kib", "index_ms", "index_kib", "lookup_ms", "import_s")
    table = ["| entries | " + " | ".join(columns) + " |", "| --- " * (len(columns) + 1) + "|"]
    table += [f"| {int(s):,} | " + " | ".join(str(x["per_entry"][s][c]) for c in columns) + " |"
              for s in sizes]  # fmt: skip
    table += ["", f"| ratio, largest over {x.get('reference', sizes[0])} entries (target: at "
              "most 1.25) | value |", "| --- | --- |"]  # fmt: skip
    table += [f"| `{k}` | {_ratio(x, k)} |" for k in sorted(x) if k.endswith("_ratio")]
    return chart, "\n".join(table)


#: Each bench's chart and table, and the page's words for it.
FIGURES: Dict[str, Tuple[str, Callable[[dict], Tuple[bytes, str]]]] = {
    "compare": ("Against upstream's way: `benches/compare.py`", _compare),
    "fleet": ("A fleet through a real Redis: `benches/fleet.py`", _fleet),
    "cold_start": ("Cold start on a new node: `benches/cold_start.py`", _cold_start),
    "autotune": ("Autotuning at full width: `benches/autotune.py`", _autotune),
    "scale": ("The cache at a million entries: `benches/scale.py`", _scale),
    "scale_xfs": ("The same on XFS: `benches/scale.py --xfs`", _scale),
    "bundle_scale": ("A bundle of 100,000 entries: `benches/bundle_scale.py`", _bundle_scale),
    "ranks": ("One build per kernel for N ranks: `benches/ranks.py`", _ranks),
    "lean": ("Lean entries: `benches/lean.py`", _lean),
}


def machine_line(record: dict) -> str:
    m = record.get("machine", {})
    return (f"Measured {record.get('date', '?')} on {m.get('cpu', '?')}, {m.get('cores', '?')} "
            f"cores, {m.get('memory_gib', '?')} GiB, {m.get('os', '?')}, Python "
            f"{m.get('python', '?')}, xpu-zebin {m.get('xpu_zebin', '?')}; GPU: "
            f"{m.get('gpu', '?')}; compiler: `{m.get('compiler', '?')}`.")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", default=str(HERE / "results"))
    p.add_argument("--out", default=".")
    args = p.parse_args()
    for name, record in load(Path(args.results)).items():
        if name in FIGURES:
            chart, _ = FIGURES[name][1](record)
            (Path(args.out) / f"{name}.svg").write_bytes(chart)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
