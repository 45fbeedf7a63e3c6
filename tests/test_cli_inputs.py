"""Every input the command line reads from a path it was given is a regular file, read
bounded (issue 33): a device, a FIFO with no writer, a directory, a file that cannot be
read or is too large is refused at once with one line (a usage error), never a wait, a
traceback or all of memory. ``-`` reads standard input, bounded the same."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap

import pytest

from xpu_zebin import cli

#: Every run here has at most this much address space: an input read without a bound
#: fails at once (``MemoryError``) instead of taking the machine's memory.
MEMORY_LIMIT = 1 << 30
#: A deadline for a run, not a measure: each ends at once, or hangs (on a FIFO).
DEADLINE = 60


def blake3_of(data: bytes) -> str:
    import blake3

    return blake3.blake3(data).hexdigest()


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _run(*args: str, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xpu_zebin", *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        preexec_fn=_limit_memory,
    )


def _refused(run: subprocess.CompletedProcess, *said: str) -> None:
    """A usage error of one line that says each of ``said``; no traceback."""
    assert run.returncode == cli.EXIT_USAGE, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr and run.stdout == "", run.stderr
    [line] = run.stderr.splitlines()
    assert line.startswith("xpu-zebin: error: "), line
    assert all(s in line for s in said), (said, line)


def _sparse(path, size: int):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


COMMANDS = {"compile": ["--device", "pvc", "--no-cache"], "info": []}


def _no_input(tmp_path, kind: str) -> tuple:
    """A path that is no input, of this kind, and what its error says."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "fifo.spv")  # no writer: opening it to read would wait forever
        return str(tmp_path / "fifo.spv"), "is a FIFO, not a regular file"
    if kind == "directory":
        (tmp_path / "dir.spv").mkdir()
        return str(tmp_path / "dir.spv"), "is a directory, not a regular file"
    if kind == "too large":  # over the limit, and over the memory the run has
        return str(_sparse(tmp_path / "huge.spv", (1 << 30) + 1)), f"is larger than {1 << 30} bytes"
    if kind == "missing":
        return str(tmp_path / "missing.spv"), "No such file or directory"
    if kind == "unreadable":  # root reads a file of any mode: a path that cannot be opened
        (tmp_path / "file").write_bytes(b"")
        return str(tmp_path / "file" / "x.spv"), "Not a directory"
    return kind, "is a character device, not a regular file"


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    "kind", ["/dev/zero", "/dev/urandom", "fifo", "directory", "too large", "missing", "unreadable"]
)
def test_what_is_not_a_readable_regular_file_is_refused_at_once(command, kind, tmp_path):
    path, why = _no_input(tmp_path, kind)
    _refused(_run(command, path, *COMMANDS[command]), path, why)


def test_standard_input_is_read_bounded(tmp_path):
    """``-``: a pipe or a file is read; a device is refused; more than the limit is
    refused, from a file at once and from an endless pipe within the memory it has."""
    garbage = subprocess.run(
        [sys.executable, "-m", "xpu_zebin", "compile", "-", "--device", "pvc", "--json"],
        input=b"garbage!",
        capture_output=True,
        timeout=DEADLINE,
        preexec_fn=_limit_memory,
    )
    assert garbage.returncode == cli.EXIT_BUILD_ERROR, garbage.stderr
    error = json.loads(garbage.stdout.splitlines()[-1])["error"]
    assert error["kind"] == "invalid_spirv" and "8 bytes" in error["message"]
    (tmp_path / "k.zebin").write_bytes(b"\x7fELF not really")
    with open(tmp_path / "k.zebin", "rb") as f:
        by_stdin = _run("info", "-", stdin=f)
    by_path = _run("info", str(tmp_path / "k.zebin"))
    assert by_stdin.returncode == by_path.returncode == cli.EXIT_BUILD_ERROR, by_stdin.stderr
    assert by_stdin.stderr.replace("-: ", "", 1) == by_path.stderr.split(": ", 1)[1]
    for command in sorted(COMMANDS):
        with open("/dev/zero", "rb") as zero:
            _refused(_run(command, "-", *COMMANDS[command], stdin=zero), "standard input",
                     "is a character device")  # fmt: skip
        with open(_sparse(tmp_path / "huge", (1 << 30) + 1), "rb") as huge:
            _refused(_run(command, "-", *COMMANDS[command], stdin=huge), "standard input",
                     f"is larger than {1 << 30} bytes")  # fmt: skip
    endless = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        _refused(_run("compile", "-", "--device", "pvc", stdin=endless.stdout), "cannot read -")
    finally:
        endless.kill()
        endless.wait()


BUNDLE_SCRIPT = textwrap.dedent(
    """
    import json, logging, sys
    from pathlib import Path
    import xpu_zebin
    from xpu_zebin.bundle import importing

    bundle = Path(sys.argv[1])
    target = type("T", (), {"id": "t", "any_driver": lambda self: self})()
    importing.targets.local = lambda: target
    asked = []
    xpu_zebin.compile_and_load_many = lambda reqs: asked.extend(reqs) or [
        xpu_zebin.BuildError("not loaded") for _ in reqs]
    logging.basicConfig(format="%(levelname)s %(message)s")
    importing.try_local_entries(bundle)
    print(json.dumps([len(r["binary"]) for r in asked]))
    """
)


def test_an_installed_bundles_entries_are_read_bounded(tmp_path):
    """The entries of an imported bundle tried here: each is read as a regular file of the
    size its manifest lists, at most as large as the engine reads one, and checked; a FIFO,
    a directory, a link to a device or an oversized file in their place is not tried (a
    warning), never waited on."""
    import xpu_zebin
    from xpu_zebin import samples

    spirv = xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc")
    zebin = xpu_zebin.compile(spirv, device="pvc", cache=False).binary
    native = tmp_path / "b" / "native"
    native.mkdir(parents=True)
    entries = []
    for i, name in enumerate(["add", "fifo", "dir", "zero", "huge"]):
        key = f"{i:x}" * 64
        entries.append({"key": key, "kernel": name, "target": "t", "build_flags": "",
                        "spill_bytes": 0, "n_spills": 0, "compiler": "",
                        "file": f"native/{key}.zebin", "blake3": blake3_of(zebin),
                        "size": len(zebin)})  # fmt: skip
    (native / f"{'0' * 64}.zebin").write_bytes(zebin)  # as a bundle of format 1 keeps it
    os.mkfifo(native / f"{'1' * 64}.zebin")
    (native / f"{'2' * 64}.zebin").mkdir()
    (native / f"{'3' * 64}.zebin").symlink_to("/dev/zero")
    _sparse(native / f"{'4' * 64}.zebin", (256 << 20) + 1)
    manifest = {"format": "xpu-zebin-bundle/1", "package": "test", "entries": entries}
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(manifest))
    run = subprocess.run(
        [sys.executable, "-c", BUNDLE_SCRIPT, str(tmp_path / "b")],
        capture_output=True, text=True, timeout=DEADLINE, preexec_fn=_limit_memory,
    )  # fmt: skip
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert json.loads(run.stdout) == [len(zebin)]
    warned = [line for line in run.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warned) == 5, run.stderr  # four not tried, one did not load
    for name in ("fifo", "dir", "zero", "huge"):
        assert any(f" {name} not tried here" in line for line in warned), (name, warned)
