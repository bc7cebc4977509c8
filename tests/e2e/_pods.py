"""What the scenarios build and read: step containers that call through the proxy, pods
and their end, container logs with the kubelet's timestamps, and the dump a failed
scenario prints (status, events, every container's log)."""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any

from waiter import protocol as p

from ._kube import Kube, parse_time, wait_for

ENDED = ("Succeeded", "Failed")
POD_TIMEOUT = 240.0  # a pod of a scenario, from creation to its end, on a loaded 2-core machine


def step(name: str, image: str, *, port: int | None, path: str = "", sleep: float = 0, exit_code: int = 0,
         extra: str = "", **fields: Any) -> dict:
    """A busybox step: "NAME start", one call through the proxy on loopback PORT (a failed
    call exits 7), optional work, "NAME end" (or exit EXIT_CODE)."""
    script = f'echo "{name} start"; '
    if port:
        url = f"http://127.0.0.1:{port}/{path or name}"
        script += (f'if timeout 10 wget -q -O /dev/null {url}; then echo "{name} fetched {url}"; '
                   f'else echo "{name}: network call failed"; exit 7; fi; ')
    if sleep:
        script += f"sleep {sleep}; "
    script += extra
    script += f'echo "{name} failing with {exit_code}"; exit {exit_code}' if exit_code else f'echo "{name} end"'
    return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", script],
            **fields}


def pod(name: str, init: list[dict], containers: list[dict], *, annotations: dict | None = None,
        labels: dict | None = None, restart: str = "Never", **spec: Any) -> dict:
    body: dict = {"restartPolicy": restart, "terminationGracePeriodSeconds": 5, **spec}
    if init:
        body["initContainers"] = init
    body["containers"] = containers
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}}, "spec": body}


@dataclass(frozen=True)
class Line:
    at: dt.datetime
    text: str


def log_lines(kube: Kube, ns: str, pod_name: str, container: str, *, waiter: bool = False) -> list[Line]:
    """A container's log as (kubelet timestamp, text); the waiter's own lines dropped unless asked."""
    out = []
    for raw in kube.logs(ns, pod_name, container).splitlines():
        stamp, _, text = raw.partition(" ")
        try:
            at = parse_time(stamp)
        except ValueError:
            continue
        if waiter or not text.startswith(p.WAITER_LOG_PREFIX):
            out.append(Line(at, text))
    return out


def first(lines: list[Line], pattern: str) -> Line | None:
    rx = re.compile(pattern)
    return next((line for line in lines if rx.search(line.text)), None)


def ms(delta: dt.timedelta) -> float:
    return delta.total_seconds() * 1000


def wait_end(kube: Kube, ns: str, name: str, timeout: float = POD_TIMEOUT) -> dict:
    def ended() -> dict | None:
        obj = kube.pod(ns, name)
        return obj if obj and obj.get("status", {}).get("phase") in ENDED else None

    return wait_for(ended, timeout, f"pod {ns}/{name} to end", interval=0.5)


def statuses(obj: dict) -> dict[str, dict]:
    st = obj.get("status") or {}
    return {c["name"]: c for c in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or [])}


def terminated(obj: dict, container: str) -> dict | None:
    return ((statuses(obj).get(container) or {}).get("state") or {}).get("terminated")


def annotations(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("annotations") or {}


def managed(obj: dict) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(p.LABEL_MANAGED)


def outcome(kube: Kube, ns: str, name: str, timeout: float = 90.0) -> dict:
    """The watcher's outcome annotation, once written."""
    def written() -> dict | None:
        raw = annotations(kube.pod(ns, name) or {}).get(p.ANNOTATION_OUTCOME)
        return json.loads(raw) if raw else None

    return wait_for(written, timeout, f"the watcher's outcome on {ns}/{name}", interval=0.5)


def container_names(obj: dict) -> tuple[list[str], list[str]]:
    spec = obj.get("spec") or {}
    return [c["name"] for c in spec.get("initContainers") or []], [c["name"] for c in spec.get("containers") or []]


def dump(kube: Kube, ns: str) -> str:
    """Every pod of `ns`: phase, conditions, each container's state, the events, each log."""
    out = []
    try:
        pods = kube.pods(ns)
    except Exception as exc:  # noqa: BLE001 - a dump must not fail
        return f"    (cannot list pods in {ns}: {exc})"
    for obj in pods:
        name = obj["metadata"]["name"]
        st = obj.get("status") or {}
        out.append(f"  pod {ns}/{name}: phase {st.get('phase')} {st.get('reason') or ''} "
                   f"managed={managed(obj)} {st.get('message') or ''}".rstrip())
        for cond in st.get("conditions") or []:
            out.append(f"    condition {cond['type']}={cond['status']} {cond.get('reason') or ''}".rstrip())
        ann = {k: v for k, v in annotations(obj).items() if k.startswith(p.GROUP)}
        if ann:
            out.append(f"    initshift annotations: {json.dumps(ann)}")
        inits, mains = container_names(obj)
        for cname in inits + mains:
            state = (statuses(obj).get(cname) or {}).get("state") or {}
            out.append(f"    container {cname}: {json.dumps(state)}")
        for event in kube.events(ns, name):
            out.append(f"    event {event.get('type')} {event.get('reason')}: {event.get('message')}")
        for cname in inits + mains:
            text = kube.logs(ns, name, cname).rstrip().splitlines()[-30:]
            out.append(f"    log {cname}:")
            out += [f"      {line}" for line in text] or ["      (empty)"]
    return "\n".join(out)
