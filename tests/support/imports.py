"""Which third-party distributions the code imports, read from the source with `ast`.

`python -m tests.support.imports` prints them per tree; tests/deploy/test_dependencies.py
compares them with what pyproject.toml declares. Every `import` counts, also the ones
inside functions (lazy imports are still dependencies).
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = frozenset({"webhook", "waiter", "certs", "tests"})
RUNTIME_TREES = ("webhook", "waiter", "certs")
TEST_TREES = ("tests",)


def top_level_imports(tree: Path) -> dict[str, set[str]]:
    """top-level module -> files (relative) importing it, for every .py under `tree`."""
    found: dict[str, set[str]] = {}
    for path in sorted(tree.rglob("*.py")):
        module = ast.parse(path.read_text(), str(path))
        for node in ast.walk(module):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.partition(".")[0], set()).add(str(path.relative_to(REPO)))
    return found


def third_party(trees: tuple[str, ...]) -> dict[str, set[str]]:
    """distribution (normalised name) -> files, for the imports that are neither stdlib nor ours."""
    dists = importlib.metadata.packages_distributions()
    out: dict[str, set[str]] = {}
    for tree in trees:
        for module, files in top_level_imports(REPO / tree).items():
            if module in FIRST_PARTY or module in sys.stdlib_module_names or module == "__future__":
                continue
            for dist in dists.get(module, [f"<not installed: {module}>"]):
                out.setdefault(normalise(dist), set()).update(files)
    return out


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def main() -> int:
    for label, trees in (("runtime", RUNTIME_TREES), ("tests", TEST_TREES)):
        print(f"# {label}: {', '.join(trees)}")
        for dist, files in sorted(third_party(trees).items()):
            print(f"{dist:24} {len(files):3} files, e.g. {sorted(files)[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
