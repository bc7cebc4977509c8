"""The one reader of a managed pod's state: which container is what (`layout`), each
container's status (`statuses`), and what a step or main did (`read_run`: the waiter's
record in the termination message, else the kubelet's; `read_runs`: every step's and
main's, a skip without a record read from the order). Pure functions over pod JSON;
the watcher's decisions and `initshift status`/`logs` read pods only through these.

Three kinds of pods read the same way:
- waiter and hybrid (`initshift.io/managed: waiter|hybrid`): steps and mains from the
  annotations, run by the waiter as regular containers; the kept init containers (mesh init,
  initshift-init) and hybrid's `initshift-copy` run first; every other container is a sidecar;
- native (`initshift.io/managed: native`) and never rewritten: the non-restartable init
  containers run in spec order (the mesh's own and kept ones are `init`, the rest are
  steps), regular sidecars are recognised as the rewrite does, restartable init
  containers are sidecars, the rest are mains.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

from waiter import protocol as p
from waiter.record import skip_message

from ..rewrite import classify, gate_of, is_restartable, managed_as
from ..settings import RewriteSettings
from ..errors import InitshiftError

# Container kinds.
INIT, STEP, MAIN, SIDECAR = "init", "step", "main", "sidecar"
WAITER_RUN = (p.MODE_WAITER, p.MODE_HYBRID)  # strategies whose steps the waiter runs as regular containers
NOT_RUN = "NotRun"  # reason recorded for a step or main that never finished
_RECORD_KEYS = ("name", "exitCode", "reason")  # a waiter termination message has these
# Kubelet reasons that say no more than the waiter's record does; any other (OOMKilled,
# Evicted, ContainerCannotRun, ...) or a signal is news the outcome must name.
_PLAIN_KUBELET_REASONS = ("", p.REASON_COMPLETED, "Error")
# The waiter's reasons for a command it started (Skipped, Stopped and WaiterError start none).
_COMMAND_RAN = (p.REASON_COMPLETED, p.REASON_ERROR, p.REASON_TIMED_OUT)
MESSAGE_LIMIT = 1024
SUMMARY_LIMIT = 240  # a container's own message within the outcome's one-line message
ENDED_PHASES = ("Succeeded", "Failed")  # a pod in either phase runs nothing any more
# The kubelet's waiting reasons that only mean "not yet"; any other (ImagePullBackOff,
# CreateContainerConfigError, ...) says it cannot create the container as it is.
QUIET_WAITING = ("", "ContainerCreating", "PodInitializing")


class NotManaged(InitshiftError, ValueError):
    """The pod has nothing initshift can show: not rewritten and no init containers."""


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


# The Unix epoch: what the kubelet reports as the start of a container that never started
# (StartError: containerd's zero time), and of nothing that ran.
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def ran_at(value: Any) -> str | None:
    """A container state's `startedAt`/`finishedAt` as the kubelet wrote it, or None when it
    names no instant: absent, unreadable or the zero time (the Unix epoch, which the
    kubelet reports for a container that never started). The one rule for "never started"."""
    t = parse_time(value)
    return value if t is not None and t > _EPOCH else None


def json_int(value: Any) -> int | None:
    """A JSON integer field's value (JSON's true and false are not numbers here), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def pod_ended(pod: Mapping) -> bool:
    """The pod has ended: the kubelet runs none of its containers any more."""
    status = pod.get("status")
    return isinstance(status, dict) and status.get("phase") in ENDED_PHASES


def deletion_asked(pod: Mapping, seen: datetime | None = None) -> datetime | None:
    """When the pod's deletion was asked for (an eviction is one: the kubelet is stopping
    every container), None if it was not: its `deletionTimestamp` less the grace period it
    was given (the apiserver sets both), or `seen`, an earlier one the caller saw, if any.

    A pod a finalizer holds (a Job's pods carry `batch.kubernetes.io/job-tracking`) loses
    the time it was asked at: once its containers have stopped, the kubelet deletes it again
    with no grace, and an apiserver with kubernetes#122646 (v1.34.9 has it, v1.28.15 keeps
    the time asked) then sets `deletionTimestamp` to that moment, grace 0.
    Only a watcher that saw the first deletion still knows it."""
    meta = pod.get("metadata") or {}
    at = parse_time(meta.get("deletionTimestamp"))
    asked = at - timedelta(seconds=json_int(meta.get("deletionGracePeriodSeconds")) or 0) if at else None
    return asked if seen is None or asked is None else min(asked, seen)


def _json_list(value: Any) -> list[str] | None:
    try:
        names = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else None


@dataclass(frozen=True)
class Layout:
    """Names by kind, each list in execution order; `sequence` is what runs one after the other."""

    strategy: str | None  # "waiter", "hybrid", "native" or None (never rewritten)
    inits: list[str]  # what runs before the steps (mesh init, initshift-init, kept ones, initshift-copy)
    steps: list[str]
    mains: list[str]
    sidecars: list[str]  # regular containers that are sidecars
    native: list[str]  # native sidecars: init containers with restartPolicy Always
    sequence: list[str]  # inits and steps interleaved as they run (mains wait for its last)
    in_init: frozenset[str]  # names whose status is in initContainerStatuses
    waiter_run: frozenset[str]  # containers whose command is the waiter
    # Containers whose ready gate is the `initshift.io/ready` annotation alone: the waiter
    # reads its downward-API file and has no loopback probe to check the sidecars itself.
    # The one rule for "the watcher writes the ready annotation": only for such pods.
    ready_readers: frozenset[str] = frozenset()
    # Waiter-run containers whose termination message is not the waiter's record by design: the
    # pod sets its own terminationMessagePath (the program's), or the waiter writes its record
    # elsewhere (`--termination-log`: FallbackToLogsOnError). Their reports are the kubelet's.
    unrecorded: frozenset[str] = frozenset()

    @property
    def reads_ready(self) -> bool:
        return bool(self.ready_readers)

    @property
    def work(self) -> list[str]:
        return self.steps + self.mains

    @property
    def regular_inits(self) -> list[str]:
        """What runs before the steps as a regular container (hybrid's `initshift-copy`): the
        kubelet starts the steps whether or not it ran, and ends the pod only after it."""
        return [n for n in self.inits if n not in self.in_init]

    @property
    def all_sidecars(self) -> list[str]:
        return self.native + self.sidecars

    def kind(self, name: str) -> str:
        return STEP if name in self.steps else MAIN if name in self.mains else \
            INIT if name in self.inits else SIDECAR


def _strategy_of(pod: Mapping) -> str | None:
    value = managed_as(pod)
    return value if value in (p.MODE_WAITER, p.MODE_HYBRID, p.MODE_NATIVE) else None


def layout(pod: Mapping, settings: RewriteSettings | None = None) -> Layout:
    """Raises NotManaged for a pod that is not rewritten and has no init containers."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    inits = [c for c in spec.get("initContainers") or [] if isinstance(c, dict) and isinstance(c.get("name"), str)]
    regular = [c for c in spec.get("containers") or [] if isinstance(c, dict) and isinstance(c.get("name"), str)]
    strategy = _strategy_of(pod)
    sequential = [c["name"] for c in inits if not is_restartable(c)]
    native = [c["name"] for c in inits if is_restartable(c)]
    waiter_run = frozenset(c["name"] for c in regular
                           if isinstance(c.get("command"), list) and c["command"][:1] == [p.WAITER_PATH])
    in_init = frozenset(c["name"] for c in inits)
    readers = frozenset(c["name"] for c in regular if c["name"] in waiter_run and _reads_ready(c))
    names = [c["name"] for c in regular]
    if strategy in WAITER_RUN:
        steps = [n for n in _json_list(annotations.get(p.ANNOTATION_STEPS)) or [] if n in names]
        if p.ANNOTATION_MAINS in annotations:
            mains = [n for n in _json_list(annotations[p.ANNOTATION_MAINS]) or [] if n not in steps and n in names]
        else:  # pods written before the mains annotation: a waiter-run container is a main
            mains = [n for n in names if n not in steps and n in waiter_run]
        copier = [n for n in names if n == p.COPY_CONTAINER_NAME and n not in steps and n not in mains]
        sidecars = [n for n in names if n not in steps and n not in mains and n not in copier]
        first = sequential + copier  # hybrid's copier is the init containers' last word: step 0 follows it
        unrecorded = frozenset(c["name"] for c in regular if c["name"] in waiter_run and _records_elsewhere(c))
        return Layout(strategy, first, steps, mains, sidecars, native, first + steps, in_init, waiter_run, readers,
                      unrecorded)
    if strategy is None and not sequential:
        label = managed_as(pod)
        why = f"{p.LABEL_MANAGED} is {label!r}, a long-running pod" if label else f"{p.LABEL_MANAGED} is not set"
        raise NotManaged(f"pod {meta.get('name', '')} is not managed by initshift as a build ({why}) "
                         f"and has no init containers to show")
    cls = classify(pod, settings or RewriteSettings())
    annotated = _json_list(annotations.get(p.ANNOTATION_STEPS))
    steps = [n for n in annotated if n in sequential] if annotated else [c["name"] for c in cls.steps]
    sidecars = [c["name"] for c in cls.sidecars]
    mains = [n for n in names if n not in sidecars and n not in native]
    return Layout(strategy, [n for n in sequential if n not in steps], steps, mains, sidecars, native,
                  sequential, in_init, waiter_run)


def _records_elsewhere(container: Mapping) -> bool:
    if container.get("terminationMessagePath") not in (None, p.DEFAULT_TERMINATION_LOG):
        return True
    args = container.get("args") if isinstance(container.get("args"), list) else []
    flags = args[:args.index(p.ARGV_SEPARATOR)] if p.ARGV_SEPARATOR in args else args
    return p.FLAG_TERMINATION_LOG in flags


def _reads_ready(container: Mapping) -> bool:
    ready_file, probes = gate_of(container)
    return ready_file is not None and not probes


def statuses(pod: Mapping) -> dict[str, dict]:
    """Container statuses by name, both lists; a malformed entry or state is left out."""
    status = pod.get("status")
    out: dict[str, dict] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        entries = status.get(key) if isinstance(status, dict) else None
        for s in entries if isinstance(entries, list) else []:
            if isinstance(s, dict) and isinstance(s.get("name"), str):
                state = s.get("state") if isinstance(s.get("state"), dict) else {}
                out[s["name"]] = {**s, "state": {k: v for k, v in state.items() if isinstance(v, dict)}}
    return out


@dataclass(frozen=True)
class Run:
    """A step's or main's state from its container status."""

    name: str
    state: str  # "waiting", "running", "terminated" or "unknown"
    exit_code: int | None = None
    reason: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    message: str = ""
    recorded: bool = False  # the waiter wrote its termination message (it completed its work)
    signal: int | None = None  # the kubelet's terminated.signal, when it reported one
    waiter: dict | None = None  # the waiter's own record, when the kubelet's report was taken over it
    waiting: str = ""  # the kubelet's reason while waiting (ContainerCreating, ImagePullBackOff...)

    @property
    def ok(self) -> bool:
        return self.state == "terminated" and self.exit_code == 0 and self.reason == p.REASON_COMPLETED

    @property
    def ran_command(self) -> bool:
        """The waiter recorded a command it started (its own record, whatever the kubelet
        said after): only a command past the ready gate can have run."""
        return self.recorded and (self.waiter or {}).get("reason", self.reason) in _COMMAND_RAN

    @property
    def cannot_start(self) -> bool:
        """Waiting for a reason that is a problem, not "not yet": its image cannot be pulled,
        a ConfigMap or Secret its env names is missing; the kubelet retries on its backoff."""
        return self.state == "waiting" and self.waiting not in QUIET_WAITING

    def to_json(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "exitCode": self.exit_code,
                               "reason": self.reason if self.state == "terminated" else NOT_RUN,
                               "startedAt": self.started_at, "finishedAt": self.finished_at}
        if self.message:
            out["message"] = self.message[:MESSAGE_LIMIT]
        if self.signal is not None:
            out["signal"] = self.signal
        if self.waiter is not None:
            out["waiter"] = self.waiter
        return out

    def summary(self) -> str:
        """"OOMKilled (exit 137): killed by SIGKILL", for the outcome's message."""
        exit_part = f"exit {self.exit_code}" + (f", signal {self.signal}" if self.signal is not None else "")
        text = f"{self.reason or 'unknown'} ({exit_part})"
        if self.waiter is not None:
            text += f"; the waiter recorded {self.waiter['reason']} (exit {self.waiter['exitCode']})"
        return text + (f": {clip(self.message, SUMMARY_LIMIT)}" if self.message else "")


def clip(text: str, limit: int) -> str:
    """`text` within `limit` characters, its middle dropped: a runtime's error leads with
    where it failed and ends with why ("failed to create containerd task: ... stat
    /initshift/bin/waiter/waiter: no such file or directory: unknown")."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 3
    return f"{text[:head]}…{text[len(text) - (limit - 1 - head):]}"


def read_run(name: str, status: dict | None) -> Run:
    state = (status or {}).get("state")
    if not isinstance(state, dict):  # only a malformed status lacks the object
        state = {}
    if "terminated" not in state:
        started = ran_at((state.get("running") or {}).get("startedAt"))
        kind = "running" if "running" in state else "waiting" if "waiting" in state else "unknown"
        waiting = state.get("waiting") if isinstance(state.get("waiting"), dict) else {}
        return Run(name, kind, started_at=started, waiting=str(waiting.get("reason") or ""))
    t = state["terminated"] or {}
    code = t.get("exitCode")
    code = json_int(code)
    signal = t.get("signal") if isinstance(t.get("signal"), int) and t.get("signal") else None
    kubelet_reason = str(t.get("reason") or "")
    record = _waiter_record(t.get("message"))
    if record is not None:
        run = Run(name, "terminated", int(record["exitCode"]), str(record["reason"]),
                  record.get("startedAt") or ran_at(t.get("startedAt")),
                  record.get("finishedAt") or ran_at(t.get("finishedAt")),
                  str(record.get("message") or ""), recorded=True)
        # The waiter survives its child (an OOM kill hits the child) and writes its record,
        # but the kubelet knows why the container died: its reason wins, the record stays beside.
        if not run.ok and (kubelet_reason not in _PLAIN_KUBELET_REASONS or signal is not None):
            waiter = {"exitCode": run.exit_code, "reason": run.reason}
            if run.message:
                waiter["message"] = run.message[:MESSAGE_LIMIT]
            return replace(run, exit_code=code if code is not None else run.exit_code,
                           reason=kubelet_reason or "Error", signal=signal, waiter=waiter)
        return run
    return Run(name, "terminated", code, kubelet_reason, ran_at(t.get("startedAt")), ran_at(t.get("finishedAt")),
               str(t.get("message") or ""), signal=signal)


def read_runs(pod: Mapping, lay: Layout) -> dict[str, Run]:
    """`read_run` of every step and main, with what the waiter did to one that has no
    record of its own read from the order.

    A container whose pod sets its own terminationMessagePath gets no record (that file is
    its program's: kpack's `completion`, Tekton's steps), so the kubelet's report is all
    there is. Under the waiter with restartPolicy Never, a step or main that ended after the
    step it waits for failed was skipped: the waiter runs nothing after a failure (under
    OnFailure it waits through one). It is read as the waiter's skip, with the message the
    waiter would have written, when its report fits one: exit 0 or the failed step's code
    (`--skip-fails`), no signal, a plain reason."""
    status_of = statuses(pod)
    runs = {n: read_run(n, status_of.get(n)) for n in lay.work}
    if lay.strategy not in WAITER_RUN or (pod.get("spec") or {}).get("restartPolicy") != "Never":
        return runs
    waits_for = dict(zip(lay.steps[1:], lay.steps)) | {m: lay.steps[-1] for m in lay.mains if lay.steps}
    for name in lay.work:
        run, before = runs[name], runs.get(waits_for.get(name, ""))
        if (before is None or run.recorded or run.state != "terminated" or before.state != "terminated"
                or before.ok or before.reason == p.REASON_STOPPED or run.signal is not None
                or run.reason not in _PLAIN_KUBELET_REASONS or run.exit_code not in (0, before.exit_code)
                or name not in lay.waiter_run):
            continue
        code = before.exit_code if before.exit_code else 1
        runs[name] = replace(run, reason=p.REASON_SKIPPED,
                             message=skip_message(before.name, before.reason, before.message, code))
    return runs


def _waiter_record(message: Any) -> dict | None:
    """The waiter's JSON termination message, or None when the waiter did not write one."""
    if not isinstance(message, str) or not message.lstrip().startswith("{"):
        return None
    try:
        record = json.loads(message)
    except ValueError:
        return None
    if not isinstance(record, dict) or not all(k in record for k in _RECORD_KEYS):
        return None
    return record if json_int(record["exitCode"]) is not None else None
