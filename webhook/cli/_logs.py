"""`initshift logs POD`: each step's log in step order, then the mains'.

Every line is prefixed with its container's name (coloured on a terminal). With
`-f`, a step that has not started yet is waited for and the running one is followed to
its end before the next; sidecars (`--sidecars`) are followed alongside. A followed stream
that breaks while its container runs (a proxy's idle timeout, an apiserver restart) is taken
up again where it stopped, by the kubelet's timestamps of the lines: none lost, none twice.
The waiter's own lines (its `waiter[name]: ...` messages on stderr) are hidden unless
`--waiter`. As kubectl's: `-c NAME` shows one container's log alone (without the prefix), `--tail N` each
container's last N lines (with `-f`, then follows it), `--since DURATION` those of the
last DURATION, `--timestamps` each line's time after its prefix (as `kubectl logs
--prefix --timestamps`), `-p` the run before the current one of each container the
kubelet ran again.

Exit codes: 0 shown, 1 an API error or a pod initshift cannot show, 2 usage,
130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import TextIO

from ..kube import KubeApi, KubeError, StreamCut
from ..watcher import NotManaged, pod_ended, statuses
from ._common import CliError, Parser, whole_number
from ._podcli import (RESUME_PAUSE_SECONDS, PodTracker, add_connection_args, api_error, paint, run_main, run_on_pod,
                      use_colour)
from ._podview import (LogPlan, State, has_log, has_started, has_terminated, is_waiter_line, log_plan,
                       pod_view, restarts, runs_again, state_text)

_SETTLE_SECONDS = 10.0  # -f: how long a stream's end may precede the kubelet's terminated status
# The kubelet's time of a log line (`timestamps=true`): RFC 3339 with up to nanoseconds.
_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
_PALETTE = ("36", "33", "35", "32", "34", "96", "93", "95", "92", "94")
_NOTE_STATES = (State.FAILED, State.SKIPPED, State.NOT_STARTED)


def _parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="initshift logs",
        description="Print a pod's step logs in step order, then the mains', each line prefixed with its "
                    "container. Works for pods rewritten by any strategy and for pods that were never "
                    "rewritten (their init containers are the steps).",
        epilog="Exit codes: 0 shown, 1 API error or a pod initshift cannot show, 2 usage.")
    add_connection_args(ap)
    # --previous reads runs that have ended: nothing to follow (argparse says so, exit 2).
    runs = ap.add_mutually_exclusive_group()
    runs.add_argument("-f", "--follow", action="store_true",
                      help="wait for steps that have not started and follow the running one, until the mains end")
    runs.add_argument("-p", "--previous", action="store_true",
                      help="each container's run before its current one, for those the kubelet ran again "
                           "(restartPolicy), as `kubectl logs --previous`")
    ap.add_argument("--sidecars", action="store_true",
                    help="also the sidecars (alongside the steps) and the mesh's and initshift's init containers")
    ap.add_argument("-c", "--container", metavar="NAME",
                    help="only this container's log (a step, a main, a sidecar or a kept init container)")
    ap.add_argument("--waiter", action="store_true", help="also the waiter's own lines")
    ap.add_argument("--tail", type=whole_number(0, None, "lines"), metavar="N",
                    help="each container's last N lines (with -f: then follow it), as `kubectl logs --tail`")
    ap.add_argument("--since", type=_duration, metavar="DURATION",
                    help="only the lines of the last DURATION (5s, 2m, 1h30m) by the kubelet's clock, as "
                         "`kubectl logs --since`")
    ap.add_argument("--timestamps", action="store_true",
                    help="each line with the kubelet's time of it (RFC 3339), as `kubectl logs --timestamps`")
    return ap


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(text: str) -> int:
    """A Go duration (kubectl's --since: `90s`, `5m`, `1h30m`) in whole seconds, rounded up
    as kubectl sends it (`sinceSeconds`)."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (as 90s, 5m or 1h30m)")
    seconds = math.ceil(round(sum(float(n) * _UNIT_SECONDS[u] for n, u in parts), 9))
    if seconds < 1:
        raise argparse.ArgumentTypeError("must be more than 0")
    return seconds


class Printer:
    """Prefixes lines with their container's name (unless `prefixed` is false) and drops the
    waiter's own lines."""

    def __init__(self, out: TextIO, names: list[str], waiter_run: frozenset[str], show_waiter: bool,
                 timestamps: bool = False, prefixed: bool = True) -> None:
        self.out, self.timestamps, self.prefixed = out, timestamps, prefixed
        self.colour = use_colour(out)
        self.width = max((len(n) for n in names), default=0) + 2
        self.colours = {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(names)}
        self.waiter_run = waiter_run
        self.show_waiter = show_waiter

    def prefix(self, name: str) -> str:
        return paint(f"[{name}]".ljust(self.width), self.colours.get(name, ""), self.colour)

    def waiters(self, name: str, text: str) -> bool:
        """Whether `text` is one of the waiter's own lines in `name`'s log."""
        return name in self.waiter_run and is_waiter_line(text)

    def shows(self, name: str, text: str) -> bool:
        return self.show_waiter or not self.waiters(name, text)

    def line(self, name: str, text: str, stamp: str = "") -> None:
        """One line of `name`'s log; `stamp`: the kubelet's time of it, shown with --timestamps."""
        if self.waiters(name, text):
            if not self.show_waiter:
                return
            text = paint(text.rstrip("\n"), "2", self.colour)
        if not text.endswith("\n"):
            text += "\n"
        if self.timestamps and stamp:
            text = f"{stamp} {text}"
        self.out.write(f"{self.prefix(name)} {text}" if self.prefixed else text)
        self.out.flush()


Stamp = tuple[datetime, int]  # a log line's time: the instant to the second, and its nanoseconds


def _stamped(line: str) -> tuple[Stamp | None, str, str]:
    """A `timestamps=true` log line as (its time, that time as written, the line); (None, "",
    the whole line) for a line without one."""
    stamp, _, text = line.partition(" ")
    m = _STAMP.fullmatch(stamp)
    if m is None:
        return None, "", line
    return (datetime.fromisoformat(m.group(1) + m.group(3)), int((m.group(2) or "").ljust(9, "0"))), stamp, text


class _Resume:
    """Where a followed log stands: the time of the last line shown and how many shown had
    it, so that a stream opened again from that second (`since`) skips what was shown."""

    def __init__(self) -> None:
        self.last: Stamp | None = None
        self.at_last = 0  # lines shown with the time `last`
        self._skip = 0  # of those, still to come again in this stream

    def since(self) -> str | None:
        """A new stream starts: the sinceTime to ask for (whole seconds), None the first time."""
        self._skip = self.at_last
        return self.last[0].astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if self.last else None

    def fresh(self, stamp: Stamp | None) -> bool:
        """Whether a line of time `stamp` is to be shown (and count it as shown)."""
        if stamp is None:
            return True
        if self.last is not None and (stamp < self.last or (stamp == self.last and self._skip)):
            self._skip -= stamp == self.last  # shown before the stream broke
            return False
        self.last, self.at_last = stamp, (self.at_last + 1 if stamp == self.last else 1)
        return True


class _Streamer:
    def __init__(self, api: KubeApi, namespace: str, pod_name: str, printer: Printer, err: TextIO,
                 tail: int | None = None, since: int | None = None, previous: bool = False) -> None:
        self.api, self.namespace, self.pod_name, self.tail = api, namespace, pod_name, tail
        self.previous = previous  # dump: each container's run before its current one
        self._since = since
        self._first_ask: float | None = None  # when --since was first sent (the monotonic clock)
        self.printer, self.err = printer, err
        self._stuck_said: set[tuple[str, str]] = set()  # (container, reason): each said once

    def since_seconds(self) -> int | None:
        """--since as the kubelet is asked for it now: from the same instant as the first time
        it was asked, however long the command has waited for a container since."""
        if self._since is None:
            return None
        now = time.monotonic()
        if self._first_ask is None:
            self._first_ask = now
        return self._since + math.ceil(now - self._first_ask)

    async def dump(self, name: str) -> None:
        stamped = self.printer.timestamps
        try:
            if self.tail is None:
                async for line in self.api.pod_log(self.namespace, self.pod_name, name, timestamps=stamped,
                                                   since_seconds=self.since_seconds(), previous=self.previous):
                    _, stamp, text = _stamped(line) if stamped else (None, "", line)
                    self.printer.line(name, text, stamp)
                return
            for _, stamp, text in await self._last_lines(name, self.tail, stamped) if self.tail else ():
                self.printer.line(name, text, stamp)
        except KubeError as e:
            raise api_error(e, self.namespace, self.pod_name, f"read the log of {name} in pod") from None

    async def _last_lines(self, name: str, count: int, stamped: bool) -> list[tuple[Stamp | None, str, str]]:
        """--tail (`count` > 0): the lines of `name`'s log from the last `count` that are shown on (the
        waiter's own lines among them, which the printer drops unless --waiter): the kubelet's
        `tailLines` counts those too, so it is asked for twice as many while they hide some.
        Each line as `_stamped` gives it (with `stamped`: the kubelet's time of it)."""
        ask = count
        while True:
            read = [_stamped(line) if stamped else (None, "", line) async for line in self.api.pod_log(
                self.namespace, self.pod_name, name, tail_lines=ask, timestamps=stamped,
                since_seconds=self.since_seconds(), previous=self.previous)]
            shown = [i for i, (_, _, text) in enumerate(read) if self.printer.shows(name, text)]
            if len(shown) >= count:
                return read[shown[-count]:]
            if len(read) < ask:  # the whole log
                return read
            ask *= 2

    def note(self, pod: dict, name: str) -> None:
        """After a container's log: say on stderr when it failed, was skipped or did not run, or
        when the kubelet cannot start it (say_stuck)."""
        try:
            view = pod_view(pod, datetime.now(timezone.utc))
            row = view.row(name)
        except (NotManaged, StopIteration):
            return
        if row.stuck:
            self._say_stuck(row.name, row.reason, row.message)
            return
        if row.state not in _NOTE_STATES:
            return
        # A skipped step never ran: its exit code (0, or the failed step's under --skip-fails) is
        # not its own, nor is that of one the pod's end stopped before it ran (the waiter's 143
        # for SIGTERM); the message says why.
        own = row.exit_code is not None and row.state not in (State.SKIPPED, State.NOT_STARTED)
        code = f", exit code {row.exit_code}" if own else ""
        detail = f": {row.message}" if row.message else ""
        # The state as `initshift status` words it ("not run"), not its JSON slug.
        self.err.write(f"{self.printer.prefix(name)} {state_text(row, view)} ({row.reason or 'no reason'}{code})"
                       f"{detail}\n")
        self.err.flush()

    def _unsaid_stuck(self, pod: dict) -> list[tuple[str, str, str]]:
        """(container, reason, message) of each container stuck that was not said yet."""
        try:
            rows = pod_view(pod, datetime.now(timezone.utc)).rows
        except NotManaged:
            return []
        return [(r.name, r.reason, r.message) for r in rows if r.stuck and (r.name, r.reason) not in self._stuck_said]

    def say_stuck(self, pod: dict) -> None:
        """Say on stderr each container the kubelet cannot start (an image it cannot pull, a
        Secret that is missing), once per reason: with nothing else said, `-f` waiting on it
        (or a step waiting for its proxy) looks hung, and `logs` alone shows nothing."""
        for stuck in self._unsaid_stuck(pod):
            self._say_stuck(*stuck)

    def _reruns(self, pod: dict, name: str, seen: int) -> int:
        """-f: say on stderr that the kubelet ran the container again (restartPolicy) since
        `seen` restarts, with what it says of the last run; the restarts now."""
        count = restarts(pod, name)
        if count > seen:
            # The kubelet says how the last run ended while it keeps that run (not always once
            # the pod has ended).
            last = _last_run(pod, name)
            ended = f"; the last run: {_ended(last)}" if last else ""
            self.err.write(f"{self.printer.prefix(name)} run again by the kubelet (restart {count}{ended})\n")
            self.err.flush()
        return max(count, seen)

    def previous_note(self, pod: dict, name: str) -> None:
        """--previous: after a run's log, how it ended, on stderr."""
        self.err.write(f"{self.printer.prefix(name)} the previous run: {_ended(_last_run(pod, name))}\n")
        self.err.flush()

    def _say_stuck(self, name: str, reason: str, message: str) -> None:
        if (name, reason) in self._stuck_said:
            return
        self._stuck_said.add((name, reason))
        detail = f": {message}" if message else ""
        self.err.write(f"{self.printer.prefix(name)} {State.PENDING} ({reason}){detail}\n")
        self.err.flush()

    async def follow(self, tracker: PodTracker, name: str) -> None:
        """Wait for the container to start, follow its log to the end, then note how it ended."""
        while True:  # saying what the kubelet cannot start meanwhile; it may yet (a pushed image)
            pod = await tracker.wait(lambda p: has_started(p, name) or pod_ended(p) or bool(self._unsaid_stuck(p)))
            if has_started(pod, name) or pod_ended(pod):
                break
            self.say_stuck(pod)
        if not has_started(pod, name):
            self.note(pod, name)
            return
        def stopped(p: dict) -> bool:  # for good: not to be run again (restartPolicy)
            return pod_ended(p) or has_terminated(p, name) and not runs_again(p, name)

        runs = self._reruns(pod, name, 0)  # runs before this one, said too: their logs are gone
        where = _Resume()
        tail = self.tail  # --tail 0: the first stream's (only what comes)
        if self.tail:  # the last lines first, then the stream from the last one's time
            try:
                for stamp, written, text in await self._last_lines(name, self.tail, True):
                    if where.fresh(stamp):
                        self.printer.line(name, text, written)
            except KubeError as e:
                raise api_error(e, self.namespace, self.pod_name, f"read the log of {name} in pod") from None
            tail = None  # the log was empty if none were read: all of it is new
        while True:
            cut = False
            since = where.since()
            try:
                # From the last line read's time, or with none read yet, --since's.
                async for line in self.api.pod_log(self.namespace, self.pod_name, name, follow=True,
                                                   tail_lines=tail, timestamps=True, since_time=since,
                                                   since_seconds=self.since_seconds() if since is None else None):
                    stamp, written, text = _stamped(line)
                    if where.fresh(stamp):
                        self.printer.line(name, text, written)
            except StreamCut:
                cut = True
            except KubeError as e:
                raise api_error(e, self.namespace, self.pod_name, f"read the log of {name} in pod") from None
            # The stream ends as the container stops, and its status follows shortly; one that
            # broke, or ended with the container still running after that, is opened again, and
            # so is one the kubelet ran again: its new run's log (read even if that run has
            # ended already, as a quick one has by the time its status says it ran) follows.
            if not stopped(tracker.pod) and not cut:
                try:
                    await tracker.wait(lambda p: stopped(p) or restarts(p, name) > runs, _SETTLE_SECONDS)
                except asyncio.TimeoutError:
                    pass
            if restarts(tracker.pod, name) > runs:
                runs = self._reruns(tracker.pod, name, runs)
            elif stopped(tracker.pod):
                break
            # A stream opened again starts from the last line read's time; with none read
            # yet under --tail 0, with only what comes (older lines cannot be told from new).
            tail = 0 if self.tail == 0 and where.last is None else None
            await asyncio.sleep(RESUME_PAUSE_SECONDS)
        self.note(tracker.pod, name)


def _last_run(pod: dict, name: str) -> dict:
    """How the container's run before its current one ended, as the kubelet reports it
    (`lastState.terminated`: the run `previous=true` reads); empty when it reports none."""
    return (statuses(pod).get(name) or {}).get("lastState", {}).get("terminated") or {}


def _ended(run: dict) -> str:
    return f"{run.get('reason') or 'ended'}, exit code {run.get('exitCode')}"


def _with_previous(names: list[str], pod: dict, pod_name: str, one: bool) -> list[str]:
    """--previous: those of `names` with a run before their current one (the kubelet's
    `lastState`); CliError when none has one (`one`: -c NAME, as `kubectl logs -p -c` says it)."""
    having = [n for n in names if _last_run(pod, n)]
    if having:
        return having
    if one:
        again = restarts(pod, names[0])
        why = (f"run again (restart {again}), but the kubelet no longer reports the run before, as after the pod "
               f"has ended") if again else "not run again by the kubelet"
        raise CliError(f"no previous run of container {names[0]} in pod {pod_name}: {why}")
    raise CliError(f"no container of pod {pod_name} has a previous run: none was run again by the kubelet "
                   f"(restartPolicy), or it no longer reports the runs before")


def _only(plan: LogPlan, name: str, pod: str) -> LogPlan:
    """-c NAME: the plan of that container alone; CliError naming the pod's containers when
    it has none of that name."""
    if name in plan.sequential or name in plan.concurrent:
        alongside = name in plan.concurrent
        return replace(plan, sequential=[] if alongside else [name], concurrent=[name] if alongside else [])
    raise CliError(f"pod {pod} has no container {name} (it has {', '.join([*plan.sequential, *plan.concurrent])})")


async def _show(api: KubeApi, namespace: str, pod: dict, args: argparse.Namespace, out: TextIO,
                err: TextIO) -> None:
    plan = log_plan(pod, sidecars=args.sidecars or args.container is not None)
    if args.container is not None:
        plan = _only(plan, args.container, f"{namespace}/{pod['metadata']['name']}")
    # One container's lines (-c) as they are, as `kubectl logs -c` prints them: `> file` is its log.
    printer = Printer(out, [*plan.sequential, *plan.concurrent], plan.waiter_run, args.waiter, args.timestamps,
                      prefixed=args.container is None)
    streamer = _Streamer(api, namespace, pod["metadata"]["name"], printer, err, args.tail, args.since,
                         args.previous)
    if args.previous:
        for name in _with_previous([*plan.sequential, *plan.concurrent], pod,
                                   f"{namespace}/{pod['metadata']['name']}", args.container is not None):
            await streamer.dump(name)
            streamer.previous_note(pod, name)
        return
    if not args.follow:
        for name in [*plan.sequential, *plan.concurrent]:
            if has_log(pod, name):
                await streamer.dump(name)
            streamer.note(pod, name)
        streamer.say_stuck(pod)  # what holds them up outside the plan: the proxy, initshift-init
        return
    async with PodTracker(api, namespace, pod["metadata"]["name"], pod) as tracker:
        alongside = [asyncio.create_task(streamer.follow(tracker, n)) for n in plan.concurrent]
        try:
            for name in plan.sequential:
                await streamer.follow(tracker, name)
            await asyncio.gather(*alongside)
        finally:
            for task in alongside:
                task.cancel()
            await asyncio.gather(*alongside, return_exceptions=True)


async def run(argv: list[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    async def show(api: KubeApi, namespace: str, pod: dict, args: argparse.Namespace) -> None:
        await _show(api, namespace, pod, args, out, err)

    return await run_on_pod("initshift logs", _parser(), argv, show, err, following=lambda args: args.follow)


def main(argv: list[str]) -> int:
    return run_main(run, argv)
