"""Reading a Pod or an AdmissionReview from YAML or JSON, for the command line."""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from typing import Any

import yaml
from ..errors import InitshiftError


class InputError(InitshiftError, ValueError):
    """The input is not a Pod or an AdmissionReview of a Pod; the message says why."""


# Workloads whose pod template `initshift mutate` rewrites in place: kind -> template path.
_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    **{kind: ("spec", "template") for kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job")},
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


@dataclass
class _PodInput:
    pod: dict
    review: dict | None = None  # the AdmissionReview the pod came from, if any
    workload: dict | None = None  # the Deployment, Job... whose template `pod` is

    @property
    def document(self) -> dict:
        """What was read: the workload, else the pod."""
        return self.workload if self.workload is not None else self.pod

    def put(self, pod: dict) -> dict:
        """The document with `pod` in place of the one read."""
        if self.workload is None:
            return pod
        out = copy.deepcopy(self.workload)
        *parents, last = _TEMPLATE_PATHS[out["kind"]]
        node = out
        for key in parents:
            node = node[key]
        node[last] = pod
        return out

    @property
    def namespace(self) -> str:
        if self.review:
            return str((self.review.get("request") or {}).get("namespace") or "")
        return str((self.pod.get("metadata") or {}).get("namespace") or "")


def read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from None


def parse_pod(text: str) -> _PodInput:
    try:
        doc: Any = yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as e:
        raise InputError(f"not YAML or JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise InputError("expected a Pod or an AdmissionReview object")
    if doc.get("kind") == "AdmissionReview":
        request = doc.get("request")
        if not isinstance(request, dict) or not isinstance(request.get("object"), dict):
            raise InputError("AdmissionReview has no request.object")
        pod = request["object"]
        if pod.get("kind", "Pod") != "Pod":
            raise InputError(f"AdmissionReview holds a {pod.get('kind')}, not a Pod")
        return _PodInput(pod=pod, review=doc)
    if doc.get("kind") in _TEMPLATE_PATHS:
        node: Any = doc
        for key in _TEMPLATE_PATHS[doc["kind"]]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not isinstance(node.get("spec"), dict):
            raise InputError(f"the {doc['kind']} has no pod template")
        return _PodInput(pod=node, workload=doc)
    if doc.get("kind", "Pod") != "Pod":
        raise InputError(f"expected a Pod, an AdmissionReview or a workload "
                         f"({', '.join(_TEMPLATE_PATHS)}), got a {doc.get('kind')}")
    if not isinstance(doc.get("spec"), dict):
        raise InputError("the Pod has no spec")
    return _PodInput(pod=doc)


def dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2) + "\n"
    return yaml.safe_dump(obj, sort_keys=False, width=1000)
