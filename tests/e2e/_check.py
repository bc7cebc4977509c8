"""The assertions every build scenario makes on the real pod: how it ended, the strategy,
each step's own log (started, reached the network through the proxy, ended) in order,
the proxy's own log (ready, one request per step, in order, how it stopped), and the
timings.

Times come from the clocks of the processes themselves, all the node's one clock: the
proxy writes the instant it turned ready into its line, and a step's start and end are the
waiter's record of its command (the container's termination message). The kubelet's log
timestamps say when containerd *read* a line, a few milliseconds late and independently per
container, so they only stand in where there is no waiter record (init containers)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from waiter import protocol as p

from ._env import Env, Record
from ._kube import parse_time
from ._pods import Line, first, log_lines, managed, ms, terminated, wait_end


@dataclass
class Build:
    obj: dict
    steps: dict[str, list[Line]]
    proxy: list[Line]
    ready_to_step0_ms: float | None
    span_s: float | None
    times: dict[str, tuple[dt.datetime, dt.datetime]]  # each step's command: start, end


def check_build(env: Env, rec: Record, ns: str, name: str, *, steps: list[str], proxy: str | None,
                net: list[str] | None = None, phase: str = "Succeeded", strategy: str | None = None,
                paths: dict[str, str] | None = None, timeout: float = 240.0) -> Build:
    """`net`: the steps that call through the proxy (default: every step); `paths`: what a
    step requests when it is not its own name."""
    net = steps if net is None else net
    obj = wait_end(env.kube, ns, name, timeout)
    got = obj["status"]["phase"]
    assert got == phase, f"pod {name} ended {got} ({obj['status'].get('reason') or ''}), expected {phase}"
    if strategy is not None:
        assert managed(obj) == strategy, f"pod {name} managed by {managed(obj)!r}, expected {strategy!r}"
    if managed(obj) == p.MODE_HYBRID and phase == "Succeeded":  # the copier's hook returned, then it ended
        copier = terminated(obj, p.COPY_CONTAINER_NAME) or {}
        assert copier.get("exitCode") == 0, f"{p.COPY_CONTAINER_NAME} ended {copier}"
    logs = {s: log_lines(env.kube, ns, name, s) for s in steps}
    times: dict[str, tuple[dt.datetime, dt.datetime]] = {}
    for s in steps:
        start, end = first(logs[s], rf"^{s} start$"), first(logs[s], rf"^{s} end$")
        assert start and end, f"step {s} did not run to its end: {[line.text for line in logs[s]]}"
        if s in net:
            assert first(logs[s], rf"^{s} fetched "), f"step {s}'s call through the proxy failed: " \
                                                     f"{[line.text for line in logs[s]]}"
        times[s] = record_times(obj, s) or (start.at, end.at)
    for before, after in zip(steps, steps[1:]):
        assert times[after][0] >= times[before][1], f"step {after} started {times[after][0]} before {before} " \
                                                    f"ended {times[before][1]}"
    proxy_lines: list[Line] = []
    ready_ms = None
    if proxy:
        proxy_lines = log_lines(env.kube, ns, name, proxy)
        ready = first(proxy_lines, r" ready$")
        assert ready, f"{proxy} never said it was ready: {[line.text for line in proxy_lines]}"
        seen = [line.text.split("request GET /", 1)[1] for line in proxy_lines if "request GET /" in line.text]
        wanted = [(paths or {}).get(s, s) for s in net]
        assert [x for x in seen if x in wanted] == wanted, f"{proxy} saw {seen}, expected {wanted} in order"
        if steps:
            ready_ms = ms(times[steps[0]][0] - proxy_instant(ready))
            assert ready_ms >= 0 or steps[0] not in net, f"step 0 started {-ready_ms:.0f} ms before {proxy} was ready"
        assert terminated(obj, proxy) is not None or phase == "Failed", f"{proxy} still running after the pod ended"
    span = (times[steps[-1]][1] - times[steps[0]][0]).total_seconds() if steps else None
    return Build(obj, logs, proxy_lines, ready_ms, span, times)


def record_times(obj: dict, container: str) -> tuple[dt.datetime, dt.datetime] | None:
    """When the waiter ran the container's command: its record, the termination message."""
    try:
        record = json.loads((terminated(obj, container) or {}).get("message") or "")
        return parse_time(record["startedAt"]), parse_time(record["finishedAt"])
    except (ValueError, KeyError, TypeError):
        return None


def proxy_instant(line: Line) -> dt.datetime:
    """The instant the fake proxy wrote into its line ("fakeproxy[NAME] EPOCH_MS event")."""
    return dt.datetime.fromtimestamp(int(line.text.split()[1]) / 1000, dt.timezone.utc)


def proxy_stop(build: Build, proxy: str) -> str:
    """How the proxy ended, from its own log: quit, SIGTERM (the kubelet), or killed."""
    if first(build.proxy, r"quit requested"):
        return "quit endpoint"
    if first(build.proxy, r"terminated by SIGTERM"):
        return "SIGTERM"
    state = terminated(build.obj, proxy) or {}
    return f"killed ({state.get('reason')}, exit {state.get('exitCode')})" if state else "still running"
