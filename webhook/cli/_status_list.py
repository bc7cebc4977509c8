"""`initshift status` without POD: one line per pod initshift rewrote (label
`initshift.io/managed`) in the namespace, or in all with `-A`, oldest first as a build
history reads: its strategy, its steps done of all, where it stands (the step running or
waiting, or its result and what failed) and its age. `-w` keeps it current from a watch
(the informer's list-and-watch loop): redrawn in place on a terminal, else a line for each
pod whose line changed, as `kubectl get -w` prints them.
"""

from __future__ import annotations

import argparse
import asyncio
from datetime import datetime, timezone
from typing import Iterable, TextIO

from waiter import protocol as p

from ..kube import Informer, KubeApi, KubeError
from ..watcher import MAIN, STEP, NotManaged, parse_time
from ._common import EXIT_OK, CliError
from ._podcli import CLEAR, TICK_SECONDS, connect, unreached, use_colour
from ._podio import dump
from ._podview import PodView, State, pod_view, state_text

_REFUSED = (401, 403)  # a watch the informer would retry forever: the command ends instead


def _age(seconds: float) -> str:
    """kubectl's short age: 45s, 12m, 5h, 3d."""
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size * (2 if unit == "d" else 1):
            return f"{s // size}{unit}"
    return f"{s}s"


def _stands(view: PodView) -> str:
    """Where a pod stands: its result once it ended, else its first step or main not done."""
    if view.ended:
        return view.result + (f" ({view.failed} failed)" if view.failed else "")
    if view.deleted_at:  # as kubectl says it
        return "Terminating"
    for r in view.rows:
        if r.kind not in (STEP, MAIN) or r.state == State.COMPLETED:
            continue
        if r.state == State.PENDING:
            return f"{r.name}: pending" + (f" ({r.reason})" if r.reason else "")
        if r.state in (State.RUNNING, State.WAITING_SIDECARS):
            return f"{r.name}: {state_text(r, view)}"
        break
    return view.phase


def _line(pod: dict, now: datetime) -> dict:
    meta = pod.get("metadata") or {}
    created = parse_time(meta.get("creationTimestamp"))
    line = {"namespace": meta.get("namespace", ""), "name": meta.get("name", ""),
            "strategy": (meta.get("labels") or {}).get(p.LABEL_MANAGED, ""), "steps": "",
            "stands": (pod.get("status") or {}).get("phase") or "Pending",
            "age": _age((now - created).total_seconds()) if created else "", "created": created or now}
    try:
        view = pod_view(pod, now)
    except NotManaged:  # a start-order pod: no steps to count
        return {**line, "json": {k: line[k] for k in ("namespace", "name", "strategy")} | {"phase": line["stands"]}}
    steps = [r for r in view.rows if r.kind == STEP]
    done = sum(r.state == State.COMPLETED for r in steps)
    return {**line, "steps": f"{done}/{len(steps)}", "stands": _stands(view), "json": view.to_json()}


def _lines(pods: Iterable[dict], now: datetime) -> list[dict]:
    return sorted((_line(pod, now) for pod in pods), key=lambda x: (x["namespace"], x["created"], x["name"]))


def _cells(line: dict, all_namespaces: bool) -> list[str]:
    return [*([line["namespace"]] if all_namespaces else []), line["name"], line["strategy"], line["steps"],
            line["stands"], line["age"]]


def _table(lines: list[dict], all_namespaces: bool, *, header: bool = True, widths_of: list[dict] = ()) -> str:
    """The lines as columns; `widths_of`: more lines the columns are as wide as (a watch's)."""
    columns = [*(["NAMESPACE"] if all_namespaces else []), "NAME", "STRATEGY", "STEPS", "STATUS", "AGE"]
    rows = [_cells(x, all_namespaces) for x in lines]
    widths = [max(len(c) for c in col) for col in zip(columns, *rows, *(_cells(x, all_namespaces) for x in widths_of))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n"
                   for row in ([columns] if header else []) + rows)


def render_list(pods: list[dict], fmt: str, now: datetime, all_namespaces: bool) -> str:
    lines = _lines(pods, now)
    return _table(lines, all_namespaces) if fmt == "table" else dump({"items": [x["json"] for x in lines]}, fmt)


async def _watch(api: KubeApi, namespace: str | None, where: str, args: argparse.Namespace, out: TextIO,
                 err: TextIO) -> None:
    pods: dict[tuple[str, str], dict] = {}
    changed = asyncio.Event()
    refused: list[KubeError] = []
    said: set[str] = set()  # what the watch broke with since it last listed: said once, not every retry
    heard = False  # the apiserver has answered

    def key(obj: dict) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return meta.get("namespace", ""), meta.get("name", "")

    def listed(_: str | None, items: list[dict]) -> None:
        nonlocal heard
        heard = True
        said.clear()
        pods.clear()
        pods.update((key(obj), obj) for obj in items)
        changed.set()

    def event(kind: str, obj: dict) -> None:
        if kind == "DELETED":
            pods.pop(key(obj), None)
        else:
            pods[key(obj)] = obj
        changed.set()

    def failed(error: KubeError) -> None:
        nonlocal heard
        # Refused, or an apiserver never reached: the command ends, as without --watch.
        if error.status in _REFUSED or (error.status == 0 and not heard):
            refused.append(error)
            changed.set()
            return
        heard = heard or error.status != 0
        if not error.gone and error.message not in said:  # (a 410 only means: list again)
            said.add(error.message)
            print(f"initshift status: the watch broke ({error.message}); watching again", file=err, flush=True)

    informer = Informer(api, "pods", namespace, label_selector=_selector(args), on_list=listed, on_event=event,
                        on_error=failed, logs=False)
    task = asyncio.create_task(informer.run(), name="status list watch")
    redraw = use_colour(out) and args.output == "table"  # a terminal: clear and redraw in place
    shown: dict[tuple[str, str], tuple] = {}  # each pod's line as last printed, without its age
    try:
        while True:
            try:
                await asyncio.wait_for(changed.wait(), TICK_SECONDS if redraw else None)
            except asyncio.TimeoutError:
                pass
            changed.clear()
            if refused:
                raise unreached(refused[0]) or CliError(f"cannot watch the pods of {where}: {refused[0].message}")
            lines = _lines(list(pods.values()), datetime.now(timezone.utc))
            if redraw:
                out.write(CLEAR + _table(lines, args.all_namespaces))
            else:
                fresh = [x for x in lines if shown.get((x["namespace"], x["name"])) != _cells(x, True)[:-1]]
                if args.output == "table" and fresh:
                    out.write(_table(fresh, args.all_namespaces, header=not shown, widths_of=lines))
                for x in fresh if args.output != "table" else ():
                    out.write(("---\n" if args.output == "yaml" else "") + dump(x["json"], args.output))
                shown.update(((x["namespace"], x["name"]), _cells(x, True)[:-1]) for x in lines)
            out.flush()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _selector(args: argparse.Namespace) -> str:
    """The pods listed: those initshift rewrote, of the labels -l asks for (the apiserver
    parses them, and refuses a malformed one with its own words)."""
    return f"{p.LABEL_MANAGED},{args.selector}" if args.selector else p.LABEL_MANAGED


async def run_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        api, namespace = await connect(args)
        where = "any namespace" if args.all_namespaces else f"namespace {namespace}"
        where += f" with labels {args.selector}" if args.selector else ""
        scope = None if args.all_namespaces else namespace
        async with api:
            if args.watch:
                await _watch(api, scope, where, args, out, err)  # until interrupted
                return EXIT_OK
            try:
                pods, _ = await api.list_pods(scope, label_selector=_selector(args))
            except KubeError as e:
                raise unreached(e) or CliError(f"cannot list the pods of {where}: {e.message}") from None
    except CliError as e:
        print(f"initshift status: {e}", file=err)
        return e.code
    if not pods and args.output == "table":
        print(f"No pod rewritten by initshift in {where}.", file=err)  # as kubectl: on stderr
        return EXIT_OK
    out.write(render_list(pods, args.output, datetime.now(timezone.utc), args.all_namespaces))
    return EXIT_OK
