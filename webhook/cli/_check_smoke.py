"""`initshift check --smoke NAMESPACE`: one tiny build pod through the whole path.

Two init steps (the second fetches a URL, through the mesh's proxy when a mesh injects in
the namespace) and one main. Each stage is a line: rewritten (and by which strategy), the
sidecar Ready, step 0 started after it (latency), the steps in order, how the pod ended and
how the sidecar stopped, the outcome annotation. One deadline bounds the run; when it
passes, the line names the stage it stuck at and what each container was doing. The pod
is deleted at the end unless --keep.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from dataclasses import dataclass
from typing import Callable

from waiter import protocol as p

from ..kube import KubeApi, KubeError
from ..watcher import WAITER_RUN, NotManaged, PodView, State, layout, parse_time, pod_view, statuses
from ._check_preflight import Line, Report, Target, calls_for, find_injectors, pod_webhook
from ._podcli import CliError, PodTracker

_SECTION = "smoke"
_SMOKE_LABEL = "app.kubernetes.io/name"
_SMOKE_NAME = "initshift-smoke"
STEPS = ("step-0", "step-1")
MAIN = "main"
_STARTED = (State.RUNNING, State.COMPLETED, State.FAILED)


@dataclass(frozen=True)
class SmokeOptions:
    timeout: float = 300.0
    keep: bool = False
    image: str = "busybox:1.36"
    net_image: str = "curlimages/curl:8.10.1"
    # The apiserver's own Service: reachable from every namespace of every cluster.
    net_url: str = "https://kubernetes.default.svc/version"


def smoke_pod(options: SmokeOptions) -> dict:
    """Two steps and a main, under the restricted Pod Security profile (any namespace admits it)."""
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}

    def container(name: str, image: str, command: list[str]) -> dict:
        return {"name": name, "image": image, "command": command, "securityContext": restricted,
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}}

    fetch = ["curl", "-sSk", "-o", "/dev/null", "--max-time", "20", "-w", "step 1 reached %{url_effective}: "
             "HTTP %{http_code}\\n", options.net_url]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": f"{_SMOKE_NAME}-", "labels": {_SMOKE_LABEL: _SMOKE_NAME}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [container(STEPS[0], options.image, ["sh", "-c", "echo initshift smoke: step 0"]),
                               container(STEPS[1], options.net_image, fetch)],
            "containers": [container(MAIN, options.image, ["sh", "-c", "echo initshift smoke: done"])],
        },
    }


class _Stuck(Exception):
    """The deadline passed during a stage."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _view(pod: dict) -> PodView | None:
    try:
        return pod_view(pod, _now())
    except NotManaged:
        return None


def _where(pod: dict) -> str:
    """What each container is doing: the text of a stuck line."""
    view = _view(pod)
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if view is None:
        return f"pod phase {phase}"
    rows = [f"{r.name}: {r.state}" + (f" ({r.reason})" if r.reason else "") for r in view.rows
            if r.state not in (State.COMPLETED,)]
    return f"pod phase {phase}; " + ", ".join(rows) if rows else f"pod phase {phase}"


def _seconds(a: str | None, b: str | None) -> float | None:
    ta, tb = parse_time(a), parse_time(b)
    return (tb - ta).total_seconds() if ta and tb else None


class Run:
    """One smoke run: the stages in order, each bounded by what is left of the deadline."""

    def __init__(self, api: KubeApi, namespace: str, options: SmokeOptions, report: Report) -> None:
        self.api, self.namespace, self.options, self.report = api, namespace, options, report
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + options.timeout
        self._loop = loop
        self.stage = "create the pod"

    def line(self, ok: bool, title: str, hint: str = "", **data: object) -> bool:
        self.report(Line(_SECTION, ok, title, hint, {"stage": self.stage, **data}))
        return ok

    async def until(self, tracker: PodTracker, stage: str, predicate: Callable[[dict], bool]) -> dict:
        self.stage = stage
        left = self._deadline - self._loop.time()
        try:
            if left <= 0:
                raise asyncio.TimeoutError
            return await tracker.wait(predicate, left)
        except asyncio.TimeoutError:
            raise _Stuck(stage) from None

    async def body(self, pod: dict, injects: bool) -> None:
        name = pod["metadata"]["name"]
        meta = pod.get("metadata") or {}
        strategy = (meta.get("labels") or {}).get(p.LABEL_MANAGED)
        reason = (meta.get("annotations") or {}).get(p.ANNOTATION_NOT_REWRITTEN)
        self.stage = "rewritten"
        if strategy:
            self.line(True, f"rewritten by initshift (strategy {strategy})", strategy=strategy)
        elif reason == "no-sidecar" and not injects:
            self.line(True, "not rewritten: no mesh injects in this namespace, nothing to fix (no-sidecar)",
                      reason=reason)
        else:
            self.line(False, f"rewritten by initshift: not rewritten ({reason or 'no decision recorded'})",
                      f"{p.ANNOTATION_NOT_REWRITTEN}={reason}: the reasons are in docs/strategies.md" if reason else
                      "the webhook was not called, failed (failurePolicy Ignore admits the pod unchanged) or its "
                      f"feature gate {p.FEATURE_GATE_ENV} is off: read the server's log and the lines above", reason=reason)
            return
        async with PodTracker(self.api, self.namespace, name, pod) as tracker:
            await self._follow(tracker, layout(pod).all_sidecars, strategy)

    async def _follow(self, tracker: PodTracker, sidecars: list[str], strategy: str | None) -> None:
        def sidecars_ready(pod: dict) -> bool:
            return all((statuses(pod).get(n) or {}).get("ready") for n in sidecars)

        def ended(pod: dict) -> bool:
            return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")

        def step0_started(pod: dict) -> bool:
            view = _view(pod)
            return ended(pod) or (view is not None and view.row(STEPS[0]).state in _STARTED)

        sidecar_start = None
        if sidecars:
            pod = await self.until(tracker, "sidecar Ready", lambda q: sidecars_ready(q) or ended(q))
            if not sidecars_ready(pod):
                self.line(False, f"sidecar {', '.join(sidecars)} Ready: the pod ended first", _where(pod))
                return
            self.line(True, f"sidecar {', '.join(sidecars)} Ready", sidecars=sidecars)
            times = [((statuses(pod).get(n) or {}).get("state") or {}).get("running", {}).get("startedAt")
                     for n in sidecars]
            sidecar_start = min((t for t in times if parse_time(t)), key=parse_time, default=None)
        else:
            self.line(True, "no sidecar in the pod: the steps need no proxy")
        pod = await self.until(tracker, "step 0 started", step0_started)
        ready_then = sidecars_ready(pod)
        pod = await self.until(tracker, "steps and main finished", ended)
        view = _view(pod)
        assert view is not None
        self._steps(view, sidecars, ready_then, sidecar_start)
        if strategy in WAITER_RUN:
            self.stage = "outcome recorded"
            pod = await self.until(tracker, "outcome recorded",
                                   lambda q: bool(((q.get("metadata") or {}).get("annotations") or {})
                                                  .get(p.ANNOTATION_OUTCOME)))
            view = _view(pod)
            assert view is not None
        self._ended(view, pod, strategy)

    def _steps(self, view: PodView, sidecars: list[str], ready_then: bool, sidecar_start: str | None) -> None:
        """`sidecar_start`: when the kubelet started the first sidecar, read when it was Ready."""
        self.stage = "step 0 started"
        step0 = view.row(STEPS[0])
        if sidecars:
            latency = _seconds(sidecar_start, step0.started_at)
            ok = ready_then and (latency is None or latency >= 0)
            text = f"{latency:.2f}s after the sidecar started" if latency is not None else "latency unknown"
            self.line(ok, f"step 0 started after the sidecar was Ready ({text})",
                      "" if ok else "step 0 ran before its proxy was Ready: its network calls could fail",
                      latencySeconds=latency)
        self.stage = "steps in order"
        rows = [view.row(n) for n in STEPS]
        failed = [r for r in rows if r.state != State.COMPLETED]
        ordered = all((parse_time(b.started_at) or _now()) >= (parse_time(a.finished_at) or _now())
                      for a, b in zip(rows, rows[1:]) if a.finished_at and b.started_at)
        text = ", ".join(f"{r.name} {r.duration or 0:.1f}s" for r in rows)
        if failed:
            r = failed[0]
            self.line(False, f"steps in order: {r.name} {r.state}" + (f" (exit {r.exit_code})" if r.exit_code
                                                                      is not None else ""),
                      r.message or f"kubectl -n {self.namespace} logs {view.name} -c {r.name}")
        else:
            self.line(ordered, f"steps ran in order: {text}", "" if ordered else "a step started before the one "
                                                                                 "before it had finished")

    def _ended(self, view: PodView, pod: dict, strategy: str | None) -> None:
        self.stage = "pod ended"
        stopped = [r for r in view.rows if r.kind == "sidecar"]
        how = view.sidecars_stopped_by or ", ".join(
            f"{r.name} {r.reason or r.state}" + (f" (exit {r.exit_code})" if r.exit_code is not None else "")
            for r in stopped)
        ok = view.result == "Succeeded"
        self.line(ok, f"pod ended {view.result} (phase {view.phase}" + (f", {view.pod_reason}" if view.pod_reason
                                                                          else "") + ")"
                  + (f"; sidecar stopped by {how}" if how else ""),
                  "" if ok else view.message or f"initshift status {view.name} -n {self.namespace}",
                  result=view.result, phase=view.phase, sidecarsStoppedBy=how)
        self.stage = "outcome annotation"
        outcome = ((pod.get("metadata") or {}).get("annotations") or {}).get(p.ANNOTATION_OUTCOME)
        if strategy in WAITER_RUN:
            try:
                record = json.loads(outcome) if outcome else None
            except ValueError:
                record = None
            ok = isinstance(record, dict) and record.get("result") == "Succeeded"
            summary = f"{record.get('result')} ({record.get('message')})" if isinstance(record, dict) else outcome
            self.line(ok, f"{p.ANNOTATION_OUTCOME}: {summary}", "" if ok else
                      "the watcher did not record a success: check its Lease above", outcome=record)
        else:
            self.line(True, f"no {p.ANNOTATION_OUTCOME} needed: the kubelet orders native sidecars "
                            f"(the watcher records waiter and hybrid pods only)")


async def smoke(api: KubeApi, namespace: str, target: Target, options: SmokeOptions, report: Report) -> None:
    run = Run(api, namespace, options, report)
    try:
        config = await api.get_webhook_config(target.webhook_config)
        configs = await api.list_webhook_configs()
        ns = next((n for n in await api.list_namespaces() if n["metadata"]["name"] == namespace), None)
    except KubeError as e:
        run.line(False, "read the namespace and the webhook configurations", e.message)
        return
    wh = pod_webhook(config) if config else None
    if ns is None or wh is None or not calls_for(wh, ns, {_SMOKE_LABEL: _SMOKE_NAME}):
        why = f"namespace {namespace} does not exist" if ns is None else \
            "there is no webhook configuration" if wh is None else f"namespace {namespace} is not opted in"
        run.line(False, f"{namespace} is an opted-in namespace", f"{why}: kubectl label namespace {namespace} "
                                                                 f"{p.LABEL_NAMESPACE_ENABLED}=true")
        return
    injects = any(i.injects_in(ns) for i in await find_injectors(api, configs))
    try:
        pod = await api.create_pod(namespace, smoke_pod(options))
    except KubeError as e:
        run.line(False, f"create a pod in {namespace}", e.message)
        return
    name = pod["metadata"]["name"]
    run.line(True, f"created pod {namespace}/{name}" + (" (a mesh injects here)" if injects else ""), pod=name)
    try:
        await run.body(pod, injects)
    except _Stuck as e:
        current = await _current(api, namespace, name)
        run.line(False, f"timed out after {options.timeout:g}s at stage: {e}", _where(current) if current else
                 "the pod is gone", stuck=str(e))
    except CliError as e:
        run.line(False, f"follow pod {namespace}/{name}", str(e))
    finally:
        run.stage = "clean up"
        if options.keep:
            run.line(True, f"kept pod {namespace}/{name} (--keep)")
        else:
            try:
                await api.delete_pod(namespace, name)
                run.line(True, f"deleted pod {namespace}/{name}")
            except KubeError as e:
                run.line(False, f"delete pod {namespace}/{name}", e.message)


async def _current(api: KubeApi, namespace: str, name: str) -> dict | None:
    try:
        return await api.get_pod(namespace, name)
    except KubeError:
        return None
