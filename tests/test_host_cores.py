"""Speculation counts the cores of the host, not of one process: a large-GRF twin starts only
on a core no compiler of any process is using (Dask workers on one node, parallel jobs).
A twin starts by size (SPIR-V of 32 KiB or more, at once) or by time (once the default build
has run ``XPU_ZEBIN_SPECULATE_AFTER``). Each compile here runs in its own process, as a Dask
worker's would, counting cores in a slots directory of its own (the other test processes'
compilers do not take its cores)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from triton_helpers import MM_SIG, compile_triton, matmul_kernel, triton_on_cpu
from worker_helpers import every_core_taken, first_compiling

import xpu_zebin
from xpu_zebin import samples

TWIN_NOTE = "large-GRF build ran alongside the default one"
#: XPU_ZEBIN_SPECULATE_AFTER's default, seconds (src/ladder.rs).
SPECULATE_AFTER = 0.2

COMPILE = """
import json, sys, xpu_zebin
spirvs = [open(path, "rb").read() for path in sys.argv[2:]]
reqs = [dict(spirv=s, device="pvc", ocloc=sys.argv[1], cache=False) for s in spirvs]
results = xpu_zebin.compile_many(reqs, jobs=1) if len(reqs) > 1 else [xpu_zebin.compile(**reqs[0])]
print(json.dumps([{"flags": r.build_flags, "notes": r.notes,
                   "attempts": [(a.started, a.seconds) for a in r.attempts]} for r in results]))
"""


@pytest.fixture(scope="module")
def matmul_path(tmp_path_factory) -> str:
    """Real Triton SPIR-V that spills at default GRF, large enough for automatic speculation."""
    with triton_on_cpu(str(tmp_path_factory.mktemp("triton-cache"))):
        spirv = compile_triton(matmul_kernel, MM_SIG, {"BM": 64, "BN": 64, "BK": 32}).asm["spv"]
    path = tmp_path_factory.mktemp("spirv") / "matmul64.spv"
    path.write_bytes(spirv)
    return str(path)


def compile_elsewhere(spirv_path, ocloc: str, slots_dir, **env) -> dict:
    """One kernel (a path) compiled in a process of its own; several (a list): one batch,
    one job at a time."""
    paths = [spirv_path] if isinstance(spirv_path, str) else spirv_path
    env = {**os.environ, "XPU_ZEBIN_CORE_SLOTS_DIR": str(slots_dir), **env}
    env.pop("XPU_ZEBIN_SPECULATE_AFTER", None)  # the default (conftest turns it off)
    out = subprocess.run(
        [sys.executable, "-c", COMPILE, ocloc, *paths],
        env=env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    results = json.loads(out.stdout.splitlines()[-1])
    return results[0] if isinstance(spirv_path, str) else results


def overlapped(attempts: list) -> bool:
    """Whether the second attempt started before the first ended (their own times)."""
    (first_start, first_seconds), (second_start, _) = attempts
    return second_start < first_start + first_seconds


@pytest.fixture
def slots(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("speculation needs two cores; this machine has one")
    slots = tmp_path / "slots"
    slots.mkdir()
    return slots


@pytest.fixture(scope="module")
def ptss_path(tmp_path_factory) -> str:
    """The shipped PTSS sample (20 KB of SPIR-V: under the size rule), seconds a GRF mode."""
    path = tmp_path_factory.mktemp("ptss") / "ptss.spv"
    path.write_bytes(xpu_zebin.opencl_to_spirv(samples.ptss_overflow_kernel(), device="pvc"))
    return str(path)


def test_a_long_build_gets_its_twin_by_time(ptss_path, modern_ocloc, slots):
    """The PTSS sample's default build runs past the hedge delay: its large-GRF build
    starts beside it on the idle core, and the two overlap (the attempts' own start and end
    times say so, as the notes do)."""
    got = compile_elsewhere(ptss_path, modern_ocloc, slots)
    assert got["flags"] == "-cl-intel-256-GRF-per-thread"
    assert any(TWIN_NOTE in n for n in got["notes"]), got["notes"]
    assert overlapped(got["attempts"]), got["attempts"]


def test_a_small_kernel_starts_no_twin_and_a_one_job_batch_does(
    ptss_path, modern_ocloc, slots, tmp_path
):
    """A small kernel is built long before the hedge delay; a batch of one job at a time
    leaves the other core idle (its queue never takes it), so its PTSS build gets its twin
    there as a lone compile's does (a full batch keeping freed cores for its queue is
    `batch.rs`'s unit test: it needs as many jobs as cores, all started)."""
    small = tmp_path / "add.spv"
    small.write_bytes(xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc"))
    alone = compile_elsewhere(str(small), modern_ocloc, slots)
    assert len(alone["attempts"]) == 1, alone
    # Built within the delay (80 ms here, IGC starting; a loaded host may take longer, and
    # then a twin may rightly start): no twin was started, so none was cancelled.
    if alone["attempts"][0][1] < SPECULATE_AFTER / 2:  # well within, whatever the overheads
        assert alone["notes"] == [], alone
    ptss, queued = compile_elsewhere([ptss_path, str(small)], modern_ocloc, slots)
    assert ptss["flags"] == "-cl-intel-256-GRF-per-thread"
    assert any(TWIN_NOTE in n for n in ptss["notes"]), ptss["notes"]
    assert overlapped(ptss["attempts"]), ptss["attempts"]
    assert len(queued["attempts"]) == 1, queued


def test_a_twin_waits_for_a_core_no_process_uses(matmul_path, modern_ocloc, slots):
    with every_core_taken(slots):
        busy_host = compile_elsewhere(matmul_path, modern_ocloc, slots)
    idle_host = compile_elsewhere(matmul_path, modern_ocloc, slots)
    # Same answer either way (the spill retry), but the twin only ran on the idle host.
    assert busy_host["flags"] == idle_host["flags"] == "-cl-intel-256-GRF-per-thread"
    assert not any(TWIN_NOTE in n for n in busy_host["notes"]), busy_host["notes"]
    assert any(TWIN_NOTE in n for n in idle_host["notes"]), idle_host["notes"]


def test_a_shared_build_holds_one_core_while_it_compiles(ptss_path, modern_ocloc, slots, tmp_path):
    """A build that shares its kernel (the cache on) takes a core of the host with its
    claim, and its compiler runs in that core: one slot held while IGC compiles, not two
    (no twin here: the hedge is off)."""
    env = {
        **os.environ,
        "XPU_ZEBIN_CORE_SLOTS_DIR": str(slots),
        "XPU_ZEBIN_CACHE_DIR": str(tmp_path / "cache"),
        "XPU_ZEBIN_SPECULATE_AFTER": "off",
    }
    script = "import sys, xpu_zebin; xpu_zebin.compile(open(sys.argv[2], 'rb').read(), " \
             "device='pvc', ocloc=sys.argv[1])"  # fmt: skip
    build = subprocess.Popen([sys.executable, "-c", script, modern_ocloc, ptss_path], env=env)
    try:
        tasks = Path(f"/proc/{build.pid}/task")  # a worker is the child of a thread

        def workers() -> list:
            found = []
            for task in tasks.iterdir():
                try:
                    found += [int(p) for p in (task / "children").read_text().split()]
                except OSError:  # a thread that ended meanwhile
                    pass
            return found

        assert first_compiling(workers) is not None, "no compiler started"
        held = 0
        for i in range(len(os.sched_getaffinity(0))):
            with open(slots / f"core-{i}", "a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    held += 1
        assert held == 1, f"{held} cores held by one build"
    finally:
        assert build.wait(timeout=600) == 0


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
