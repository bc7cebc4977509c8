"""What `initshift status` and `initshift logs` see in a pod: pure functions over pod JSON.

Rewriting moves steps out of `initContainers`, so the kubelet's statuses (alphabetical,
split between two lists, and for a waiter pod every step "running" from the start)
no longer tell the story. `pod_view()` puts the containers back in execution order and
derives each one's state from its status, the waiter's termination message and the
pod's annotations, all read through the watcher's one reader of a pod's state
(`webhook/watcher/_podstate.py`); `log_plan()` is the order `initshift logs` streams them in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Mapping

from waiter import protocol as p

from ..rewrite import managed_as, removed_post_start, removed_startup_probes
from ..settings import RewriteSettings
from ..watcher import (ENDED_PHASES, MAIN, NOT_RUN, QUIET_WAITING, SIDECAR, STEP, WAITER_RUN, Run, deletion_asked,
                       json_int, layout, parse_time, pod_ended, read_run, read_runs, statuses)


class State(StrEnum):
    """Row states: JSON slugs (`state_text()` is the table's wording)."""

    PENDING = "pending"  # not started yet (image pull, container creation) or stuck there
    WAITING_STEP = "waiting-step"  # waiting for the container before it
    WAITING_SIDECARS = "waiting-sidecars"  # the first step, held until the sidecars are ready
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"  # the waiter did not run it: an earlier step failed
    NOT_STARTED = "not-run"  # the pod ended before it ran
    STOPPED = "stopped"  # a sidecar that has ended (how: reason, exit code, outcome's stoppedBy)

_WAITER_LINE = re.compile(rf"^{re.escape(p.WAITER_LOG_PREFIX)}(\[[^\]\n]*\])?: ")


@dataclass(frozen=True)
class _Row:
    name: str
    kind: str  # INIT, STEP, MAIN or SIDECAR
    state: str
    number: int | None = None  # steps: 1-based position in execution order
    waiting_for: str | None = None  # the container it waits for (State.WAITING_STEP)
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    duration: float | None = None  # seconds; for a running container, until `now`
    restarts: int = 0
    ready: bool | None = None  # sidecars: the kubelet's readiness

    @property
    def stuck(self) -> bool:
        """Not started for a reason of the kubelet's that is a problem (ImagePullBackOff,
        CreateContainerConfigError), not one that only means "not yet"."""
        return self.state == State.PENDING and self.reason not in QUIET_WAITING

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "step": self.number, "state": str(self.state),
                "waitingFor": self.waiting_for, "exitCode": self.exit_code, "reason": self.reason,
                "message": self.message, "startedAt": self.started_at, "finishedAt": self.finished_at,
                "durationSeconds": None if self.duration is None else round(self.duration, 3),
                "restarts": self.restarts, "ready": self.ready}


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    strategy: str | None  # "waiter", "hybrid", "native" or None (never rewritten)
    phase: str
    pod_reason: str  # the pod's status.reason, e.g. DeadlineExceeded
    result: str  # the outcome's result, else the phase
    message: str  # the outcome's message, else the pod's
    failed: str | None  # the outcome's failed step or main
    sidecars_stopped_by: str | None  # the outcome's sidecarsStoppedBy
    ready: bool | None  # waiter pods: initshift.io/ready
    rows: tuple[_Row, ...]
    not_rewritten: str | None = None  # why the webhook left the pod as it was (its reason slug)
    # hybrid: native sidecars whose startupProbe, or postStart readiness wait, initshift removed
    # (step 0 gates on their readiness)
    startup_probes_removed: tuple[str, ...] = ()
    post_start_removed: tuple[str, ...] = ()
    managed: str | None = None  # the initshift.io/managed label (start-order pods have no strategy)
    deleted_at: datetime | None = None  # when its deletion was asked for: the pod is Terminating

    @property
    def ended(self) -> bool:
        return self.phase in ENDED_PHASES

    def row(self, name: str) -> _Row:
        return next(r for r in self.rows if r.name == name)

    def to_json(self) -> dict:
        return {"namespace": self.namespace, "name": self.name, "strategy": self.strategy, "phase": self.phase,
                "podReason": self.pod_reason, "result": self.result, "message": self.message,
                "failed": self.failed, "sidecarsStoppedBy": self.sidecars_stopped_by, "ready": self.ready,
                "notRewritten": self.not_rewritten, "startupProbesRemoved": list(self.startup_probes_removed),
                "postStartRemoved": list(self.post_start_removed),
                "deletedAt": self.deleted_at.strftime("%Y-%m-%dT%H:%M:%SZ") if self.deleted_at else None,
                "containers": [r.to_json() for r in self.rows]}


def _outcome(pod: Mapping) -> dict:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(p.ANNOTATION_OUTCOME)
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _outcome_entries(outcome: Mapping) -> dict[str, dict]:
    lists = [outcome.get(key) for key in ("steps", "mains")]
    return {e["name"]: e for entries in lists if isinstance(entries, list) for e in entries
            if isinstance(e, dict) and isinstance(e.get("name"), str)}


def _seconds(start: str | None, end: str | datetime | None) -> float | None:
    a = parse_time(start)
    b = end if isinstance(end, datetime) else parse_time(end)
    return max(0.0, (b - a).total_seconds()) if a and b else None


def _count(value: Any) -> int:
    return json_int(value) or 0


def _later(a: str | None, b: str | None) -> str | None:
    ta, tb = parse_time(a), parse_time(b)
    if ta and tb:
        return a if ta >= tb else b
    return a or b


def _started(status: dict | None) -> bool:
    state = (status or {}).get("state") or {}
    return "running" in state or "terminated" in state


def has_started(pod: Mapping, name: str) -> bool:
    """The kubelet has started the container (its log can be read)."""
    return _started(statuses(pod).get(name))


def has_log(pod: Mapping, name: str) -> bool:
    """The kubelet has a log of the container: it started, or it ran before and waits to be
    restarted (CrashLoopBackOff: the log is its last run's, as `kubectl logs` shows it)."""
    status = statuses(pod).get(name) or {}
    return _started(status) or "terminated" in (status.get("lastState") or {})


def has_terminated(pod: Mapping, name: str) -> bool:
    return "terminated" in ((statuses(pod).get(name) or {}).get("state") or {})


def runs_again(pod: Mapping, name: str) -> bool:
    """The kubelet will run the terminated container `name` again: a native sidecar whatever
    its code, a regular container under the pod's restartPolicy Always, a failed one (init or
    regular) under Always or OnFailure; never once the pod has ended (a Job's pod whose
    backoffLimit is spent)."""
    if pod_ended(pod):
        return False
    spec = pod.get("spec") or {}
    policy = spec.get("restartPolicy") or "Always"  # the apiserver's default
    init = next((c for c in spec.get("initContainers") or [] if isinstance(c, dict) and c.get("name") == name), None)
    if init is not None and init.get("restartPolicy") == "Always" or init is None and policy == "Always":
        return True
    ended = ((statuses(pod).get(name) or {}).get("state") or {}).get("terminated") or {}
    return policy in ("Always", "OnFailure") and ended.get("exitCode") != 0


def restarts(pod: Mapping, name: str) -> int:
    """How many times the kubelet has restarted the container (its `restartCount`)."""
    return _count((statuses(pod).get(name) or {}).get("restartCount"))


def _work_state(run: Run, done_ok: bool) -> str:
    """The state of a terminated step, main or init container."""
    if run.reason == p.REASON_SKIPPED:
        return State.SKIPPED
    if run.reason == p.REASON_STOPPED:  # the waiter's: the pod was ending before it started
        return State.NOT_STARTED
    return State.COMPLETED if done_ok else State.FAILED


def pod_view(pod: Mapping, now: datetime, settings: RewriteSettings | None = None, *,
             deletion_seen: datetime | None = None) -> PodView:
    """The pod as `initshift status` shows it. Raises NotManaged (see `_podstate.layout`).
    `deletion_seen`: when an earlier version of the pod said its deletion was asked for
    (`-w`: the kubelet's last delete of a pod a finalizer holds moves the pod's own)."""
    lay = layout(pod, settings)
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    ended = pod_ended(pod)
    status_of = statuses(pod)
    outcome = _outcome(pod)
    entries = _outcome_entries(outcome)
    runs = {n: read_run(n, status_of.get(n)) for n in [*lay.sequence, *lay.mains, *lay.all_sidecars]}
    runs.update(read_runs(pod, lay))  # a skipped step or main without a record of its own read as such
    ready_gate = ann.get(p.ANNOTATION_READY) == p.READY_TRUE
    sidecars_ready = all((status_of.get(n) or {}).get("ready") for n in lay.all_sidecars)

    def ok(name: str) -> bool:
        r = runs[name]
        return r.state == "terminated" and r.exit_code == 0 and r.reason in (p.REASON_COMPLETED, "")

    def predecessor(name: str) -> str | None:
        if name in lay.mains:
            return lay.sequence[-1] if lay.sequence else None
        i = lay.sequence.index(name)
        return lay.sequence[i - 1] if i else None

    def work_row(name: str, kind: str) -> _Row:
        """A step's, main's or init container's row."""
        run, st = runs[name], status_of.get(name) or {}
        waiting = (st.get("state") or {}).get("waiting") or {}
        waiting_reason = str(waiting.get("reason") or "")
        base = dict(name=name, kind=kind, number=lay.steps.index(name) + 1 if kind == STEP else None,
                    restarts=_count(st.get("restartCount")))
        prev = predecessor(name)
        # What the sidecars gate: the first step, or every main of a pod without steps (a Job's).
        first_step = name == lay.steps[0] if lay.steps else kind == MAIN
        if run.state == "terminated":
            entry = entries.get(name) or {}
            if not run.recorded and entry.get("reason") == NOT_RUN and name in lay.waiter_run:
                # Killed while the waiter still held it: its command never ran.
                return _Row(**base, state=State.NOT_STARTED, reason=NOT_RUN, message=run.message)
            started = run.started_at
            # Died without a record (OOMKilled): its command ran after its predecessor. One
            # that never started (StartError) has no start to place.
            if started and not run.recorded and name in lay.waiter_run:
                started = _later(started, runs[prev].finished_at if prev else None)
            return _Row(**base, state=_work_state(run, ok(name)), exit_code=run.exit_code,
                       reason=run.reason, message=run.message, started_at=started,
                       finished_at=run.finished_at, duration=_seconds(started, run.finished_at))
        # A waiter-run predecessor that died without its record (OOMKilled) never releases it.
        prev_done = prev is None or (runs[prev].state == "terminated"
                                     and (runs[prev].recorded or prev not in lay.waiter_run))
        if ended:
            return _Row(**base, state=State.NOT_STARTED, reason=NOT_RUN)
        if run.state == "running" and name in lay.waiter_run:
            # Every waiter-run container starts at once; its command runs after its predecessor.
            if not prev_done:
                return _Row(**base, state=State.WAITING_STEP, waiting_for=prev)
            if first_step and lay.all_sidecars and not ready_gate and not sidecars_ready:
                return _Row(**base, state=State.WAITING_SIDECARS)
            # The container started with the pod; its command, when its predecessor finished.
            started = _later(run.started_at, runs[prev].finished_at if prev else None)
            return _Row(**base, state=State.RUNNING, started_at=started, duration=_seconds(started, now))
        if run.state == "running":
            return _Row(**base, state=State.RUNNING, started_at=run.started_at, duration=_seconds(run.started_at, now))
        if waiting_reason not in QUIET_WAITING:
            return _Row(**base, state=State.PENDING, reason=waiting_reason, message=str(waiting.get("message") or ""))
        if not prev_done:
            return _Row(**base, state=State.WAITING_STEP, waiting_for=prev)
        if first_step and lay.strategy in (p.MODE_NATIVE, p.MODE_HYBRID) and lay.all_sidecars and not sidecars_ready:
            return _Row(**base, state=State.WAITING_SIDECARS)  # the kubelet holds it for the startup probe
        return _Row(**base, state=State.PENDING, reason=waiting_reason)

    stopped_by = outcome.get("sidecarsStoppedBy")
    rows = [_sidecar_row(name, runs[name], status_of.get(name) or {}, now, stopped_by) if lay.kind(name) == SIDECAR
            else work_row(name, lay.kind(name)) for name in [*lay.sequence, *lay.mains, *lay.all_sidecars]]

    result = str(outcome.get("result") or phase)
    message = str(outcome.get("message") or status.get("message") or "")
    return PodView(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""), strategy=lay.strategy,
        phase=phase, pod_reason=str(status.get("reason") or ""), result=result, message=message,
        # The watcher's outcome names it; a pod it writes none for (native) by its first failed row.
        failed=outcome.get("failed") if isinstance(outcome.get("failed"), str) else
        next((r.name for r in rows if r.kind != SIDECAR and r.state == State.FAILED), None),
        sidecars_stopped_by=stopped_by if isinstance(stopped_by, str) else None,
        ready=ready_gate if lay.strategy in WAITER_RUN else None, rows=tuple(rows),
        not_rewritten=str(ann[p.ANNOTATION_NOT_REWRITTEN]) if lay.strategy is None
        and ann.get(p.ANNOTATION_NOT_REWRITTEN) else None,
        startup_probes_removed=tuple(removed_startup_probes(pod)) if lay.strategy == p.MODE_HYBRID else (),
        post_start_removed=tuple(removed_post_start(pod)) if lay.strategy in (p.MODE_WAITER, p.MODE_HYBRID) else (),
        managed=managed_as(pod), deleted_at=deletion_asked(pod, deletion_seen))


def _sidecar_row(name: str, run: Run, st: dict, now: datetime, stopped_by: Any) -> _Row:
    base = dict(name=name, kind=SIDECAR, restarts=_count(st.get("restartCount")))
    ready = bool(st.get("ready")) if st else None
    if run.state == "terminated":
        how = f"stopped by {stopped_by}" if isinstance(stopped_by, str) else ""
        return _Row(**base, state=State.STOPPED, exit_code=run.exit_code, reason=run.reason,
                   message="; ".join(x for x in (how, run.message) if x), started_at=run.started_at,
                   finished_at=run.finished_at, duration=_seconds(run.started_at, run.finished_at), ready=False)
    if run.state == "running":
        return _Row(**base, state=State.RUNNING, reason="Ready" if ready else "NotReady", started_at=run.started_at,
                   duration=_seconds(run.started_at, now), ready=ready)
    waiting = str(((st.get("state") or {}).get("waiting") or {}).get("reason") or "")
    return _Row(**base, state=State.PENDING, reason=waiting, ready=ready)


def state_text(row: _Row, view: PodView) -> str:
    """The table's wording of a row's state: "waiting for step 2", "waiting for sidecars", ..."""
    if row.state == State.WAITING_STEP and row.waiting_for:
        other = view.row(row.waiting_for)
        return f"waiting for step {other.number}" if other.number else f"waiting for {other.name}"
    if row.state == State.WAITING_SIDECARS:
        return "waiting for sidecars"
    if row.state == State.NOT_STARTED:
        return "not run"
    return row.state


@dataclass(frozen=True)
class LogPlan:
    sequential: list[str]  # shown one after the other: steps, then mains
    concurrent: list[str]  # shown alongside: the sidecars (with --sidecars)
    waiter_run: frozenset[str]  # their logs hold the waiter's own lines too


def log_plan(pod: Mapping, *, sidecars: bool = False, settings: RewriteSettings | None = None) -> LogPlan:
    """The containers `initshift logs` streams; with `sidecars`, the kept init containers
    (mesh init, initshift-init) come first and the sidecars run alongside. Raises NotManaged."""
    lay = layout(pod, settings)
    work = [n for n in lay.sequence if sidecars or n in lay.steps]
    return LogPlan([*work, *lay.mains], list(lay.all_sidecars) if sidecars else [], lay.waiter_run)


def is_waiter_line(line: str) -> bool:
    """One of the waiter's own stderr lines (waiter/log.py), not the step's output."""
    return bool(_WAITER_LINE.match(line))
