"""One options type for every entry point: its defaults, its checks, and the knobs and
arguments that choose GRF and spill rules."""

from __future__ import annotations

import pickle
import stat

import pytest

import xpu_zebin
from xpu_zebin import Options, build_options, samples

G256 = "-cl-intel-256-GRF-per-thread"


def test_defaults_live_in_one_place_and_options_round_trip():
    o = Options()
    assert (o.build_flags, o.grf_mode, o.cache, o.spill_policy) == ("", "default", True, None)
    changed = o.replace(num_warps=8, timeout=2, spill_policy="slots:16", ocloc="/usr/bin/ocloc")
    assert changed != o and changed.num_warps == 8 and changed.timeout == 2.0
    assert pickle.loads(pickle.dumps(changed)) == changed
    assert Options(**changed.as_dict()) == changed
    assert len({o, Options(), changed}) == 2  # hashable by value


@pytest.mark.parametrize(
    "name, value",
    [
        ("num_warps", True), ("num_warps", -1), ("num_warps", 2**40), ("cache", 1),
        ("max_grf_mode", "96"), ("max_grf_mode", "+256"), ("max_grf_mode", 256.0),
        ("timeout", float("nan")), ("spill_policy", "slots:+5"), ("spill_policy", "most"),
        ("ocloc", ""), ("cache_dir", b""), ("cache_dir", "/tmp/a\0b"), ("grf_mode", "huge"),
        ("spill_threshold", 100),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_by_name(name, value):
    with pytest.raises(xpu_zebin.InvalidArgumentError) as e:
        Options(**{name: value})
    assert name in str(e.value)
    if name == "spill_threshold":  # says what replaced it
        assert "spill_policy" in str(e.value)


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="unknown option 'colour'"):
        Options(colour="red")


def test_blank_spill_policy_is_unset_and_spacing_is_forgiven():
    assert Options(spill_policy="  ").spill_policy is None
    assert Options(spill_policy=" Slots : 16 ").spill_policy == " Slots : 16 "


def test_conflicting_kernel_names_are_refused(add_spirv):
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="differs"):
        xpu_zebin.compile_and_load(add_spirv, "add", options=Options(kernel_name="other"))


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, (None, None)), ("256", (None, "256")), (" 512 ", (None, "512")), (128, (None, 128)),
        ("cri", ("cri", None)), ("pvc", ("pvc", None)), ("unknown", (None, None)),
        ("arl_h", ("arl_h", None)), ("", (None, None)),
    ],
)  # fmt: skip
def test_load_binary_seventh_argument_in_both_meanings(value, expected):
    assert build_options.seventh_argument(value) == expected


@pytest.mark.parametrize("value", [True, 256.0, b"512", "256.0", "../x"])
def test_load_binary_seventh_argument_that_is_neither_is_refused(value):
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="7th argument"):
        build_options.seventh_argument(value)


@pytest.mark.parametrize("setting", ["", "upstream", " UPSTREAM "])
def test_drop_ins_keep_their_paths_rule_under_the_default_policy(setting, monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_SPILL_POLICY", setting)
    assert build_options.spill_policy(build_options.LOAD_BINARY_RULE) == "upstream:load_binary"
    monkeypatch.setenv("XPU_ZEBIN_SPILL_POLICY", "any")
    # the engine applies the variable
    assert build_options.spill_policy(build_options.LOAD_BINARY_RULE) is None


def test_spill_policy_knob_is_checked_before_anything_runs(add_spirv, monkeypatch):
    monkeypatch.setenv("XPU_ZEBIN_SPILL_POLICY", "most")
    for call in (
        lambda: xpu_zebin.compile(add_spirv, device="pvc", cache=False),
        lambda: xpu_zebin.compile_and_load(add_spirv, "add", cache=False),
    ):
        with pytest.raises(xpu_zebin.InvalidArgumentError, match="XPU_ZEBIN_SPILL_POLICY"):
            call()


@pytest.mark.slow
def test_an_answer_shaped_by_a_timeout_is_not_cached(system_ocloc, tmp_path):
    """The real compiler behind a wrapper that stalls the large-GRF attempt past the
    deadline: the first build is returned, not cached, so the next call without the
    deadline gets the input's own answer."""
    stall = tmp_path / "stall"
    stall.touch()
    slow = tmp_path / "ocloc"
    slow.write_text(
        f'#!/bin/sh\ncase "$*" in *256-GRF*) [ -e {stall} ] && sleep 120;; esac\n'
        f'exec {system_ocloc} "$@"\n'
    )
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    spirv = xpu_zebin.opencl_to_spirv(
        samples.register_pressure_kernel(300, name="spill"), device="pvc", ocloc=system_ocloc
    )
    opts = Options(ocloc=slow, cache_dir=tmp_path / "cache", speculative=False)
    stalled = xpu_zebin.compile(spirv, device="pvc", options=opts, timeout=8)
    assert stalled.build_flags == "" and stalled.attempts[1].error.kind == "timeout"
    assert any("not cached" in n for n in stalled.notes)
    stall.unlink()  # the same compiler, now answering in time: the same cache key
    again = xpu_zebin.compile(spirv, device="pvc", options=opts)
    assert not again.cached and again.build_flags == G256
