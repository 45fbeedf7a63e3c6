"""Properties of the Python API and the CLI over arbitrary arguments and knob values, and
fault injection (workers killed at random moments): every call returns a result or raises
a classified ``BuildError``; nothing panics, hangs or loses a slot.

Hypothesis runs derandomized with a fixed budget, so CI time stays bounded and a failure
reproduces.
"""

from __future__ import annotations

import os
import random
import signal
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpu_zebin
from xpu_zebin import _core, cli

PROPERTY = settings(
    derandomize=True,
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=24)
numbers = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1e-6, 1e9, 1e9 + 1, -1.0]),
)
ints = st.one_of(st.none(), st.integers(min_value=-(2**70), max_value=2**70), st.just(0))
spirv_inputs = st.sampled_from(["valid", "empty", "cut", "junk"])


# Spill policies: the names the engine takes, and anything else.
policies = st.one_of(
    st.none(),
    st.sampled_from(["upstream", "any", "never", "slots:16", "bytes:1000", "slots:-1", "x"]),
    texts,
)


def _spirv(kind: str, add_spirv: bytes, junk: bytes) -> bytes:
    return {
        "valid": add_spirv,
        "empty": b"",
        "cut": add_spirv[: len(add_spirv) // 2],
        "junk": junk,
    }[kind]


@PROPERTY
@given(
    kind=spirv_inputs,
    junk=st.binary(max_size=64),
    build_flags=st.one_of(
        st.just(""), texts, st.sampled_from(["\0", "-cl-intel-256-GRF-per-thread"])
    ),
    grf_mode=st.one_of(st.sampled_from(["default", "128", "256", "auto"]), texts),
    num_warps=ints,
    kernel_name=st.one_of(st.none(), st.just("add"), texts),
    timeout=numbers,
    spill_policy=policies,
    max_grf_mode=st.one_of(st.none(), st.sampled_from(["128", "256", "512", 512, "96"]), ints),
    speculative=st.one_of(st.none(), st.booleans()),
    cache=st.booleans(),
)
def test_compile_returns_or_raises_a_build_error(add_spirv, system_ocloc, kind, junk, **options):
    try:
        result = xpu_zebin.compile(
            _spirv(kind, add_spirv, junk), device="pvc", ocloc=system_ocloc, **options
        )
    except xpu_zebin.BuildError as e:
        assert e.kind in dict(xpu_zebin.error_kinds()), e
        assert e.kind != "internal_error", e
    else:
        assert result.binary[:4] == b"\x7fELF"


@PROPERTY
@given(
    kind=spirv_inputs,
    junk=st.binary(max_size=64),
    is_spv=st.booleans(),
    build_flags=st.one_of(st.just(""), texts),
    kernel_name=st.one_of(st.just("add"), texts),
    device=st.one_of(st.just(0), st.integers(min_value=-5, max_value=2**40)),
    timeout=numbers,
    spill_policy=policies,
)
def test_compile_and_load_returns_or_raises_a_build_error(add_spirv, kind, junk, **options):
    try:
        with xpu_zebin.compile_and_load(_spirv(kind, add_spirv, junk), cache=False, **options):
            pass
    except xpu_zebin.BuildError as e:
        assert e.kind in dict(xpu_zebin.error_kinds()) and e.kind != "internal_error", e


KNOBS = [
    "XPU_ZEBIN_SPILL_POLICY",
    "XPU_ZEBIN_TIMEOUT",
    "XPU_ZEBIN_CACHE_MAX_BYTES",
    "XPU_ZEBIN_PERSISTENT",
    "XPU_ZEBIN_ISOLATED",
    "XPU_ZEBIN_WORKER_IDLE_SECONDS",
    "XPU_ZEBIN_WORKER_RETRY_SECONDS",
    "XPU_ZEBIN_CORE_WAIT_SECONDS",
    "XPU_ZEBIN_SHARE_BUILDS",
    "XPU_ZEBIN_SPECULATE_AFTER",
]


@PROPERTY
@given(
    name=st.sampled_from(KNOBS),
    value=st.one_of(
        texts.filter(lambda t: "\0" not in t),
        st.sampled_from(["inf", "1e20", "-0", "0", "1", "yes", " 7 ", "1e9"]),
    ),
)
def test_any_knob_value_is_taken_or_named(add_spirv, system_ocloc, name, value):
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        xpu_zebin.compile(add_spirv, device="pvc", ocloc=system_ocloc, cache=False)
        with xpu_zebin.compile_and_load(add_spirv, "add", cache=False):
            pass
    except xpu_zebin.InvalidArgumentError as e:
        assert name in e.message, e.message
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


@PROPERTY
@given(
    timeout=st.one_of(texts, st.sampled_from(["inf", "nan", "-1", "1e20", "0", "3"])),
    grf_mode=st.one_of(texts, st.just("default")),
    flags=st.one_of(texts, st.just("")),
)
def test_the_cli_exits_0_1_or_2_without_a_traceback(
    add_spirv, system_ocloc, tmp_path, capsys, timeout, grf_mode, flags
):
    spv = tmp_path / "k.spv"
    spv.write_bytes(add_spirv)
    argv = ["compile", str(spv), "--device", "pvc", "--ocloc", system_ocloc, "--no-cache"]
    argv += [f"--timeout={timeout}", f"--grf-mode={grf_mode}", f"--build-flags={flags}"]
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    assert code in (0, 1, 2)
    assert "Traceback" not in capsys.readouterr().err


def _kill_workers_at_random(marker, done: threading.Event, seed: int) -> list:
    """Until ``done``: SIGKILL a random process the test started (a starting, building or
    answering worker, a one-shot ocloc) at random moments. Returns what it killed."""
    rng = random.Random(seed)
    killed = []
    while not done.wait(rng.uniform(0.02, 0.4)):
        victims = marker.processes()
        if victims:
            pid, cmd = rng.choice(victims)
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(cmd)
            except ProcessLookupError:
                pass
    return killed


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ocloc", "level_zero"])
def test_workers_killed_at_random_moments_lose_no_slot(
    backend, system_ocloc, add_spirv, spill_spirv, marker
):
    spirvs = [(add_spirv, "add"), (spill_spirv, "spill")] * 6
    done = threading.Event()
    killed: list = []
    killer = threading.Thread(
        target=lambda: killed.extend(_kill_workers_at_random(marker, done, seed=7))
    )
    killer.start()
    try:
        if backend == "ocloc":
            reqs = [
                {
                    "spirv": s,
                    "device": "pvc",
                    "ocloc": system_ocloc,
                    "kernel_name": n,
                    "cache": False,
                }
                for s, n in spirvs
            ]
            results = xpu_zebin.compile_many(reqs, jobs=2)
        else:
            reqs = [{"binary": s, "kernel_name": n, "cache": False} for s, n in spirvs]
            results = xpu_zebin.compile_and_load_many(reqs, jobs=2)
    finally:
        done.set()
        killer.join()
    assert killed, "nothing was killed: the test proved nothing"
    assert len(results) == len(spirvs)
    for r in results:
        if isinstance(r, xpu_zebin.BuildError):
            assert r.kind in ("compiler_crash", "toolchain_missing"), r
        elif backend == "level_zero":
            r.close()
    # The pool recovers: the same batch, undisturbed, builds every kernel. (Three kills in
    # a row at start-up leave a kind off for a while: start afresh.)
    _core.shutdown_workers()
    again = (
        xpu_zebin.compile_many(reqs, jobs=2)
        if backend == "ocloc"
        else xpu_zebin.compile_and_load_many(reqs, jobs=2)
    )
    assert not [r for r in again if isinstance(r, xpu_zebin.BuildError)], again
    for r in again if backend == "level_zero" else ():
        r.close()
