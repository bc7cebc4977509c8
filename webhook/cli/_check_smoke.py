"""`initshift check --smoke NAMESPACE`: a tiny build pod, then a tiny Job-shaped pod, through
the whole path.

The build pod: two init steps (the second fetches a URL, through the mesh's proxy when a
mesh injects in the namespace) and one main. The Job-shaped pod: one main that fetches the
URL and no init container (a Job's or CronJob's pod). Each stage is a line: rewritten (and
by which strategy), the sidecar Ready, step 0 (the Job's main) started after it (latency),
the steps in order, how the pod ended and how the sidecar stopped, the outcome annotation.
One deadline bounds the run; when it passes, the line names the stage it stuck at and what
each container was doing. Each pod is deleted at the end unless --keep.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from dataclasses import dataclass
from typing import Callable

from waiter import protocol as p

from ..errors import InitshiftError
from ..kube import KubeApi, KubeError
from ..watcher import SIDECAR, WAITER_RUN, NotManaged, layout, parse_time, ran_at, statuses
from ._check_preflight import calls_for, find_injectors, pod_webhook
from ._check_report import Line, Report, Target
from ._podcli import CliError, PodTracker
from ._podview import PodView, State, is_waiter_line, pod_view

_SECTION = "smoke"
_SMOKE_LABEL = "app.kubernetes.io/name"
_SMOKE_NAME = "initshift-smoke"
STEPS = ("step-0", "step-1")
MAIN = "main"
_STARTED = (State.RUNNING, State.COMPLETED, State.FAILED)
_TAIL_LINES = 3  # of a failed container's log, in its ✘ line


@dataclass(frozen=True)
class Shape:
    """One smoke pod: what it is called, which container the sidecars gate, its steps."""

    what: str  # "pod" or "Job-shaped pod", for the lines
    prefix: str  # generateName
    gated: str  # the container that must start only once the sidecars are Ready
    label: str  # that container in the lines ("step 0", "main")
    steps: tuple[str, ...]
    net: str  # the container that fetches --net-url


BUILD = Shape("pod", f"{_SMOKE_NAME}-", STEPS[0], "step 0", STEPS, STEPS[1])
JOB = Shape("Job-shaped pod", f"{_SMOKE_NAME}-job-", MAIN, "main", (), MAIN)


@dataclass(frozen=True)
class SmokeOptions:
    timeout: float = 300.0
    keep: bool = False
    image: str = "busybox:1.36"
    net_image: str = "curlimages/curl:8.10.1"
    # The apiserver's own Service: reachable from every namespace of every cluster.
    net_url: str = "https://kubernetes.default.svc/version"


def _container(name: str, image: str, command: list[str]) -> dict:
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return {"name": name, "image": image, "command": command, "securityContext": restricted,
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}}


def _fetch(options: SmokeOptions, who: str) -> list[str]:
    return ["curl", "-sSk", "-o", "/dev/null", "--max-time", "20", "-w", f"{who} reached %{{url_effective}}: "
            "HTTP %{http_code}\\n", options.net_url]


def _pod(prefix: str, init: list[dict], containers: list[dict]) -> dict:
    """Under the restricted Pod Security profile (any namespace admits it)."""
    spec: dict = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if init:
        spec["initContainers"] = init
    spec["containers"] = containers
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": prefix, "labels": {_SMOKE_LABEL: _SMOKE_NAME}}, "spec": spec}


def smoke_pod(options: SmokeOptions) -> dict:
    """Two steps and a main."""
    return _pod(BUILD.prefix, [_container(STEPS[0], options.image, ["sh", "-c", "echo initshift smoke: step 0"]),
                               _container(STEPS[1], options.net_image, _fetch(options, "step 1"))],
                [_container(MAIN, options.image, ["sh", "-c", "echo initshift smoke: done"])])


def smoke_job_pod(options: SmokeOptions) -> dict:
    """A Job's pod: one main that reaches the network, no init container."""
    return _pod(JOB.prefix, [], [_container(MAIN, options.net_image, _fetch(options, "main"))])


class _Stuck(InitshiftError):
    """The deadline passed during a stage."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _view(pod: dict) -> PodView | None:
    try:
        return pod_view(pod, _now())
    except NotManaged:
        return None


def _where(pod: dict, options: SmokeOptions) -> str:
    """What each container is doing: the text of a stuck line."""
    view = _view(pod)
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if view is None:
        return f"pod phase {phase}" + _unpulled(pod, options)
    rows = [f"{r.name}: {r.state}" + (f" ({r.reason})" if r.reason else "") for r in view.rows
            if r.state not in (State.COMPLETED,)]
    return (f"pod phase {phase}; " + ", ".join(rows) if rows else f"pod phase {phase}") + _unpulled(pod, options)


_PULL_FAILED = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")


def _unpulled(pod: dict, options: SmokeOptions) -> str:
    """What to do when the node cannot pull initshift's own image, or one of the smoke's
    (busybox and curl from Docker Hub, which an air-gapped cluster or a mirror-only one lacks)."""
    st = statuses(pod)
    for name in (p.INIT_CONTAINER_NAME, p.COPY_CONTAINER_NAME):
        waiting = ((st.get(name) or {}).get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _PULL_FAILED:
            return (f"; {name} cannot pull initshift's image ({waiting['reason']}): where the nodes need a pull "
                    f"secret for it, create one in this namespace and name it in INITSHIFT_IMAGE_PULL_SECRETS "
                    f"(docs/install.md#a-private-registry)")
    flags = {options.net_image: "--net-image", options.image: "--image"}  # --image's when they are the same
    spec = pod.get("spec") or {}
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        waiting = ((st.get(c.get("name")) or {}).get("state") or {}).get("waiting") or {}
        flag = flags.get(c.get("image"))
        if flag and waiting.get("reason") in _PULL_FAILED:
            return (f"; the nodes cannot pull {c['image']} ({waiting['reason']}): give {flag} an image they "
                    f"can pull (from your registry or mirror)")
    return ""


def _seconds(a: str | None, b: str | None) -> float | None:
    ta, tb = parse_time(a), parse_time(b)
    return (tb - ta).total_seconds() if ta and tb else None


def _probe_gated(pod: dict, container: str) -> bool:
    """Whether the waiter itself holds `container` until the sidecars' readiness probes
    pass on loopback (its `--probe` flags)."""
    spec = pod.get("spec") or {}
    c = next((c for c in spec.get("containers") or [] if c.get("name") == container), {})
    return p.FLAG_PROBE in (c.get("args") or [])


def _sidecar_up(pod: dict, name: str) -> bool:
    """Ready, or started with a startupProbe. The kubelet's `started` then says the probe
    passed (for a native sidecar, what the kubelet itself waits for before it starts the next
    container), while `ready` follows only at the readiness probe's next period (Istio's:
    15 s), often after a short pod has ended."""
    status = statuses(pod).get(name) or {}
    spec = pod.get("spec") or {}
    container = next((c for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])
                      if c.get("name") == name), {})
    return bool(status.get("ready")) or (bool(status.get("started")) and "startupProbe" in container)


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

    async def body(self, pod: dict, injects: bool, shape: Shape = BUILD) -> None:
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
            try:
                sidecars = layout(pod).all_sidecars
            except NotManaged:  # not rewritten, nothing to show but how it ends (a plain Job's pod)
                done = await self.until(tracker, "pod ended", lambda q: (q.get("status") or {}).get("phase")
                                        in ("Succeeded", "Failed"))
                phase = (done.get("status") or {}).get("phase")
                self.line(phase == "Succeeded", f"pod ended {phase} (phase {phase})", "" if phase == "Succeeded"
                          else await self._why(name, MAIN, "", shape), phase=phase)
                return
            await self._follow(tracker, sidecars, strategy, shape)

    async def _follow(self, tracker: PodTracker, sidecars: list[str], strategy: str | None,
                      shape: Shape = BUILD) -> None:
        def sidecars_ready(pod: dict) -> bool:
            return all(_sidecar_up(pod, n) for n in sidecars)

        def ended(pod: dict) -> bool:
            return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")

        def gated_started(pod: dict) -> bool:
            view = _view(pod)
            return ended(pod) or (view is not None and view.row(shape.gated).state in _STARTED)

        sidecar_start = None
        # The waiter probes the sidecars on loopback every few milliseconds: a short pod can
        # end before the kubelet's own probe (every second or more) ever reported them up.
        waiter_gate = _probe_gated(tracker.pod, shape.gated)
        if sidecars:
            pod = await self.until(tracker, "sidecar Ready", lambda q: sidecars_ready(q) or ended(q))
            if not sidecars_ready(pod):
                if not (waiter_gate and (pod.get("status") or {}).get("phase") == "Succeeded"):
                    self.line(False, f"sidecar {', '.join(sidecars)} Ready: the pod ended first",
                              _where(pod, self.options))
                    return
                self.line(True, f"sidecar {', '.join(sidecars)} Ready by {shape.label}'s loopback probe (the pod "
                                f"ended before the kubelet's probe reported it)", sidecars=sidecars)
            else:
                self.line(True, f"sidecar {', '.join(sidecars)} Ready", sidecars=sidecars)
            states = [(statuses(pod).get(n) or {}).get("state") or {} for n in sidecars]
            times = [ran_at((st.get("running") or st.get("terminated") or {}).get("startedAt")) for st in states]
            sidecar_start = min((t for t in times if t), key=parse_time, default=None)
        else:
            self.line(True, f"no sidecar in the pod: the {'steps need' if shape.steps else 'main needs'} no proxy")
        pod = await self.until(tracker, f"{shape.label} started", gated_started)
        ready_then = sidecars_ready(pod) or waiter_gate
        pod = await self.until(tracker, "steps and main finished" if shape.steps else "main finished", ended)
        view = _view(pod)
        assert view is not None
        self._gated(view, shape, sidecars, ready_then, sidecar_start)
        failed = next((r for r in view.rows if r.kind != SIDECAR and r.state == State.FAILED), None)
        why = await self._why(view.name, failed.name, failed.message or f"{failed.name} failed ({failed.reason}, "
                              f"exit {failed.exit_code})", shape) if failed else ""
        if shape.steps:
            self._steps(view, why)
            if failed and failed.name in shape.steps:
                why = ""  # said on the steps' line
        if strategy in WAITER_RUN:
            self.stage = "outcome recorded"
            pod = await self.until(tracker, "outcome recorded",
                                   lambda q: bool(((q.get("metadata") or {}).get("annotations") or {})
                                                  .get(p.ANNOTATION_OUTCOME)))
            view = _view(pod)
            assert view is not None
        self._ended(view, pod, strategy, why)

    def _look(self, pod: str, container: str | None = None) -> str:
        """Where to look further: the pod while it is kept, else how to keep it."""
        if not self.options.keep:
            return "--keep keeps the pods to look into"
        if container:
            return f"kubectl -n {self.namespace} logs {pod} -c {container}"
        return f"initshift status {pod} -n {self.namespace}"

    async def _why(self, pod: str, container: str, message: str, shape: Shape) -> str:
        """A failed step's or main's ✘ hint: its message, the last lines of its log, read now
        (the pod is deleted next unless --keep, and an exit code alone rarely says why: curl's
        6 is a name that did not resolve), what it fetches, and where to look further. The
        log is read where the credentials allow it (`get` on pods/log is not among --smoke's
        needs)."""
        parts = [message] if message else []
        try:
            lines = [line.rstrip("\n") async for line in self.api.pod_log(self.namespace, pod, container,
                                                                          tail_lines=4 * _TAIL_LINES)]
        except KubeError:
            lines = []
        tail = [line for line in lines if line.strip() and not is_waiter_line(line)][-_TAIL_LINES:]
        if tail:
            parts.append(f"its log ends: {' | '.join(tail)}")
        if container == shape.net:
            parts.append(f"it fetches {self.options.net_url} (--net-url)")
        return "; ".join([*parts, self._look(pod, container)])

    def _gated(self, view: PodView, shape: Shape, sidecars: list[str], ready_then: bool,
               sidecar_start: str | None) -> None:
        """`sidecar_start`: when the kubelet started the first sidecar, read when it was Ready."""
        self.stage = f"{shape.label} started"
        row = view.row(shape.gated)
        if sidecars:
            latency = _seconds(sidecar_start, row.started_at)
            ok = ready_then and (latency is None or latency >= 0)
            text = f"{latency:.2f}s after the sidecar started" if latency is not None else "latency unknown"
            self.line(ok, f"{shape.label} started after the sidecar was Ready ({text})",
                      "" if ok else f"{shape.label} ran before its proxy was Ready: its network calls could fail",
                      latencySeconds=latency)

    def _steps(self, view: PodView, why: str) -> None:
        """`why`: the hint of the step that failed."""
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
                      why if r.state == State.FAILED else r.message or self._look(view.name, r.name))
        else:
            self.line(ordered, f"steps ran in order: {text}", "" if ordered else "a step started before the one "
                                                                                 "before it had finished")

    def _ended(self, view: PodView, pod: dict, strategy: str | None, why: str) -> None:
        """`why`: the hint of the main that failed (a step's is on the steps' line)."""
        self.stage = "pod ended"
        stopped = [r for r in view.rows if r.kind == "sidecar"]
        how = view.sidecars_stopped_by or ", ".join(
            f"{r.name} {r.reason or r.state}" + (f" (exit {r.exit_code})" if r.exit_code is not None else "")
            for r in stopped)
        ok = view.result == "Succeeded"
        self.line(ok, f"pod ended {view.result} (phase {view.phase}" + (f", {view.pod_reason}" if view.pod_reason
                                                                          else "") + ")"
                  + (f"; sidecar stopped by {how}" if how else ""),
                  "" if ok else why or view.message or self._look(view.name),
                  result=view.result, phase=view.phase, sidecarsStoppedBy=how)
        self.stage = "outcome annotation"
        outcome = ((pod.get("metadata") or {}).get("annotations") or {}).get(p.ANNOTATION_OUTCOME)
        if strategy in WAITER_RUN:
            try:
                record = json.loads(outcome) if outcome else None
            except ValueError:
                record = None
            # The watcher's part is a record that says what the containers did: a step that failed
            # recorded as Failed is right (the lines above count the failure itself).
            result = record.get("result") if isinstance(record, dict) else None
            failed = any(r.kind != SIDECAR and r.state == State.FAILED for r in view.rows)
            ok = result == ("Failed" if failed else "Succeeded")
            summary = f"{result} ({record.get('message')})" if isinstance(record, dict) else outcome
            self.line(ok, f"{p.ANNOTATION_OUTCOME}: {summary}", "" if ok else
                      "the watcher recorded no outcome: check its Lease above" if record is None else
                      "the watcher's record disagrees with how the containers ended: read its log", outcome=record)
        else:
            self.line(True, f"no {p.ANNOTATION_OUTCOME} needed: the kubelet orders native sidecars "
                            f"(the watcher records waiter and hybrid pods only)")


async def smoke(api: KubeApi, namespace: str, target: Target, options: SmokeOptions, report: Report) -> None:
    """The build pod, then the Job-shaped pod, under one deadline."""
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
        label = f"kubectl label namespace {namespace} {p.LABEL_NAMESPACE_ENABLED}=true"
        # A namespace that does not exist cannot be labelled: create it first (or the name is a typo).
        why = f"namespace {namespace} does not exist: name an opted-in one, or kubectl create namespace " \
              f"{namespace} && {label} (and your mesh's label)" if ns is None else \
            f"there is no webhook configuration: {label}" if wh is None else \
            f"namespace {namespace} is not opted in: {label}"
        run.line(False, f"{namespace} is an opted-in namespace", why)
        return
    injects = any(i.injects_in(ns) for i in await find_injectors(api, configs))
    for shape, make in ((BUILD, smoke_pod), (JOB, smoke_job_pod)):
        if not await _one(run, shape, make(options), injects):
            return


async def _one(run: Run, shape: Shape, spec: dict, injects: bool) -> bool:
    """One smoke pod from creation to deletion; False when the run cannot go on (the pod
    could not be created, or the deadline is spent)."""
    api, namespace, options = run.api, run.namespace, run.options
    run.stage = "create the pod"
    try:
        pod = await api.create_pod(namespace, spec)
    except KubeError as e:
        run.line(False, f"create a {shape.what} in {namespace}", e.message)
        return False
    name = pod["metadata"]["name"]
    run.line(True, f"created {shape.what} {namespace}/{name}" + (" (a mesh injects here)" if injects else ""),
             pod=name)
    going_on = True
    try:
        await run.body(pod, injects, shape)
    except _Stuck as e:
        going_on = False
        current = await _current(api, namespace, name)
        run.line(False, f"timed out after {options.timeout:g}s at stage: {e}", _where(current, options) if current else
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
    return going_on


async def _current(api: KubeApi, namespace: str, name: str) -> dict | None:
    try:
        return await api.get_pod(namespace, name)
    except KubeError:
        return None
