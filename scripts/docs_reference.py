"""The documentation's reference pages, made from the code so that they cannot drift: every
environment variable from the engine's one table (``_core.knobs()``, ``src/knobs/table.rs``),
the CLI from its parser. A variable the code reads that the table does not describe, or
describes with nothing, is an :class:`Undocumented` error: the site's build fails on it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional

ROOT = Path(__file__).resolve().parent.parent
#: The package's own variables: every name the code spells like this must be in the table.
KNOB_NAME = re.compile(r"\bXPU_ZEBIN_[A-Z0-9_]*[A-Z0-9]\b")
#: Triton's variables the code reads or sets (its docstrings name many more it does not).
TRITON_READ = re.compile(
    r"""(?:environ(?:\.get|\.pop|\.setdefault)?\s*[\[(]|getenv\(|_ENV\s*=)\s*["'](TRITON_[A-Z0-9_]+)["']"""
)
FIELDS = ("name", "kind", "reader", "default", "meaning", "unusable")
READERS = {
    "engine": "Read by the engine, checked before every request",
    "python": "Read by the Python package",
    "triton": "Triton's own variables, which the drop-ins follow",
    "internal": "Set by the package for its own processes (never set them yourself)",
    "system": "Standard variables the package follows",
}


class Undocumented(Exception):
    """A variable the code reads with no description in the table."""


def _sources(root: Path) -> Iterable[Path]:
    """The package's code: the engine (but its unit tests) and the Python package."""
    for path in sorted((root / "src").rglob("*.rs")):
        if path.name != "tests.rs" and "tests" not in path.relative_to(root / "src").parts:
            yield path
    for pattern in ("*.py", "*.pth"):
        yield from sorted((root / "python").rglob(pattern))


def _code(root: Path) -> Dict[str, str]:
    """Each source file's text by its path under ``root``; a Rust file's unit tests (from
    ``#[cfg(test)]`` on) left out."""
    code = {}
    for path in _sources(root):
        text = path.read_text(encoding="utf-8", errors="replace")
        code[str(path.relative_to(root))] = (
            text.split("#[cfg(test)]", 1)[0] if path.suffix == ".rs" else text
        )
    return code


def names_in_code(root: Path = ROOT, code: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Every ``XPU_ZEBIN_*`` name the code spells, and every ``TRITON_*`` variable it reads
    or sets, with one file that does."""
    found: Dict[str, str] = {}
    for where, text in (code if code is not None else _code(root)).items():
        for name in KNOB_NAME.findall(text) + TRITON_READ.findall(text):
            found.setdefault(name, where)
    return found


def check(knobs: List[dict], root: Path = ROOT) -> None:
    """:class:`Undocumented` unless every knob is fully described and every variable the
    code names is a knob."""
    problems = []
    for k in knobs:
        empty = [f for f in FIELDS if not str(k.get(f, "")).strip()]
        if empty:
            problems.append(f"{k.get('name', '?')}: no {', '.join(empty)}")
        if k.get("reader") not in READERS:
            problems.append(f"{k.get('name', '?')}: read by {k.get('reader')!r}, unknown")
    known = {k.get("name") for k in knobs}
    code = _code(root)  # read once, for both directions
    named = names_in_code(root, code)
    for name, where in sorted(named.items()):
        if name not in known:
            problems.append(f"{name} (read in {where}) is not in src/knobs/table.rs")
    text = "\n".join(code.values())
    for name in sorted(n for n in known if n and n not in named and n not in text):
        problems.append(f"{name} is in src/knobs/table.rs but no code reads it")
    if problems:
        raise Undocumented("undocumented environment variables:\n  " + "\n  ".join(problems))


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def environment_page(knobs: List[dict]) -> str:
    """The environment page: one table per reader, every column from the engine's table."""
    out = [
        "# Environment",
        "",
        "Every variable the package reads, generated from the engine's one table",
        "(`src/knobs/table.rs`, `xpu_zebin._core.knobs()`): a variable added to the code",
        "without a description there fails the documentation's build.",
        "",
        "One parser reads every boolean, byte-count and duration variable of the engine:",
        "booleans are `1/true/yes/on` or `0/false/no/off` (any case), byte counts whole",
        "numbers, durations seconds from 0 to 1e9 (a positive value below a nanosecond is a",
        'nanosecond, never "no limit"). An empty or blank variable is unset. The same range',
        "holds for the `timeout=` argument and `--timeout`.",
        "",
    ]
    for reader, title in READERS.items():
        rows = [k for k in knobs if k["reader"] == reader]
        if not rows:
            continue
        out += [f"## {title}", "",
                "| variable | kind | default | what it does | an unusable value |",
                "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for k in rows:
            out.append(f"| `{k['name']}` | {k['kind']} | {_cell(k['default'])} | "
                       f"{_cell(k['meaning'])} | {_cell(k['unusable'])} |")  # fmt: skip
        out.append("")
    return "\n".join(out)


def _commands(parser: argparse.ArgumentParser, path: List[str]) -> Iterable[tuple]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, [*path, name])


def cli_page(parser: argparse.ArgumentParser) -> str:
    """The CLI reference: every command's help, as its parser prints it."""
    out = ["# CLI reference", "",
           "Every command's `--help`, generated from the CLI's parser "
           "(`python/xpu_zebin/cli/`). Examples: [Using the CLI](../cli.md).", ""]  # fmt: skip
    for path, p in _commands(parser, []):
        title = " ".join(["xpu-zebin", *path])
        out += [f"## `{title}`", "", "```text", p.format_help().rstrip(), "```", ""]
    return "\n".join(out)
