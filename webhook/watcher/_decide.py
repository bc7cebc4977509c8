"""The watcher's decisions: a pure function from a pod dict (and the time) to actions.

No I/O here. `decide()` reads the annotations the webhook wrote and the kubelet's
container statuses and returns the merge patches to apply, in order, and when to look
again if nothing changes (a grace period or a timeout running out); `notices()` says which
Events the pod's state shows actions for. Level-triggered: the same pod always gives the
same answer, so a missed event, a restart or a second replica only repeats work that is
already idempotent.

The write budget of a build pod on the happy path: one patch (the outcome, with
`activeDeadlineSeconds` in the same merge patch when the sidecars must be ended) and one
Event (the outcome's). The ready annotation costs one more patch, and only in pods whose
gate reads it (`Layout.reads_ready`: no loopback probe the waiter could check itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from waiter import protocol as p

from ..rewrite import managed_as
from ..settings import WatcherSettings
from ._podstate import (MESSAGE_LIMIT, Layout, Run, deletion_asked, json_int, layout, parse_time, pod_ended, ran_at,
                        read_run, read_runs, statuses)

# Outcome JSON (annotation initshift.io/outcome), documented in docs/watcher.md.
SUCCEEDED = "Succeeded"
FAILED = "Failed"
_STOPPED_QUIT = "quit"  # the sidecars exited before the watcher had to act (the last main's quit)
_STOPPED_DEADLINE = "deadline"  # the watcher set activeDeadlineSeconds
_STOPPED_NATIVE = "native"  # only native sidecars: the kubelet stops them
_STOPPED_NONE = "none"  # no sidecars
_STOPPED_DELETION = "deletion"  # the pod was deleted (an eviction is one): the kubelet stopped them
# Waiter records of runs that did not fail for their own reason: an earlier one did, or the pod ended.
_NOT_THEIR_OWN = (p.REASON_SKIPPED, p.REASON_STOPPED)

# Event reasons.
_EVENT_SUCCEEDED = "StepsSucceeded"
_EVENT_FAILED = "StepsFailed"
_EVENT_ENDED = "SidecarsEnded"

_DEADLINE = 1  # activeDeadlineSeconds that ends a running pod at once
_DEFAULT_GRACE = 30  # the apiserver's default terminationGracePeriodSeconds
_REPORT_SECONDS = 5.0  # a stopped container's end reaches the pod's status within this (after its grace)

# An Event is news for this long after the outcome it reports (its `decidedAt`): long
# enough for a backlog or a takeover to send it, far inside the apiserver's Event TTL (1 h
# by default). A watcher that starts later and finds the pod's Event gone (expired) does
# not write it again.
EVENT_NEWS_SECONDS = 300.0

# How urgent a write is (lower first): the work queue serves a pod whose write ends it or
# opens a gate before one whose write only records what happened.
URGENT = 0  # ends a pod (activeDeadlineSeconds) or opens a gate (ready annotations)
RECORD = 1  # an outcome that ends nothing (the sidecars have stopped or the pod has ended)


@dataclass(frozen=True)
class Action:
    """One merge patch."""

    kind: str  # "ready", "outcome", "end" or "container-ready" (start-order pods)
    patch: dict
    message: str  # what the log line says
    outcome: dict | None = None  # for kind == "outcome"
    ends: bool = False  # the patch sets activeDeadlineSeconds: the kubelet ends the pod

    @property
    def priority(self) -> int:
        return URGENT if self.ends or self.kind in ("ready", "end", "container-ready") else RECORD


@dataclass(frozen=True)
class Decision:
    actions: list[Action] = field(default_factory=list)
    requeue_after: float | None = None  # look again after this many seconds
    ready_latency: float | None = None  # the gate opens in this decision: seconds since the pod started
    gate_open: bool = False  # every sidecar has been Ready while the pod ran (or the annotation says so)

    @property
    def priority(self) -> int | None:
        """The most urgent of the actions' priorities; None without actions."""
        return min((a.priority for a in self.actions), default=None)


# How long the steps after a failed one that leaves no record by design may take to skip.
_SKIP_GRACE_SECONDS = 10.0


def format_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _terminated(status: dict | None) -> bool:
    return "terminated" in ((status or {}).get("state") or {})


def _running(status: dict | None) -> bool:
    """Not yet terminated: a sidecar that still holds the pod open."""
    return status is None or not _terminated(status)


_CONDITION_TIME = ("type", "lastTransitionTime")
_CONDITION_KEYS = {"DisruptionTarget": ("type", "status", "reason", "message", "lastTransitionTime")}


def slim_pod(pod: dict) -> dict:
    """The part of a pod that `decide()` and `notices()` read (and the ready patch of
    start-order pods): what the watcher keeps of each pod in flight, a fraction of the whole."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    prefix = f"{p.GROUP}/"
    slim_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp",
                                      "deletionTimestamp", "deletionGracePeriodSeconds") if k in meta}
    slim_meta["labels"] = {k: v for k, v in (meta.get("labels") or {}).items() if k == p.LABEL_MANAGED}
    slim_meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(prefix)}
    containers = []
    for c in spec.get("containers") or []:
        if isinstance(c, dict):
            entry = {"name": c.get("name")}
            if isinstance(c.get("command"), list) and c["command"]:
                entry["command"] = c["command"][:1]  # only whether the waiter runs it
            if isinstance(c.get("args"), list):
                entry["args"] = _gate_args(c["args"])
            if "terminationMessagePath" in c:  # (with --termination-log: `Layout.unrecorded` reads it)
                entry["terminationMessagePath"] = c["terminationMessagePath"]
            containers.append(entry)
    slim_spec: dict[str, Any] = {
        "containers": containers,
        "initContainers": [{"name": c.get("name"), "restartPolicy": c.get("restartPolicy")}
                           for c in spec.get("initContainers") or [] if isinstance(c, dict)],
        "volumes": [v for v in spec.get("volumes") or []
                    if isinstance(v, dict) and v.get("name") == p.CONTAINER_READY_VOLUME],
    }
    for key in ("activeDeadlineSeconds", "restartPolicy", "terminationGracePeriodSeconds"):
        if key in spec:
            slim_spec[key] = spec[key]
    slim_status = {k: status[k] for k in ("phase", "reason", "message", "startTime") if k in status}
    if isinstance(status.get("conditions"), list):  # (when each last changed: `_report_left` reads it;
        # and the whole of DisruptionTarget: the outcome of an evicted pod names it)
        slim_status["conditions"] = [{k: c[k] for k in _CONDITION_KEYS.get(c.get("type"), _CONDITION_TIME) if k in c}
                                     for c in status["conditions"] if isinstance(c, dict)]
    for key in ("containerStatuses", "initContainerStatuses"):
        if key in status:
            slim_status[key] = [{k: s[k] for k in ("name", "ready", "state") if k in s}
                                for s in status[key] or [] if isinstance(s, dict)]
    return {"metadata": slim_meta, "spec": slim_spec, "status": slim_status}


def _gate_args(args: list) -> list:
    """The waiter's subcommand, its gate flags (what `Layout.ready_readers` reads) and where
    it writes its record (`Layout.unrecorded`), not the rest of its command line nor the
    user's argv."""
    out = args[:1]
    for i in range(1, len(args) - 1):
        if args[i] == p.ARGV_SEPARATOR:
            break
        if args[i] in (p.FLAG_READY_FILE, p.FLAG_PROBE, p.FLAG_TERMINATION_LOG):
            out += args[i:i + 2]
    return [*out, p.ARGV_SEPARATOR]


# --- the decision --------------------------------------------------------------------------
def decide(pod: dict, now: datetime, settings: WatcherSettings, *, gate_seen_open: bool = False,
           watched_since: datetime | None = None, deletion_seen: datetime | None = None) -> Decision:
    """`gate_seen_open`: the caller saw this pod's gate open before (every sidecar Ready
    while it ran), which the pod itself does not record when the watcher had nothing to
    write for it (a gate of loopback probes) until a step or main has run its command; a
    sidecar that is not Ready later then does not fail the pod, as it does not once the
    ready annotation is written. `watched_since`: when the caller first saw the pod.
    `deletion_seen`: the earliest deletion the caller saw asked for it (`deletion_asked`)."""
    meta = pod.get("metadata") or {}
    if managed_as(pod) == p.MANAGED_START_ORDER:
        return _decide_start_order(pod)
    ann = meta.get("annotations") or {}
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    ended = pod_ended(pod)
    lay = layout(pod)
    cs = ics = statuses(pod)  # names are unique across both lists
    runs = read_runs(pod, lay)
    running_sidecars = [n for n in lay.sidecars if _running(cs.get(n))]
    # Hybrid's initshift-copy is a regular container: while it has not ended (its image
    # cannot be pulled: the kubelet ran the steps anyway, without their waiter) the pod
    # cannot end, and the kubelet keeps the native proxy running, as a running sidecar would.
    holding = running_sidecars + [n for n in lay.regular_inits if _running(cs.get(n))]
    # Our containers before the work that cannot start (their image cannot be pulled).
    unstartable = [r for r in (read_run(n, cs.get(n)) for n in lay.inits) if r.cannot_start]
    stuck = [r for r in unstartable if r.name in lay.regular_inits]
    deadline_set = isinstance((pod.get("spec") or {}).get("activeDeadlineSeconds"), int) and \
        pod["spec"]["activeDeadlineSeconds"] <= _DEADLINE
    # A pod being deleted (or evicted) is being ended by the kubelet: never given a deadline.
    deleted = deletion_asked(pod, deletion_seen)
    ending = ended or deadline_set or deleted is not None  # nothing for the watcher to end

    if p.ANNOTATION_OUTCOME in ann:
        # The outcome is written once; what is left is ending a pod that is still running.
        blocked = any(r.state != "terminated" for r in runs.values())
        return _end(lay, runs, holding, ending, blocked, now, settings, None, stuck)

    actions: list[Action] = []
    latency = None
    # A gate of loopback probes leaves no mark on the pod but this: a step or main whose
    # command the waiter started passed it (later ones run only after step 0's success). A
    # watcher that restarted since, and so never saw the gate open, then still knows it did.
    probed = not lay.reads_ready
    gate_open = ann.get(p.ANNOTATION_READY) == p.READY_TRUE or \
        (probed and (gate_seen_open or any(r.ran_command for r in runs.values())))
    started = parse_time(status.get("startTime")) or parse_time(meta.get("creationTimestamp"))
    elapsed = (now - started).total_seconds() if started else 0.0
    # While step 0 runs, such a gate may have opened before this watcher came (a restart, a
    # rollout) with nothing on the pod to say so: the sidecars' timeout counts from when it
    # first saw the pod, so a running build whose proxy is not Ready at that moment is not
    # failed for it; one whose gate never opened is failed that much later.
    waited = elapsed
    if probed and watched_since is not None and lay.work and runs[lay.work[0]].state in ("running", "terminated"):
        waited = min(elapsed, (now - watched_since).total_seconds())
    unready = [n for n in lay.sidecars if not (cs.get(n) or {}).get("ready")] + \
              [n for n in lay.native if not (ics.get(n) or {}).get("ready")]
    requeue: float | None = None
    # restartPolicy OnFailure: the kubelet restarts a failed step or main (the Job controller
    # ends the pod once its backoffLimit is spent), so only a success, or the pod's end, is final.
    retried = (pod.get("spec") or {}).get("restartPolicy") == "OnFailure" and not ended
    all_done = bool(runs) and all(r.state == "terminated" and (r.ok or not retried) for r in runs.values())

    if not gate_open and not ended and not all_done:
        if not unready and (phase == "Running" or not (lay.sidecars or lay.native)):
            gate_open, latency = True, elapsed
            if lay.reads_ready:  # else the waiter's own probes open it (or it has no gate)
                sidecars = lay.sidecars + lay.native
                what = f"sidecars {', '.join(sidecars)} Ready" if sidecars else "no sidecars"
                actions.append(Action("ready", {"metadata": {"annotations": {p.ANNOTATION_READY: p.READY_TRUE}}},
                                      f"{what} after {elapsed:.1f}s; {_may_start(lay)}"))
        elif waited >= settings.sidecar_ready_timeout_seconds:
            names = unready or lay.sidecars + lay.native
            msg = f"sidecar {', '.join(names)} not Ready after {settings.sidecar_ready_timeout_seconds:g}s"
            # What kept them from starting, when it is not theirs (initshift-init's image).
            if unstartable:
                msg += f": {unstartable[0].name} cannot start ({unstartable[0].waiting})"
            return _fail_now(pod, lay, runs, running_sidecars, names[0], msg, now, settings, deadline_set, deleted)
        else:
            requeue = settings.sidecar_ready_timeout_seconds - waited

    order = lay.work
    # A step that died without its waiter's record (OOMKilled, killed, could not run)
    # leaves every later container waiting for a completion file that never comes.
    for i, name in enumerate(lay.steps):
        r = runs[name]
        if r.state == "terminated" and not r.recorded and not r.ok and not retried and \
                any(runs[later].state != "terminated" for later in order[i + 1:]) and not ended:
            msg = f"{name} terminated without completing: {r.summary()}"
            if name in lay.unrecorded:
                # No record by design: its waiter most likely did complete, and those after
                # it skip within milliseconds, the kubelet reporting them within a second or
                # two. Only if they have not after _SKIP_GRACE_SECONDS will nothing finish it.
                finished = parse_time(r.finished_at)
                left = _SKIP_GRACE_SECONDS - (now - finished).total_seconds() if finished else 0.0
                if left > 0:
                    requeue = left if requeue is None else min(requeue, left)
                    continue
                msg = f"{name} failed: {r.summary()}; what follows it did not end within {_SKIP_GRACE_SECONDS:g}s"
            return Decision(actions + _fail_now(pod, lay, runs, running_sidecars, name, msg, now, settings,
                                                deadline_set, deleted).actions, None, latency, gate_open)

    # A step that failed for good: what comes after it only skips, each on its predecessor's
    # record, but a container the kubelet cannot create (its image, a ConfigMap its env names)
    # never runs to skip, and every one after it waits for ever. Without initshift the pod
    # ends Failed at once, its later init containers never created.
    first_failed = next((runs[n] for n in lay.steps if runs[n].state == "terminated" and not runs[n].ok), None)
    if first_failed is not None and not retried and not ended:
        later = [runs[n] for n in order[order.index(first_failed.name) + 1:]]
        blocked = next((r for r in later if r.cannot_start), None)
        if blocked is not None and all(r.state == "terminated" for r in later[:later.index(blocked)]):
            msg = f"{first_failed.name} failed: {first_failed.summary()}; {blocked.name} cannot start ({blocked.waiting})"
            return Decision(actions + _fail_now(pod, lay, runs, running_sidecars, first_failed.name, msg, now, settings,
                                                deadline_set, deleted).actions, None, latency, gate_open)

    if ended and not all_done:
        # The pod ended around unfinished work (evicted, the user's own deadline, deleted node).
        left = _report_left(pod, runs, cs, now)
        if left > 0:  # the kubelet has yet to report how a container it stopped ended
            return Decision(actions, left, latency, gate_open)
        first = next(r for r in (runs[n] for n in order) if r.state != "terminated" or not r.ok)
        why = _ended_why(status) or (_deleted_at(deleted) if deleted is not None else f"pod {phase}")
        outcome = _outcome(lay, runs, first.name, f"pod ended before {first.name} finished ({why})", now,
                           _STOPPED_DEADLINE if status.get("reason") == "DeadlineExceeded"
                           else _stopped(lay, None, cs, deleted))
        return Decision(actions + [_outcome_action(meta, outcome)], None, latency, gate_open)

    if not all_done:
        return Decision(actions, requeue, latency, gate_open)

    # Every step and main has terminated: wait (up to the grace period) for the sidecars
    # to stop on their own, so the outcome can say how they stopped; then write it once.
    # One that cannot start will not end in any grace period: the pod is ended at once.
    left = 0.0 if stuck else _grace_left(runs, now, settings)
    if holding and not ended and not deadline_set and left > 0:
        return Decision(actions, left, latency, gate_open)
    failed = next((r for r in (runs[n] for n in order) if not r.ok and r.reason not in _NOT_THEIR_OWN), None) \
        or next((r for r in (runs[n] for n in order) if not r.ok), None)
    if failed is None:
        mains = _counted(len(lay.mains), "main")
        message = f"{_counted(len(lay.steps), 'step')} and {mains} succeeded" if lay.steps else f"{mains} succeeded"
    else:
        message = f"{failed.name} failed: {failed.summary()}"
        # The kubelet stopped every container for a reason of the pod's (its own deadline, an
        # eviction): the waiter saw only the signal. An evicted pod's containers can all be
        # reported ended before its phase.
        why = _ended_why(status) if ended else _disrupted_why(status)
        if why:
            message += f" (the pod ended: {why})"
        elif deleted is not None and _since(failed.finished_at, deleted):  # (a failure of its own, then deleted: not)
            message += f" ({_deleted_at(deleted)})"
        if stuck:  # the steps ran without their waiter (StartError): this is why
            message += f"; {stuck[0].name} cannot start ({stuck[0].waiting})"
    end_now = bool(holding) and not ending
    stopped = _STOPPED_DEADLINE if end_now else _stopped(lay, status, cs, deleted)
    outcome = _outcome(lay, runs, failed.name if failed else None, message, now, stopped)
    actions.append(_outcome_action(meta, outcome, _holders_deadline(holding, stuck, settings) if end_now else None))
    return Decision(actions, None, latency, gate_open)


def _report_left(pod: dict, runs: dict[str, Run], cs: dict[str, dict], now: datetime) -> float:
    """Seconds to wait for the kubelet's report of a step or main an ended pod still shows
    running. The kubelet may publish the pod's terminal phase (its deadline, an eviction)
    before the ends of the containers it then stops (kubernetes#98718; seen on v1.34.9 under
    load), and the outcome, written once, would call a stopped container `NotRun`. The kubelet
    stops a container within the pod's grace period; its report follows within seconds.
    Counted from the pod's last reported change (the kubelet's clock, so replicas agree); a
    report that never comes (a lost node) leaves such a container `NotRun`."""
    if not any(r.state == "running" for r in runs.values()):
        return 0.0
    grace = json_int((pod.get("spec") or {}).get("terminationGracePeriodSeconds"))
    grace = _DEFAULT_GRACE if grace is None else grace
    status = pod.get("status") or {}
    conditions = status.get("conditions") if isinstance(status.get("conditions"), list) else []
    times = [parse_time(status.get("startTime"))] + \
        [parse_time(c.get("lastTransitionTime")) for c in conditions if isinstance(c, dict)] + \
        [parse_time(ran_at(s["state"]["terminated"].get("finishedAt")))
         for s in cs.values() if "terminated" in s["state"]]
    known = [t for t in times if t]
    if not known:
        return 0.0
    return grace + _REPORT_SECONDS - (now - max(known)).total_seconds()


def _ended_why(status: dict) -> str:
    """Why the kubelet ended the pod, in its words ("DeadlineExceeded: Pod was active ..."),
    else why the pod is being disrupted."""
    return _reason_and_message(status) or _disrupted_why(status)


def _disrupted_why(status: dict) -> str:
    """The pod's DisruptionTarget condition, which the apiserver sets as it deletes a pod
    for an eviction ("EvictionByEvictionAPI: Eviction API: evicting": `kubectl drain`), a
    preemption or a taint: the kubelet then stops every container, the pod's own reason
    empty, and each waiter sees only the SIGTERM."""
    conditions = status.get("conditions") if isinstance(status.get("conditions"), list) else []
    target = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "DisruptionTarget"
                   and c.get("status") == "True"), None)
    if target is None:
        return ""
    return _reason_and_message(target) or "DisruptionTarget"


def _reason_and_message(obj: dict) -> str:
    """`reason: message` of a status or a condition, each where it is a string."""
    return ": ".join(x for x in (obj.get("reason"), obj.get("message")) if isinstance(x, str) and x)


def _may_start(lay: Layout) -> str:
    return "steps may start" if lay.steps or not lay.mains else "mains may start"


def _decide_start_order(pod: dict) -> Decision:
    """Start-order pods: keep each `initshift.io/ready-<name>` annotation equal to the
    kubelet's readiness (no Event: readiness flips are not news)."""
    from ..rewrite import start_order_ready_patch

    patch = start_order_ready_patch(pod)
    return Decision([Action("container-ready", patch, "container readiness for the start order")]) if patch \
        else Decision()


def _stopped(lay: Layout, status: dict | None, cs: dict[str, dict], deleted: datetime | None) -> str:
    if status is not None and status.get("reason") == "DeadlineExceeded" and lay.sidecars:
        return _STOPPED_DEADLINE
    if lay.sidecars:
        # Running when the pod's deletion was asked for: the kubelet's SIGTERM stops them.
        if deleted is not None and any(_since(read_run(n, cs.get(n)).finished_at, deleted) for n in lay.sidecars):
            return _STOPPED_DELETION
        return _STOPPED_QUIT
    return _STOPPED_NATIVE if lay.native else _STOPPED_NONE


def _deleted_at(at: datetime) -> str:
    return f"the pod was deleted at {format_time(at)}"


def _since(finished: str | None, at: datetime) -> bool:
    """A container still running (`finished` None), or one that ended no earlier than `at`
    (to the second, as the kubelet and the apiserver write both)."""
    t = parse_time(finished)
    return t is None or t >= at


def _last_finish(runs: Any) -> datetime | None:
    times = [t for t in (parse_time(r.finished_at) for r in runs) if t]
    return max(times) if times else None


def _outcome(lay: Layout, runs: dict[str, Run], failed: str | None, message: str, now: datetime,
             stopped: str) -> dict:
    return {
        "result": FAILED if failed else SUCCEEDED,
        "failed": failed,
        "message": message[:MESSAGE_LIMIT],
        "steps": [runs[n].to_json() for n in lay.steps],
        "mains": [runs[n].to_json() for n in lay.mains],
        "sidecarsStoppedBy": stopped,
        "decidedAt": format_time(now),
    }


def _outcome_action(meta: dict, outcome: dict, end: Action | None = None) -> Action:
    """The outcome's patch, with `end`'s (activeDeadlineSeconds) in the same merge patch: one
    write records the build and ends the pod, and the outcome is never written after it."""
    # Conditional on the resourceVersion the decision was made from: a second replica
    # (or a stale cache) gets 409, re-reads, sees the outcome and leaves it alone.
    patch: dict = {"metadata": {"annotations": {p.ANNOTATION_OUTCOME: json.dumps(outcome, separators=(",", ":"))}}}
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
    message = f"{outcome['result']}: {outcome['message']}"
    if end is None:
        return Action("outcome", patch, message, outcome=outcome)
    return Action("outcome", {**patch, **end.patch}, f"{message}; {end.message}", outcome=outcome, ends=True)


def _outcome_event(outcome: dict) -> tuple[str, str, bool]:
    ok = outcome.get("result") == SUCCEEDED
    return (_EVENT_SUCCEEDED if ok else _EVENT_FAILED,
            f"{outcome.get('result')}: {outcome.get('message')}; sidecars stopped by {outcome.get('sidecarsStoppedBy')}",
            not ok)


@dataclass(frozen=True)
class Notice:
    """An Event the pod's state says is due, known by the kind of the action it reports (so
    a replica that did not act can still tell it is due, and send it, with the same words)."""

    kind: str
    reason: str
    message: str
    warning: bool = False


def notices(pod: dict, now: datetime) -> list[Notice]:
    """The Events the pod's state shows actions for, while they are news (EVENT_NEWS_SECONDS
    after the outcome was decided): one for the outcome (which tells how the sidecars
    stopped, the deadline included when it came with the outcome), and one for a deadline
    set apart from it (an outcome written before, by another watcher). The ready annotation
    gets none: it is on the pod itself, and the outcome's Event follows soon. Start-order
    pods: none (readiness flips are not news)."""
    if managed_as(pod) == p.MANAGED_START_ORDER:
        return []
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        outcome = json.loads(ann[p.ANNOTATION_OUTCOME]) if p.ANNOTATION_OUTCOME in ann else None
    except ValueError:
        outcome = None
    if not isinstance(outcome, dict):
        return []
    decided = parse_time(outcome.get("decidedAt"))
    if decided is None or (now - decided).total_seconds() > EVENT_NEWS_SECONDS:
        return []  # old news (every outcome initshift writes says when it was decided)
    out = [Notice("outcome", *_outcome_event(outcome))]
    ads = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    if isinstance(ads, int) and ads <= _DEADLINE and outcome.get("sidecarsStoppedBy") != _STOPPED_DEADLINE:
        out.append(Notice("end", _EVENT_ENDED, f"ending the pod (activeDeadlineSeconds={_DEADLINE})", True))
    return out


def _deadline_action(message: str) -> Action:
    return Action("end", {"spec": {"activeDeadlineSeconds": _DEADLINE}},
                  f"{message} (activeDeadlineSeconds={_DEADLINE})", ends=True)


def _fail_now(pod: dict, lay: Layout, runs: dict[str, Run], running_sidecars: list[str], failed: str,
              message: str, now: datetime, settings: WatcherSettings, deadline_set: bool,
              deleted: datetime | None) -> Decision:
    """A Failed outcome naming `failed`, then the pod ended at once (nothing will finish it)."""
    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
    ended = pod_ended(pod)
    stopped = _STOPPED_DEADLINE if (lay.sidecars or lay.native) and not ended and deleted is None \
        else _stopped(lay, status, statuses(pod), deleted)
    outcome = _outcome(lay, runs, failed, message, now, stopped)
    end = _end(lay, runs, running_sidecars, ended or deadline_set or deleted is not None, True, now, settings,
               None).actions
    return Decision([_outcome_action(meta, outcome, end[0] if end else None)], None)


def _end(lay: Layout, runs: dict[str, Run], holding: list[str], done: bool, blocked: bool,
         now: datetime, settings: WatcherSettings, why: str | None, stuck: list[Run] | None = None) -> Decision:
    """After the outcome: end a pod that would otherwise keep running.

    Blocked work (a step or main that will never run) ends it at once, and so does a
    container before the steps that cannot start (`stuck`); sidecars still running
    (`holding`) end it once the grace period after the last step or main has passed.
    """
    if done:
        return Decision()
    if blocked:
        return Decision([_deadline_action(f"{why or 'steps cannot finish'}; ending the pod")])
    if not holding:
        return Decision()
    left = 0.0 if stuck else _grace_left(runs, now, settings)
    if left > 0:
        return Decision(requeue_after=left)
    return Decision([_holders_deadline(holding, stuck or [], settings)])


def _grace_left(runs: dict[str, Run], now: datetime, settings: WatcherSettings) -> float:
    """Seconds of the grace period left, counted from the last step's or main's finish (the
    kubelet's time, so every replica agrees)."""
    anchor = _last_finish(runs.values()) or now
    return settings.grace_seconds - (now - anchor).total_seconds()


def _holders_deadline(holding: list[str], stuck: list[Run], settings: WatcherSettings) -> Action:
    if stuck:
        return _deadline_action(f"{stuck[0].name} cannot start ({stuck[0].waiting}) after the last step; "
                                f"ending the pod")
    return _deadline_action(f"sidecars {', '.join(holding)} still running "
                            f"{settings.grace_seconds:g}s after the last step; ending the pod")


def _counted(n: int, noun: str) -> str:
    """`1 step`, `2 steps`."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
