"""The assertions every build scenario makes on the real pod: how it ended, the strategy,
each step's own log (started, reached the network through the proxy, ended) in order,
the proxy's own log (ready, one request per step, in order, how it stopped), and the
timings read from the kubelet's log timestamps."""

from __future__ import annotations

from dataclasses import dataclass

from ._env import Env, Record
from ._pods import Line, first, log_lines, managed, ms, terminated, wait_end


@dataclass
class Build:
    obj: dict
    steps: dict[str, list[Line]]
    proxy: list[Line]
    ready_to_step0_ms: float | None
    span_s: float | None


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
    logs = {s: log_lines(env.kube, ns, name, s) for s in steps}
    previous_end: Line | None = None
    for s in steps:
        start, end = first(logs[s], rf"^{s} start$"), first(logs[s], rf"^{s} end$")
        assert start and end, f"step {s} did not run to its end: {[line.text for line in logs[s]]}"
        if s in net:
            assert first(logs[s], rf"^{s} fetched "), f"step {s}'s call through the proxy failed: " \
                                                     f"{[line.text for line in logs[s]]}"
        if previous_end is not None:
            assert start.at >= previous_end.at, f"step {s} started {start.at} before the previous step ended " \
                                                f"{previous_end.at}"
        previous_end = end
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
            step0 = first(logs[steps[0]], rf"^{steps[0]} start$")
            assert step0 is not None
            ready_ms = ms(step0.at - ready.at)
            assert ready_ms >= 0 or steps[0] not in net, f"step 0 started {-ready_ms:.0f} ms before {proxy} was ready"
        assert terminated(obj, proxy) is not None or phase == "Failed", f"{proxy} still running after the pod ended"
    span = None
    if steps:
        span = (first(logs[steps[-1]], rf"^{steps[-1]} end$").at - first(logs[steps[0]], rf"^{steps[0]} start$").at
                ).total_seconds()
    return Build(obj, logs, proxy_lines, ready_ms, span)


def proxy_stop(build: Build, proxy: str) -> str:
    """How the proxy ended, from its own log: quit, SIGTERM (the kubelet), or killed."""
    if first(build.proxy, r"quit requested"):
        return "quit endpoint"
    if first(build.proxy, r"terminated by SIGTERM"):
        return "SIGTERM"
    state = terminated(build.obj, proxy) or {}
    return f"killed ({state.get('reason')}, exit {state.get('exitCode')})" if state else "still running"
