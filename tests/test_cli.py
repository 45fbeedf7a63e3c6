"""The command line's own checks: arguments argparse rejects before any input is read."""

from __future__ import annotations

import pytest

from xpu_zebin import cli


@pytest.mark.parametrize("command", ["compile", "batch"])
@pytest.mark.parametrize(
    "option",
    [
        *(["--timeout", v] for v in ("inf", "nan", "-1", "1e20", "abc", "1e9.5", "")),
        # argparse reads a value that starts with "-" and is not a number as an option
        *([f"--timeout={v}"] for v in ("-inf", "-nan", "-1e-3")),
    ],
    ids=" ".join,
)
def test_a_timeout_out_of_range_is_a_usage_error(capsys, command, option):
    """Rejected by argparse: exit 2 with the usage and one error line, no traceback, and
    nothing read (the input file does not exist)."""
    value = option[-1].split("=", 1)[-1]
    with pytest.raises(SystemExit) as e:
        cli.main([command, "missing.spv", "--device", "pvc", *option])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert err.rstrip().endswith(line)
    assert "argument --timeout" in line and "0 (no limit) to 1e9" in line, line
    assert repr(value) in line, line


@pytest.mark.parametrize(
    ("value", "seconds"), [("0", 0.0), ("0.5", 0.5), ("30", 30.0), ("1e9", 1e9), (" 2 ", 2.0)]
)
def test_a_timeout_in_range_is_taken(value, seconds):
    argv = ["compile", "k.spv", "--device", "pvc", "--timeout", value]
    assert cli.build_parser().parse_args(argv).timeout == seconds


def test_no_timeout_is_the_default():
    assert cli.build_parser().parse_args(["batch", "k.spv", "--device", "pvc"]).timeout is None


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--vectors", "7"], "--vectors must be 8 to 256"),
        (["--vectors", "257"], "--vectors must be 8 to 256"),
        (["--vectors", "100000000"], "--vectors must be 8 to 256"),
        (["--values", "1"], "--values must be 2 to 8192"),
        (["--values", "8193"], "--values must be 2 to 8192"),
        (["--values", "-5"], "--values must be 2 to 8192"),
    ],
)
def test_the_demo_sample_is_bounded(capsys, option, message):
    """The demo makes its source from a number on the command line: one out of range is a
    usage error before any compiler is looked for (no ocloc named, none needed)."""
    assert cli.main(["demo", "--ocloc", "/nonexistent/ocloc", *option]) == 2
    assert capsys.readouterr().err.strip() == f"xpu-zebin: error: {message}"


@pytest.mark.parametrize(
    "argv",
    [["--vectors", "66", "--values", "100"], ["--timeout", "inf"], ["--timeout", "-1"]],
)
def test_the_demo_refuses_conflicting_or_unbounded_options(argv):
    """One sample at a time, and a timeout the engine takes: argparse's usage error."""
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["demo", *argv])
    assert e.value.code == 2


def test_the_demo_passes_its_timeout_to_the_compiler(capsys, system_ocloc):
    """--timeout bounds each compiler run of the demo's build: the sample takes seconds on
    the real IGC, so a hundredth of one ends it as a classified timeout, exit status 1."""
    assert cli.main(["demo", "--ocloc", system_ocloc, "--timeout", "0.01"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: [timeout] the compiler did not finish within 0.01 s" in out, out
