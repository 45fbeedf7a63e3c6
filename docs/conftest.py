"""The pages' examples run as tests (``pytest --markdown-docs docs``, in the README's test
command) against the installed package, the real compilers and the real Level Zero driver
on the simulated PVC. Only what cannot exist on a machine without an Intel GPU stands in:
Triton's active driver (``tests/triton_helpers.CpuDriver``: kernels load through the real
driver, launches are recorded), so that Triton's front end runs on the CPU. Examples write
their files in a temporary directory of their own."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("XPU_ZEBIN_SIMULATED_DEVICE", "pvc")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
WORK = Path(tempfile.mkdtemp(prefix="xpu-zebin-docs-"))
os.chdir(WORK)
os.environ["XPU_ZEBIN_CACHE_DIR"] = str(WORK / "cache")  # never the user's own cache

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton_helpers import CpuDriver, deterministic_bench, triton_on_cpu  # noqa: E402

cpu = CpuDriver()
driver.set_active(cpu)
_on_cpu = triton_on_cpu(str(WORK / "triton-cache"))  # held: its exit would undo it
_on_cpu.__enter__()


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def pytest_markdown_docs_globals() -> dict:
    """What the pages' Triton examples take as given: a ``@triton.jit`` kernel."""
    return {"kernel": add_kernel, "do_bench": deterministic_bench(cpu)}
