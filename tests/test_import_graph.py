"""The layering the architecture promises, read from the source: the registry never imports the
router (nor the router the registry), and the packages both use (mesh, semantic, auth, wal) import
neither. Imports inside functions count too: a lazy import is still an arrow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "registry": {"router", "console"},
    "router": {"registry", "console"},
    "semantic": {"router", "registry", "console"},
    "mesh": {"router", "registry", "console", "semantic"},
    "auth": {"router", "registry", "console"},
    "wal": {"router", "registry", "console", "mesh"},
}


def imported_packages(path: Path) -> set[tuple[int, str]]:
    """Every top-level package a module imports, with the line it does it on."""
    found: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.lineno, node.module.split(".")[0]))
    return found


def arrows_out_of(package: str, targets: set[str]) -> list[str]:
    return sorted(f"{path.relative_to(ROOT)}:{line} imports {target}"
                  for path in (ROOT / package).rglob("*.py")
                  for line, target in imported_packages(path) if target in targets)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_arrow_runs_back_up(package: str) -> None:
    assert arrows_out_of(package, FORBIDDEN[package]) == []


def test_the_checker_sees_a_lazy_import(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("def judge():\n    from router.semantic.judge import ExampleJudge\n    import console.api\n")
    assert imported_packages(module) == {(2, "router"), (3, "console")}
