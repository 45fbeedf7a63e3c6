"""The documentation site (issue 31): built in strict mode (a broken link, a missing
reference or an undocumented environment variable fails it), its reference pages made
from the code, and every Python example of its pages and the README run against the
installed package (``docs/conftest.py``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import xpu_zebin

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import docs_reference  # noqa: E402

QUIET = {"DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"}


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root, capture_output=True, text=True, timeout=600, env={**os.environ, **QUIET},
    )  # fmt: skip


@pytest.mark.slow
def test_the_site_builds_strictly_with_its_reference_pages(tmp_path):
    built = _build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-4000:]
    environment = (tmp_path / "site" / "reference" / "environment" / "index.html").read_text()
    for knob in xpu_zebin._core.knobs():
        assert knob["name"] in environment
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in ("xpu-zebin compile", "stats,verify,purge", "xpu-zebin key [-h]"):
        assert command in cli
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in xpu_zebin.__all__:  # the package's whole public API has a reference
        ids = (f'id="xpu_zebin.{name}"', f'id="xpu_zebin.errors.{name}"',
               f'id="xpu_zebin._core.{name}"')  # fmt: skip
        assert any(i in api for i in ids), name
    charts = {p.stem for p in (tmp_path / "site" / "reference").glob("*.svg")}
    recorded = {p.stem for p in (ROOT / "benches" / "results").glob("*.json")}
    assert recorded and charts == recorded, (charts, recorded)  # a chart for every bench's JSON


def test_every_task_is_one_click_from_the_home_page():
    home = (ROOT / "docs" / "index.md").read_text()
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in re.findall(r":\s+(\S+\.md)$", nav, re.M):
        if page != "index.md":
            assert f"]({page})" in home, f"{page} is not linked from the home page"


def _copy_of_the_sources(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    for part in ("docs", "scripts", "benches", "python", "src"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("target*"))
    shutil.copy(ROOT / "mkdocs.yml", copy)
    return copy


@pytest.mark.slow
def test_a_variable_the_code_reads_without_a_description_fails_the_build(tmp_path):
    copy = _copy_of_the_sources(tmp_path)
    (copy / "python" / "xpu_zebin" / "shiny.py").write_text(
        'import os\nSHINY = os.environ.get("XPU_ZEBIN_SHINY_NEW_KNOB")\n'
    )
    built = _build(copy, tmp_path / "site")
    assert built.returncode != 0
    assert "XPU_ZEBIN_SHINY_NEW_KNOB" in built.stderr and "src/knobs/table.rs" in built.stderr
    (copy / "python" / "xpu_zebin" / "shiny.py").unlink()
    assert _build(copy, tmp_path / "site").returncode == 0  # the copy itself builds


@pytest.mark.parametrize("field", ["meaning", "default", "unusable"])
def test_a_variable_with_an_empty_description_is_refused(field):
    knobs = xpu_zebin._core.knobs()
    knobs[0] = {**knobs[0], field: "  "}
    with pytest.raises(docs_reference.Undocumented, match=f"{knobs[0]['name']}: no {field}"):
        docs_reference.check(knobs)
    docs_reference.check(xpu_zebin._core.knobs())


def _fences(text: str) -> list:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def test_the_readmes_example_is_the_quick_starts():
    """The README's example runs as the quick start's (under docs/conftest.py's isolation)."""
    (readme,) = _fences((ROOT / "README.md").read_text())
    assert readme in _fences((ROOT / "docs" / "quickstart.md").read_text())


PAGES = sorted(p.name for p in (ROOT / "docs").glob("*.md") if _fences(p.read_text()))


def test_every_page_with_an_example_is_run():
    """The parametrized test below covers every page that has a Python example."""
    assert PAGES and "quickstart.md" in PAGES


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_pages_examples_run_on_the_installed_package(tmp_path, page, modern_ocloc):
    """One page at a time (each its own process, as docs/conftest.py isolates it): every
    example passes, and none was left uncollected. They compile with the modern compiler,
    the one whose PTSS check the quick start's example shows (docs/conftest.py isolates
    the rest)."""
    fences = len(_fences((ROOT / "docs" / page).read_text()))
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "--markdown-docs", "-p", "no:randomly", "-q",
         "-p", "no:cacheprovider", str(ROOT / "docs" / page)],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "TMPDIR": str(tmp_path), "XPU_ZEBIN_OCLOC": modern_ocloc},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]
    assert re.search(rf"\b{fences} passed\b", ran.stdout), (fences, ran.stdout[-2000:])
