"""initshift uses other packages through their public API only (issue 30): no module of
webhook/, waiter/ or certs/ imports a private module or name of another package (uvicorn,
h11, httptools, json, starlette, ...), reads one through an attribute, or assigns to an
attribute of another package's module or class (no monkey-patching). Read from the AST."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"webhook", "waiter", "certs"}
SOURCES = sorted(p for d in OURS for p in (ROOT / d).rglob("*.py"))


# Documented public API despite the underscore.
DOCUMENTED = {("os", "_exit")}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def problems(tree: ast.AST) -> list[str]:
    foreign: set[str] = set()  # names bound to another package's modules or objects
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    continue
                if any(_private(part) for part in alias.name.split(".")):
                    out.append(f"line {node.lineno}: import {alias.name}")
                foreign.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in OURS:
                continue
            if any(_private(part) for part in node.module.split(".")):
                out.append(f"line {node.lineno}: from {node.module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    out.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                foreign.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        root = node.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if not isinstance(root, ast.Name) or root.id not in foreign:
            continue
        if _private(node.attr) and (root.id, node.attr) not in DOCUMENTED:
            out.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            out.append(f"line {node.lineno}: assigns {ast.unparse(node)}")
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_name_of_another_package(path: Path) -> None:
    assert problems(ast.parse(path.read_text(), str(path))) == []


def test_the_check_sees_what_it_looks_for() -> None:
    code = ("import json.decoder\nfrom uvicorn.protocols.http.httptools_impl import HttpToolsProtocol\n"
            "from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE\nfrom json import _default_decoder\n"
            "import uvicorn\nuvicorn.Server = object\nx = json.decoder._private\nimport json._x\n")
    found = problems(ast.parse(code))
    assert len(found) == 5, found
    assert problems(ast.parse("from . import _app\nfrom ..settings import _PORT\nimport uvicorn\n"
                              "uvicorn.Config(app=None)\n")) == []
