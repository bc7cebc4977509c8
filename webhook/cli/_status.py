"""`initshift status POD`: the pod's steps, mains and sidecars in execution order;
`initshift status` alone: one line per pod initshift rewrote in the namespace (`-A`: in all;
webhook/cli/_status_list.py).

One row per container with its state (waiting for step N, waiting for sidecars,
running, completed, failed, skipped, ...), exit code, reason, start and duration, then
the pod's result from the watcher's `initshift.io/outcome` (so a pod that ended
Failed/DeadlineExceeded only to stop its sidecars reads as Succeeded). `--watch` redraws
as the pod progresses and stops when it has ended; for `job/NAME` (and `cronjob/NAME`:
its newest Job) it then follows each pod the Job controller starts after it (a retry, the
next completion) until the Job is finished.

Exit codes: 0 shown, 1 an API error or a pod initshift cannot show, 2 usage,
130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from datetime import datetime, timezone
from typing import TextIO

from waiter import protocol as p

from ..kube import KubeApi
from ..watcher import FAILED, SUCCEEDED, parse_time
from ._common import Parser
from ._podcli import (CLEAR, TICK_SECONDS, PodDeleted, PodTracker, add_connection_args, job_of, next_attempt, paint,
                      run_main, run_on_pod, use_colour)
from ._podio import dump
from ._podview import PodView, State, pod_view, state_text
from ._status_list import run_list

_OUTCOME_GRACE_SECONDS = 15.0  # --watch: how long an ended waiter pod may wait for its outcome

_STATE_COLOURS = {State.COMPLETED: "32", State.FAILED: "31", State.SKIPPED: "33", State.NOT_STARTED: "33",
                  State.RUNNING: "36", State.PENDING: "33", State.WAITING_STEP: "2", State.WAITING_SIDECARS: "2"}
_COLUMNS = ("#", "CONTAINER", "KIND", "STATE", "EXIT", "REASON", "STARTED", "DURATION")


def _parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="initshift status",
        description="Show a pod's steps, mains and sidecars in execution order, with the result the "
                    "initshift watcher recorded. Works for pods rewritten by any strategy and for pods "
                    "that were never rewritten (their init containers are the steps).",
        epilog="Exit codes: 0 shown, 1 API error or a pod initshift cannot show, 2 usage.")
    add_connection_args(ap, optional="without POD: every pod initshift rewrote in the namespace, one line each")
    ap.add_argument("-A", "--all-namespaces", action="store_true", help="without POD: in every namespace")
    ap.add_argument("-l", "--selector", metavar="SELECTOR",
                    help="without POD: only the pods with these labels (`app=ci,tier!=test`, as kubectl's -l)")
    ap.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table", help="output format")
    ap.add_argument("-w", "--watch", action="store_true",
                    help="redraw as the pod progresses, until it ends (job/NAME, cronjob/NAME: then the Job's next "
                         "pod, until the Job is finished); without POD, the list as its pods change, until "
                         "interrupted")
    return ap


# --- rendering --------------------------------------------------------------------------
def _duration_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _clock(value: str | None) -> str:
    t = parse_time(value)
    return t.astimezone(timezone.utc).strftime("%H:%M:%SZ") if t else ""


def _summary(view: PodView, colour: bool) -> list[str]:
    strategy = f"rewritten by initshift ({view.strategy})" if view.strategy else \
        f"managed by initshift ({view.managed})" if view.managed else "not rewritten by initshift"
    if view.not_rewritten:
        strategy += f" (reason: {view.not_rewritten})"
    result_colour = {SUCCEEDED: "32", FAILED: "31"}.get(view.result, "")
    result = paint(view.result, result_colour, colour) + (f": {view.message}" if view.message else "")
    phase = view.phase + (f" ({view.pod_reason})" if view.pod_reason else "")
    if view.deleted_at:  # as kubectl says it; the kubelet is stopping every container
        phase += f", Terminating (deleted at {view.deleted_at.astimezone(timezone.utc):%H:%M:%SZ})"
    lines = [f"Pod:     {view.namespace}/{view.name}, {strategy}", f"Result:  {result}", f"Phase:   {phase}"]
    if view.sidecars_stopped_by:
        lines[-1] += f"; sidecars stopped by {view.sidecars_stopped_by}"
    for names, what, record in ((view.startup_probes_removed, "startupProbe", p.ANNOTATION_STARTUP_PROBES_REMOVED),
                                (view.post_start_removed, "postStart wait", p.ANNOTATION_POST_START_REMOVED)):
        if names:
            lines.append(f"Start:   no {what} on {', '.join(names)}: step 0 waits for its readiness itself ({record})")
    if view.ended and view.result != view.phase:
        lines.append("         (the phase comes from ending the sidecars; the result is what the steps did)")
    return lines


def _render_table(view: PodView, colour: bool = False) -> str:
    rows = [[str(r.number or ""), r.name, r.kind, state_text(r, view),
             "" if r.exit_code is None else str(r.exit_code), r.reason, _clock(r.started_at),
             _duration_text(r.duration)] for r in view.rows]
    columns = _COLUMNS
    if any(r.restarts for r in view.rows):  # as kubectl's RESTARTS, where the kubelet ran one again
        columns = (*columns[:5], "RESTARTS", *columns[5:])
        for r, cells in zip(view.rows, rows):
            cells.insert(5, str(r.restarts or ""))
    widths = [max(len(x) for x in col) for col in zip(columns, *rows)]
    lines = _summary(view, colour) + [""]
    lines.append("  ".join(h.ljust(w) for h, w in zip(columns, widths)).rstrip())
    for r, cells in zip(view.rows, rows):
        padded = [c.ljust(w) for c, w in zip(cells, widths)]
        padded[3] = paint(padded[3], _STATE_COLOURS.get(r.state, ""), colour)
        lines.append("  ".join(padded).rstrip())
    notes = [f"  {r.name}: {r.message}" for r in view.rows if r.message]
    if notes:
        lines += ["", "Messages:", *notes]
    return "\n".join(lines) + "\n"


def render(view: PodView, fmt: str, colour: bool = False) -> str:
    if fmt == "table":
        return _render_table(view, colour)
    return dump(view.to_json(), fmt)


def _fingerprint(view: PodView, fmt: str) -> str:
    """What the output says, without the durations that grow while a container runs."""
    rows = tuple(r if r.finished_at else dataclasses.replace(r, duration=None) for r in view.rows)
    return render(dataclasses.replace(view, rows=rows), fmt)


# --- the command ------------------------------------------------------------------------
def _finished(view: PodView, outcome_wait_over: bool) -> bool:
    """The pod has ended and (for a waiter or hybrid pod) its outcome is in, or will not come."""
    if not view.ended:
        return False
    return view.strategy not in (p.MODE_WAITER, p.MODE_HYBRID) or view.sidecars_stopped_by is not None \
        or outcome_wait_over


async def _watch(tracker: PodTracker, args: argparse.Namespace, out: TextIO) -> None:
    colour = use_colour(out)
    redraw = colour and args.output == "table"  # a terminal: clear and redraw in place

    def show(view: PodView) -> None:
        if redraw:
            out.write(CLEAR)
        elif args.output == "yaml":
            out.write("---\n")
        elif args.output == "table":
            out.write("\n")
        out.write(render(view, args.output, colour))
        out.flush()

    loop = asyncio.get_running_loop()
    view = pod_view(tracker.pod, datetime.now(timezone.utc))
    shown, seen = _fingerprint(view, args.output), tracker.version
    ended_at: float | None = None
    while True:
        if view.ended and ended_at is None:
            ended_at = loop.time()
        if _finished(view, ended_at is not None and loop.time() - ended_at >= _OUTCOME_GRACE_SECONDS):
            return
        timeout = TICK_SECONDS if redraw else None
        if ended_at is not None:
            left = max(0.0, _OUTCOME_GRACE_SECONDS - (loop.time() - ended_at))
            timeout = left if timeout is None else min(timeout, left)
        changed = await tracker.changed(seen, timeout)
        seen = tracker.version
        view = pod_view(tracker.pod, datetime.now(timezone.utc), deletion_seen=view.deleted_at)
        if redraw or (changed and _fingerprint(view, args.output) != shown):
            show(view)
            shown = _fingerprint(view, args.output)


async def run(argv: list[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        if args.pod is not None and args.all_namespaces:
            parser.error("-A is for the list: leave out POD (a pod's namespace is -n)")
        if args.pod is not None and args.selector is not None:
            parser.error("-l is for the list: leave out POD")
    except SystemExit as e:  # argparse printed the usage
        return int(e.code or 0)
    if args.pod is None:
        return await run_list(args, out, err)

    async def show(api: KubeApi, namespace: str, pod: dict, args: argparse.Namespace) -> None:
        # -w job/NAME (or cronjob/NAME) follows the Job: once its pod has ended, the next one it starts.
        job = job_of(args.pod, pod) if args.watch else None
        shown, current = 0, pod
        while current is not None:
            view = pod_view(current, datetime.now(timezone.utc))
            colour = use_colour(out)
            if args.watch and colour and args.output == "table":
                out.write(CLEAR)
            elif shown:  # the next pod of the Job, after its last pod's drawings
                out.write({"yaml": "---\n", "table": "\n"}.get(args.output, ""))
            shown += 1
            out.write(render(view, args.output, colour))
            out.flush()
            if not args.watch:
                return
            async with PodTracker(api, namespace, current["metadata"]["name"], current) as tracker:
                try:
                    await _watch(tracker, args, out)
                except PodDeleted:
                    # A Job's pod is deleted by the Job controller at its backoffLimit under
                    # restartPolicy OnFailure, or by someone (a drain), when the controller
                    # replaces it: the Job, not the pod, says which (next_attempt).
                    if job is None:
                        raise
                    print(f"job/{job}: pod/{current['metadata']['name']} was deleted", file=err)
            current = await next_attempt(api, namespace, job, tracker.pod, err) if job is not None else None

    return await run_on_pod("initshift status", _parser(), argv, show, err, following=lambda args: args.watch)


def main(argv: list[str]) -> int:
    return run_main(run, argv)
