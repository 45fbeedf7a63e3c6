"""The site's generated pages (run by mkdocs-gen-files at every build): the environment
and CLI references from the code (``docs_reference.py``), and the benchmarks' latest
results as charts and tables (``benches/plot.py``). Any error fails the build."""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "benches")]

import docs_reference  # noqa: E402
import plot  # noqa: E402

import xpu_zebin  # noqa: E402
from xpu_zebin.cli import build_parser  # noqa: E402

knobs = xpu_zebin._core.knobs()
docs_reference.check(knobs)
with mkdocs_gen_files.open("reference/environment.md", "w") as f:
    f.write(docs_reference.environment_page(knobs))
with mkdocs_gen_files.open("reference/cli.md", "w") as f:
    f.write(docs_reference.cli_page(build_parser()))

page = ["# Latest results", "",
        "Each bench writes its JSON with `--output` (`benches/results/`); `benches/plot.py`",
        "turns them into these charts at every build, and the tables beside them hold the",
        "same numbers. How each is measured: [Benchmarks](../benchmarks.md).", ""]  # fmt: skip
records = plot.load()
for name, (title, figure) in plot.FIGURES.items():
    if name not in records:
        continue
    chart, table = figure(records[name])
    with mkdocs_gen_files.open(f"reference/{name}.svg", "wb") as f:
        f.write(chart)
    page += [f"## {title}", "", plot.machine_line(records[name]), "",
             f"![{name}]({name}.svg)", "", table, ""]  # fmt: skip
with mkdocs_gen_files.open("reference/benchmarks.md", "w") as f:
    f.write("\n".join(page))
