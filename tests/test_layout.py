"""The code's layout holds: packages import each other one way only, through their public
surface (`__all__`), certs/ never imports the webhook, and the waiter stays stdlib-only."""

from __future__ import annotations

import ast
import re
import importlib
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("webhook", "certs", "waiter")
SHARED = {"webhook.settings", "webhook.errors", "webhook.logs", "webhook.metrics", "webhook.jsontext"}
PACKAGES = sorted(p.name for p in (ROOT / "webhook").iterdir() if (p / "__init__.py").is_file())


def _unit(module: str) -> str:
    """The layer a module belongs to: a webhook subpackage or shared module, or a top package."""
    parts = module.split(".")
    if parts[0] == "webhook" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports() -> dict[str, list[tuple[str, str, int]]]:
    """module -> [(imported module, file, line)] for every import of ours, relative ones resolved."""
    out: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    for top in OURS:
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            package = module.split(".") if rel.name == "__init__" else module.split(".")[:-1]
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    base = package[: len(package) - node.level + 1] if node.level else []
                    target = ".".join(base + ([node.module] if node.module else []))
                    names = [f"{target}.{a.name}" for a in node.names]
                    for t in [target, *names]:
                        if t.split(".")[0] in OURS and _is_module(t):
                            out[module].append((t, str(rel), node.lineno))
                elif isinstance(node, ast.Import):
                    out[module] += [(a.name, str(rel), node.lineno) for a in node.names if a.name.split(".")[0] in OURS]
    return out


IMPORTS = _imports()


def test_units_import_each_other_without_cycles() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, targets in IMPORTS.items():
        for target, _, _ in targets:
            a, b = _unit(module), _unit(target)
            if a != b and b != "webhook":
                graph[a].add(b)
    seen: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            assert seen.get(nxt) != 1, f"import cycle: {' -> '.join([*path, node, nxt])}"
            if nxt not in seen:
                visit(nxt, [*path, node])
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node, [])
    assert not graph["certs"], f"certs/ imports {graph['certs']}"
    assert graph["waiter"] == set(), f"waiter/ imports {graph['waiter']}"
    assert "webhook.cli" not in {b for bs in graph.values() for b in bs}, "only the CLI sits on top"


def test_other_packages_are_reached_through_their_public_surface() -> None:
    private = []
    for module, targets in IMPORTS.items():
        for target, where, line in targets:
            parts = target.split(".")
            if _unit(module) != _unit(target) and any(p.startswith("_") and p != "__init__" for p in parts[1:]):
                private.append(f"{where}:{line} imports {target}")
    assert private == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_has_an_explicit_public_surface(package: str) -> None:
    mod = importlib.import_module(f"webhook.{package}")
    names = getattr(mod, "__all__", None)
    assert isinstance(names, list) and names, f"webhook.{package} has no __all__"
    for name in names:
        assert getattr(mod, name) is not None, f"webhook.{package}.{name}"
    modules = [p.stem for p in (ROOT / "webhook" / package).glob("*.py") if p.stem not in ("__init__", "__main__")]
    assert all(m.startswith("_") for m in modules), f"public modules in webhook/{package}: {modules}"


def test_the_waiter_is_standard_library_only() -> None:
    stdlib = sys.stdlib_module_names
    for path in (ROOT / "waiter").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for name in names:
                top = name.split(".")[0]
                assert top in stdlib or top == "waiter" or path.name == "build.py", f"{path}: imports {name}"


def _documented_imports() -> dict[str, set[str] | None]:
    """docs/design.md's table of what each package imports from initshift: package -> its
    units (None: "everything"). A row may name several packages (`webhook.settings`,
    `logs`), each then given as `logs: ...` in a part of its own (`;`); a short name is a
    webhook package unless it is a top-level one; a waiter module is named in full."""
    def full(name: str) -> str:
        return name if name.split(".")[0] in OURS else f"webhook.{name}"

    text = (ROOT / "docs" / "design.md").read_text()
    table = text.split("| package | imports from initshift |", 1)[1].split("\n\n", 1)[0]
    out: dict[str, set[str] | None] = {}
    for row in table.strip().splitlines()[1:]:
        _, packages, imports, _ = row.split("|")
        names = [full(n) for n in re.findall(r"`([^`]+)`", packages)]
        parts = imports.split(";") if len(names) > 1 else [imports]
        for part in parts:
            owner, _, listed = part.partition(":") if len(names) > 1 and ":" in part else ("", "", part)
            units = None if listed.strip().startswith("everything") else \
                {full(n) for n in re.findall(r"`([^`]+)`", listed)}
            for name in names if not owner.strip() or listed.strip() == "nothing" else [full(owner.strip())]:
                out[name] = units
    return out


def test_the_design_docs_import_table_is_what_the_code_imports() -> None:
    actual: dict[str, set[str]] = defaultdict(set)
    for module, targets in IMPORTS.items():
        for target, _, _ in targets:
            a, b = _unit(module), _unit(target)
            if target == "waiter":  # `from waiter import protocol`: its module is counted
                continue
            if b == "waiter":
                b = ".".join(target.split(".")[:2])  # the table names the waiter's modules
            if a != b.split(".")[0] and a != b and b != "webhook":
                actual[a].add(b)
    documented = _documented_imports()
    units = {_unit(m) for m in IMPORTS} - {"webhook"}
    assert units <= set(documented), f"packages the table leaves out: {sorted(units - set(documented))}"
    for package, listed in documented.items():
        if listed is not None:
            assert actual.get(package, set()) == listed, (
                f"docs/design.md says {package} imports {sorted(listed)}; it imports {sorted(actual.get(package, ()))}")
