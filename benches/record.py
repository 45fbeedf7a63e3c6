"""Where a bench's results go: ``--output FILE`` writes them as JSON with the machine they
were measured on, for ``benches/plot.py`` and the documentation's benchmarks page."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any, Dict, Optional


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return round(pages / (1 << 30), 1)
    except (ValueError, OSError):
        return 0.0


def machine(compiler: Optional[str] = None) -> Dict[str, Any]:
    """The machine and software a run measured: CPU, cores, memory, OS, Python, the
    package's version and the compiler's identity."""
    import xpu_zebin

    found: Dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "xpu_zebin": xpu_zebin.__version__,
        "gpu": "none (simulated PVC for Level Zero rows)",
    }
    if compiler:
        try:
            found["compiler"] = xpu_zebin._core.compiler_identity(compiler)
        except Exception as e:  # a bench's record never fails on its description
            found["compiler"] = f"{compiler} ({type(e).__name__})"
    return found


def add_output_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", metavar="FILE",
                        help="write the results as JSON, with the machine, to FILE")  # fmt: skip


def write(
    path: Optional[str], bench: str, results: Dict[str, Any], compiler: Optional[str]
) -> None:
    """``results`` of ``bench`` into ``path`` (nothing when None)."""
    if not path:
        return
    record = {
        "bench": bench,
        "date": datetime.date.today().isoformat(),
        "machine": machine(compiler),
        "results": results,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
