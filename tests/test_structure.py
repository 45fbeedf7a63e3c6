"""The source's shape, checked: no dependency cycle between the engine's modules, no Python
function over 80 lines (Rust: clippy's `too_many_lines`, 80 in clippy.toml), and every
design note the code cites exists in the repository."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _module_dependencies() -> dict:
    deps: dict = {}
    for path in (ROOT / "src").rglob("*.rs"):
        parts = list(path.relative_to(ROOT / "src").with_suffix("").parts)
        if parts[-1] == "mod":
            parts = parts[:-1]
        if parts in (["lib"], []) or parts[-1] == "tests":  # a module's tests in a file
            continue
        code = path.read_text().split("#[cfg(test)]")[0]  # tests may use anything
        used = set(re.findall(r"crate::(\w+)", code)) - {parts[0]}
        deps.setdefault(parts[0], set()).update(used)
    return deps


def test_no_module_dependency_cycle():
    deps = _module_dependencies()
    assert "engine" in deps and "ladder" in deps

    def reaches(start: str, goal: str, seen: set) -> bool:
        for d in deps.get(start, ()):
            if d == goal or (d not in seen and (seen.add(d) or reaches(d, goal, seen))):
                return True
        return False

    cycles = sorted(m for m in deps if reaches(m, m, set()))
    assert cycles == [], f"modules in a dependency cycle: {cycles}"


def test_cited_design_notes_exist():
    notes = (ROOT / "docs" / "design.md").read_text()
    sections = set(re.findall(r"^## (\d+)\.", notes, re.M))
    cited = []
    for path in [*ROOT.glob("src/**/*.rs"), *ROOT.glob("python/**/*.py"), *ROOT.glob("tests/*.py"),
                 *ROOT.glob("scripts/*")]:  # fmt: skip
        text = path.read_text(errors="replace")
        assert "DESIGN.md" not in text or path.name == "test_structure.py", path
        cited += [(path.name, s) for s in re.findall(r"docs/design\.md §(\d+)", text)]
    assert cited, "the code cites its design notes"
    assert [c for c in cited if c[1] not in sections] == []


def test_no_python_function_over_80_lines():
    import ast

    long = []
    for path in [*ROOT.glob("python/**/*.py"), *ROOT.glob("benches/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.name}:{node.name} ({lines} lines)")
    assert long == []
