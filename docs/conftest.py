"""The pages' examples run as tests (``pytest --markdown-docs docs``, which
``tests/test_docs.py`` runs in the README's test command) against the installed package,
the real compilers and the real Level Zero driver on the simulated PVC. Only what cannot
exist on a machine without an Intel GPU stands in: Triton's active driver
(``tests/triton_helpers.CpuDriver``: kernels load through the real driver, launches are
recorded), so that Triton's front end runs on the CPU. The examples write their files,
caches and the package's private directory in a temporary directory of their own, removed
at exit, and never reach a store, bundle, policy or drop-in setting of the user's."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

#: What the examples may take from the environment: the compiler to use.
KEPT = ("XPU_ZEBIN_OCLOC",)
for name in [n for n in os.environ if n.startswith(("XPU_ZEBIN_", "TRITON_")) and n not in KEPT]:
    del os.environ[name]
os.environ["XPU_ZEBIN_SIMULATED_DEVICE"] = "pvc"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
WORK = Path(tempfile.mkdtemp(prefix="xpu-zebin-docs-"))
atexit.register(shutil.rmtree, WORK, ignore_errors=True)
os.chdir(WORK)
os.environ["XPU_ZEBIN_CACHE_DIR"] = str(WORK / "cache")
os.environ["TMPDIR"] = str(WORK)  # the package's private directory is the examples' own
tempfile.tempdir = None

from triton.runtime.driver import driver  # noqa: E402
from triton_helpers import CpuDriver, add_kernel, deterministic_bench, triton_on_cpu  # noqa: E402

cpu = CpuDriver()
driver.set_active(cpu)
_on_cpu = triton_on_cpu(str(WORK / "triton-cache"))  # held: its exit would undo it
_on_cpu.__enter__()


def pytest_markdown_docs_globals() -> dict:
    """What the pages' Triton examples take as given: a ``@triton.jit`` kernel that adds
    ``x`` and ``y`` into ``out`` (``tests/triton_helpers.add_kernel``)."""
    return {"kernel": add_kernel, "do_bench": deterministic_bench(cpu)}
