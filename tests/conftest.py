"""Fixtures: the two real Intel toolchains and SPIR-V generated with them.

Nothing here fakes a compiler. A missing toolchain fails the tests that need it (install
both with ``scripts/install-toolchain.sh``; the README's test command does).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

import xpu_zebin
from xpu_zebin import _core, samples

# The README's test command runs the suite on the installed wheel: prove it is that one.
if os.environ.get("XPU_ZEBIN_EXPECT_INSTALLED"):
    _venv = Path(os.environ["XPU_ZEBIN_EXPECT_INSTALLED"]).resolve()
    if _venv not in Path(xpu_zebin.__file__).resolve().parents:
        raise RuntimeError(f"xpu_zebin imported from {xpu_zebin.__file__}, not from {_venv}")

# Level Zero tests run on Intel's real driver with a simulated PVC device (no GPU here).
# Set before the driver is first opened; only Level Zero reads it.
os.environ.setdefault("XPU_ZEBIN_SIMULATED_DEVICE", "pvc")

MODERN_DEFAULT = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    / "xpu-zebin/toolchain/modern/bin/ocloc"
)


def _system_ocloc() -> str | None:
    return shutil.which("ocloc")


def _modern_ocloc() -> str | None:
    path = os.environ.get("XPU_ZEBIN_MODERN_OCLOC") or str(MODERN_DEFAULT)
    return path if os.access(path, os.X_OK) else None


TOOLCHAINS = {"system": _system_ocloc, "modern": _modern_ocloc}


def require(name: str) -> str:
    path = TOOLCHAINS[name]()
    if path is None:
        pytest.fail(
            f"{name} ocloc not found; run scripts/install-toolchain.sh "
            "(tests never skip a missing compiler)"
        )
    return path


@pytest.fixture(params=sorted(TOOLCHAINS))
def ocloc(request) -> str:
    """Each real ocloc in turn: Debian's (IGC 1.x) and the modern one (IGC 2.x)."""
    return require(request.param)


@pytest.fixture(scope="session")
def system_ocloc() -> str:
    return require("system")


@pytest.fixture(scope="session")
def modern_ocloc() -> str:
    return require("modern")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test gets its own binary cache and temp dir (where the package's private
    directory lives: the record of native binaries that loaded safely), so nothing leaks
    between tests or to ~/.cache."""
    monkeypatch.setenv("XPU_ZEBIN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    # A large-GRF twin by time starts when a build outlasts 0.2 s on an idle core: under
    # a loaded test run, by chance. Tests count compiler runs, workers and notes, so the
    # timing of one is not theirs to depend on: off here, and its own tests
    # (test_host_cores.py) run the default.
    monkeypatch.setenv("XPU_ZEBIN_SPECULATE_AFTER", "off")
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def add_spirv(system_ocloc) -> bytes:
    return xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=system_ocloc)


@pytest.fixture(scope="session")
def spill_spirv(system_ocloc) -> bytes:
    """Spills in default GRF on both compilers, builds cleanly with 256 GRF."""
    source = samples.register_pressure_kernel(300, name="spill")
    return xpu_zebin.opencl_to_spirv(source, device="pvc", ocloc=system_ocloc)


@pytest.fixture(scope="session")
def ptss_spirv(system_ocloc) -> bytes:
    """Overflows PTSS at default GRF on IGC 2.x (the test proves it still does)."""
    source = samples.ptss_overflow_kernel()
    return xpu_zebin.opencl_to_spirv(source, device="pvc", ocloc=system_ocloc)


class Marker:
    """An environment variable inherited by every worker and ocloc a test starts."""

    def __init__(self) -> None:
        self.name = "XPU_ZEBIN_TEST_MARK"
        self.value = uuid.uuid4().hex

    def processes(self) -> list[tuple[int, str]]:
        """(pid, command line) of live processes carrying this mark, this one excluded."""
        needle = f"{self.name}={self.value}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if needle in (proc / "environ").read_bytes():
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    found.append((int(proc.name), cmd))
            except OSError:
                continue
        return found


@pytest.fixture
def marker(monkeypatch):
    """A fresh worker pool, and a mark to find every process the test starts."""
    _core.shutdown_workers()
    mark = Marker()
    monkeypatch.setenv(mark.name, mark.value)
    yield mark
    _core.shutdown_workers()


#: Modules that one pytest worker runs whole (scripts/test.sh runs two): their module
#: fixtures cost seconds, and split across workers they would be made on both.
ONE_WORKER_MODULES = frozenset(
    f"test_{name}.py"
    for name in (
        "dask",  # a local Dask cluster, a Triton kernel
        "upstream_rules",  # band kernels found by compiling
        "multi_host",  # kernels compiled for the hosts
        "file_systems",  # kernels compiled for the mounts
        "bundle_trust",  # a Triton bundle
        "conformance",  # compiled kernels
    )
)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # a hook of xdist: none without it
def pytest_xdist_make_scheduler(config, log):
    """``--dist load`` (scripts/test.sh), with :data:`ONE_WORKER_MODULES` each sent whole
    to one worker, and tests handed out in the order pytest_collection_modifyitems gives.
    xdist's own ``xdist_group`` cannot do this on pytest 9.2: it renames items through
    ``item._nodeid``, which pytest no longer reads."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # Matched by file, whatever the rootdir that nodeids are relative to.
    kept = {Path(__file__).resolve().parent / name for name in ONE_WORKER_MODULES}

    class ModulesKeptWhole(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if (config.rootpath / module).resolve() in kept else nodeid

    if "--loadscope-reorder" not in config.invocation_params.args:
        config.option.loadscopereorder = False  # our order, not the largest group first
    return ModulesKeptWhole(config, log)


def pytest_collection_modifyitems(items) -> None:
    """Tests marked slow first (scripts/test.sh hands tests out a few at a time, in this
    order): the two workers start on the long ones and end on short ones, so neither
    waits at the end for the other's long test. A module of ONE_WORKER_MODULES goes out
    whole, where its first test stands. A stable sort: the order within each kind is
    pytest's."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
