"""Speculation counts the cores of the host, not of one process: a large-GRF twin starts only
on a core no compiler of any process is using (Dask workers on one node, parallel jobs).
Each compile here runs in its own process, as a Dask worker's would."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from typing import Iterator

import pytest
from triton_helpers import MM_SIG, compile_triton, matmul_kernel, triton_on_cpu

TWIN_NOTE = "large-GRF build ran alongside the default one"

COMPILE = """
import json, sys, xpu_zebin
spirv = open(sys.argv[1], "rb").read()
result = xpu_zebin.compile(spirv, device="pvc", ocloc=sys.argv[2], cache=False)
print(json.dumps({"flags": result.build_flags, "notes": result.notes}))
"""


@pytest.fixture(scope="module")
def matmul_path(tmp_path_factory) -> str:
    """Real Triton SPIR-V that spills at default GRF, large enough for automatic speculation."""
    with triton_on_cpu(str(tmp_path_factory.mktemp("triton-cache"))):
        spirv = compile_triton(matmul_kernel, MM_SIG, {"BM": 64, "BN": 64, "BK": 32}).asm["spv"]
    path = tmp_path_factory.mktemp("spirv") / "matmul64.spv"
    path.write_bytes(spirv)
    return str(path)


@contextlib.contextmanager
def every_core_taken(slots_dir) -> Iterator[None]:
    """What compilers running in other processes on every core look like: each slot locked."""
    held = []
    try:
        for i in range(len(os.sched_getaffinity(0))):
            f = open(slots_dir / f"core-{i}", "a")
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(f)
        yield
    finally:
        for f in held:
            f.close()


def compile_elsewhere(spirv_path: str, ocloc: str, slots_dir) -> dict:
    env = {**os.environ, "XPU_ZEBIN_CORE_SLOTS_DIR": str(slots_dir)}
    out = subprocess.run(
        [sys.executable, "-c", COMPILE, spirv_path, ocloc],
        env=env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])


def test_a_twin_waits_for_a_core_no_process_uses(matmul_path, modern_ocloc, tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("speculation needs two cores; this machine has one")
    slots = tmp_path / "slots"
    slots.mkdir()
    with every_core_taken(slots):
        busy_host = compile_elsewhere(matmul_path, modern_ocloc, slots)
    idle_host = compile_elsewhere(matmul_path, modern_ocloc, slots)
    # Same answer either way (the spill retry), but the twin only ran on the idle host.
    assert busy_host["flags"] == idle_host["flags"] == "-cl-intel-256-GRF-per-thread"
    assert not any(TWIN_NOTE in n for n in busy_host["notes"]), busy_host["notes"]
    assert any(TWIN_NOTE in n for n in idle_host["notes"]), idle_host["notes"]


def test_doctor_counts_the_cores_other_processes_use(tmp_path):
    slots = tmp_path / "slots"
    slots.mkdir()
    env = {**os.environ, "XPU_ZEBIN_CORE_SLOTS_DIR": str(slots)}
    cmd = [sys.executable, "-m", "xpu_zebin", "doctor", "--json"]
    idle = json.loads(subprocess.run(cmd, env=env, capture_output=True, check=True).stdout)
    with every_core_taken(slots):
        full = json.loads(subprocess.run(cmd, env=env, capture_output=True, check=True).stdout)
    cores = len(os.sched_getaffinity(0))
    assert idle["core_slots_dir"] == full["core_slots_dir"] == str(slots)
    assert idle["cores"] == cores and idle["cores_busy_on_host"] == 0
    assert full["cores_busy_on_host"] == cores
