"""Declared start order of long-running containers (annotation `initshift.io/start-order`).

`istio-proxy,cache;app` means: `app` starts only once `istio-proxy` and `cache` are Ready.
Groups are separated by `;`, names inside a group by `,`. Valid for any restartPolicy.

The rewrite (pure, like the rest of webhook/):
- every container of group k >= 1 is wrapped by `waiter start-after`, which waits for each
  container of group k-1, then execs the original argv (the user's process replaces it);
- how a dependency's readiness is seen, per dependency:
  * httpGet/tcpSocket readiness probe reachable on loopback: the waiter runs it (`--probe`);
  * any other readiness probe (exec, grpc, a remote host): the watcher mirrors the kubelet's
    `ready` into `initshift.io/ready-<name>`, exposed by a downward-API file (`--after-ready-file`);
  * no readiness probe: Ready once started, seen through the startup marker its own waiter
    writes in the shared emptyDir (`--after-marker`). A first-group container without a probe
    is therefore wrapped too, with nothing to wait for: it only writes its marker and execs;
  * a native sidecar (restartable init container): nothing; the kubelet starts regular
    containers only after it has started (its startupProbe passed);
- when native sidecars are supported and the first group holds only recognised sidecars
  (istio-proxy, linkerd-proxy, ...), those become native sidecars instead (the kubelet then
  orders start-up and shutdown), through the native strategy's own conversion;
- a proxy named in the annotation but not injected yet is skipped with a warning: the mesh
  injects after us and the apiserver re-invokes the webhook, which then orders it.

Invalid annotations (syntax, unknown names, a name twice, a cycle, init containers, an
entrypoint that cannot be resolved) deny the pod with one message: nothing is half-applied.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from waiter import protocol as p

from . import _native as native_strategy
from ._classify import classify, managed_as, mark_managed, pod_mode, sidecar_names
from ._entrypoint import ImageEntrypoints, Lookup, needs_image
from ._resources import is_restartable, pod_requests
from ._podcheck import MAX_OBJECT_BYTES, is_annotation_key
from ..settings import Settings
from ._command import Argv, read_argv, start_after_command, waiter_command
from ._errors import RewriteError
from ._reasons import Reason
from ._waiter import (argvs_of, check_reserved, init_container_within, loopback_probe, merge_ours, reserved_mounts,
                      with_pull_secrets)

REASON = Reason.INVALID_START_ORDER
# The fewest bytes one wait takes in the pod's JSON: a flag and its value ("--probe",
# "tcp://127.0.0.1:1") with their quotes and commas.
_FLAG_BYTES = len(p.FLAG_PROBE) + len("tcp://127.0.0.1:1") + 6
_OUR_VOLUMES = (p.BIN_VOLUME, p.MARKER_VOLUME, p.CONTAINER_READY_VOLUME)


def requested(pod: Mapping) -> bool:
    return p.ANNOTATION_START_ORDER in (((pod.get("metadata") or {}).get("annotations")) or {})


def is_managed(pod: Mapping) -> bool:
    return managed_as(pod) == p.MANAGED_START_ORDER


def _deny(problems: Sequence[str], value: object = None) -> RewriteError:
    what = p.ANNOTATION_START_ORDER if value is None else f"{p.ANNOTATION_START_ORDER}={value!r}"
    return RewriteError(f"invalid {what}: {'; '.join(problems)}", deny=True, reason=REASON)


# --- the annotation ----------------------------------------------------------------------------

def parse_groups(value: object) -> list[list[str]]:
    """Groups of container names, in start order; raises a denying RewriteError."""
    if not isinstance(value, str) or not value.strip():
        raise _deny(["expected groups of container names like 'istio-proxy,cache;app'"], value)
    raw = value.split(";")
    if not raw[-1].strip():
        raw = raw[:-1]  # a trailing ';' is harmless
    problems: list[str] = []
    groups: list[list[str]] = []
    where: dict[str, int] = {}
    for i, text in enumerate(raw, 1):
        names = [n.strip() for n in text.split(",")]
        if not any(names):
            problems.append(f"group {i} is empty")
            continue
        if not all(names):
            problems.append(f"group {i} has an empty name")
        for name in filter(None, names):
            if name in where:
                problems.append(f"{name!r} is listed twice in group {i}" if where[name] == i else
                                f"{name!r} is in groups {where[name]} and {i}: it would wait for itself (a cycle)")
            where.setdefault(name, i)
        groups.append([n for n in dict.fromkeys(names) if n])
    if not problems and len(groups) < 2:
        problems.append("a single group orders nothing; separate groups with ';' (a,b;c starts c after a and b)")
    if problems:
        raise _deny(problems, value)
    return groups


@dataclass
class Order:
    """The annotation checked against the pod: the groups of containers present."""

    groups: list[list[str]]
    missing: list[str] = field(default_factory=list)  # recognised sidecars not injected yet


def check(pod: Mapping, settings: Settings) -> Order:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    value = annotations.get(p.ANNOTATION_START_ORDER)
    groups = parse_groups(value)
    spec = pod.get("spec") or {}
    regular = {c.get("name") for c in spec.get("containers") or []}
    inits = {c.get("name"): c for c in spec.get("initContainers") or []}
    proxies = sidecar_names(annotations, settings.rewrite)
    problems: list[str] = []
    missing: list[str] = []
    for i, group in enumerate(groups):
        for name in group:
            init = inits.get(name)
            if name in regular:
                continue
            if init is not None and not is_restartable(init):
                problems.append(f"{name!r} is an init container; only regular containers and native sidecars "
                                f"can be ordered")
            elif init is not None and i > 0:
                problems.append(f"native sidecar {name!r} always starts before the regular containers; it can "
                                f"only be in the first group")
            elif init is None and name in proxies:
                missing.append(name)
            elif init is None:
                problems.append(f"{name!r} is not a container of this pod")
    if problems:
        raise _deny(problems, value)
    present = [[n for n in g if n not in missing] for g in groups]
    return Order([g for g in present if g], missing)


# --- the plan ----------------------------------------------------------------------------------

@dataclass
class Ordering:
    order: Order
    to_native: list[str] = field(default_factory=list)  # first-group sidecars made native
    waits: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # container -> (flag, value) conditions
    markers: list[str] = field(default_factory=list)  # containers whose marker someone reads
    ready_files: list[str] = field(default_factory=list)  # containers whose ready annotation is read

    def wrapped(self, previously: Sequence[str] = ()) -> list[str]:
        """Wrapped containers, in start order; once wrapped, always wrapped (re-invocation)."""
        markers, before = set(self.markers), set(previously)
        names = [n for g in self.order.groups for n in g if self.waits.get(n) or n in markers or n in before]
        return list(dict.fromkeys(names))


def _native_wanted(pod: Mapping, settings: Settings, native_supported: bool | None, first: list[str]) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    mode = pod_mode(pod, settings.rewrite)
    if not (mode == p.MODE_NATIVE or (mode == p.MODE_AUTO and native_supported)):
        return False
    regular = {c.get("name") for c in (pod.get("spec") or {}).get("containers") or []}
    proxies = sidecar_names(annotations, settings.rewrite)
    return all(n in proxies for n in first) and any(n in regular for n in first)


def ordering(pod: Mapping, settings: Settings, native_supported: bool | None) -> Ordering:
    """What the rewrite does, decided on the pod as it is (natives decided, not yet moved)."""
    order = check(pod, settings)
    out = Ordering(order)
    if not order.groups:
        return out
    spec = pod.get("spec") or {}
    regular = {c.get("name"): c for c in spec.get("containers") or []}
    natives = {c.get("name") for c in spec.get("initContainers") or [] if is_restartable(c)}
    if len(order.groups) > 1 and _native_wanted(pod, settings, native_supported, order.groups[0]):
        out.to_native = [n for n in order.groups[0] if n in regular]
        natives |= set(out.to_native)
    # Each container waits for every one of the group before it: the flags grow as the
    # product of two groups' sizes. They are counted as they are made, and a product that
    # alone would not fit etcd is refused before it is built any further.
    room = MAX_OBJECT_BYTES
    for before, group in zip(order.groups, order.groups[1:]):
        each = _FLAG_BYTES * sum(dep not in natives for dep in before)  # at least, per container of `group`
        for name in group:
            flags: list[tuple[str, str]] = []
            room -= each
            if room < 0:
                raise RewriteError(f"invalid {p.ANNOTATION_START_ORDER}: each container waits for every container of "
                                   f"the group before it, and these groups would need over {MAX_OBJECT_BYTES} bytes "
                                   f"of flags, past the object limit of etcd", deny=True, reason=Reason.TOO_LARGE)
            for dep in before:
                if dep in natives:
                    continue  # the kubelet starts regular containers after native sidecars
                c = regular[dep]
                url = loopback_probe(c)
                if url:
                    flags.append((p.FLAG_PROBE, url))
                elif c.get("readinessProbe"):
                    if not is_annotation_key(f"{p.ANNOTATION_READY_PREFIX}{dep}"):
                        raise _deny([f"{dep!r} is waited for through the annotation {p.ANNOTATION_READY_PREFIX}<name>, "
                                     f"and its name is too long for an annotation key (at most "
                                     f"{63 - len(p.ANNOTATION_READY_PREFIX.split('/', 1)[1])} characters)"])
                    flags.append((p.FLAG_AFTER_READY_FILE, p.container_ready_path(dep)))
                    out.ready_files.append(dep)
                else:
                    flags.append((p.FLAG_AFTER_MARKER, p.marker_path(dep)))
                    out.markers.append(dep)
            out.waits[name] = flags
    out.markers = list(dict.fromkeys(out.markers))
    out.ready_files = list(dict.fromkeys(out.ready_files))
    return out


# --- re-invocation -----------------------------------------------------------------------------

def _is_wrapped(c: Mapping) -> bool:
    return waiter_command(c) == p.CMD_START_AFTER


def _ours(name: object) -> bool:
    return name in _OUR_VOLUMES


def _prior_argvs(pod: Mapping) -> dict[str, Argv]:
    """For a pod this step already rewrote: the argv of each container it wrapped (the
    original `command` is gone, the wrapped argv is the truth)."""
    if not is_managed(pod):
        return {}
    return {c["name"]: read_argv(c) for c in (pod.get("spec") or {}).get("containers") or [] if _is_wrapped(c)}


# --- building ----------------------------------------------------------------------------------

def _wrap(c: Mapping, conditions: list[tuple[str, str]], marker: bool, settings: Settings,
          argv: list[str], argv_map: dict | None) -> dict:
    name = str(c["name"])
    flags = {flag for flag, _ in conditions}
    mounts = [{"name": p.BIN_VOLUME, "mountPath": p.BIN_MOUNT, "readOnly": True}]
    if marker or p.FLAG_AFTER_MARKER in flags:
        # One shared volume: the containers of one pod trust each other (unlike build steps).
        mounts.append({"name": p.MARKER_VOLUME, "mountPath": p.MARKER_MOUNT, "readOnly": not marker})
    if p.FLAG_AFTER_READY_FILE in flags:
        mounts.append({"name": p.CONTAINER_READY_VOLUME, "mountPath": p.CONTAINER_READY_MOUNT, "readOnly": True})
    out = dict(c)
    out["command"] = [p.WAITER_PATH]
    out["args"] = start_after_command(name=name, argv=argv, marker=p.marker_path(name) if marker else None,
                                      conditions=conditions, max_wait=settings.rewrite.start_order_max_wait_seconds,
                                      argv_map=argv_map)
    out["volumeMounts"] = merge_ours(c.get("volumeMounts") or [], mounts, _ours)
    return out


def _container_ready_volume(names: Sequence[str]) -> dict:
    return {"name": p.CONTAINER_READY_VOLUME, "downwardAPI": {"items": [
        {"path": n, "fieldRef": {"fieldPath": f"metadata.annotations['{p.ANNOTATION_READY_PREFIX}{n}']"}}
        for n in names]}}


def _make_native(pod: dict, names: list[str], settings: Settings) -> tuple[dict, list[str]]:
    cls = classify(pod, settings.rewrite)
    cls = dataclasses.replace(cls, sidecars=[c for c in cls.sidecars if c.get("name") in names])
    try:
        return native_strategy.move_sidecars(pod, cls, settings.rewrite)
    except RewriteError as e:
        raise _deny([str(e)]) from None


def lookups(pod: Mapping, pl: Ordering) -> list[Lookup]:
    """Images this step needs: wrapped containers without `command` it has not wrapped before."""
    try:
        prior = _prior_argvs(pod)
    except RewriteError:
        return []  # the rewrite refuses the pod with the full message
    by_name = {c.get("name"): c for c in (pod.get("spec") or {}).get("containers") or []}
    return [Lookup(n, str(by_name[n].get("image"))) for n in pl.wrapped(list(prior))
            if n not in prior and needs_image(by_name[n])]


def build(pod: Mapping, settings: Settings, images: Mapping[str, ImageEntrypoints], pl: Ordering) -> tuple[dict, list[str]]:
    """The pod with its start order applied, and warnings; raises RewriteError (denying); `pl` is `plan(pod, ...)`.
    Re-invocation recomputes everything from the pod as it is: our parts are replaced in
    place, the argv of containers already wrapped is read back from their waiter args."""
    managed = is_managed(pod)
    prior = _prior_argvs(pod)
    out = dict(pod)
    warnings = [f"{n!r} named in {p.ANNOTATION_START_ORDER} is not in the pod yet; it is ordered when the mesh "
                f"injects it and initshift is re-invoked" for n in pl.order.missing]
    if pl.to_native:
        out, notes = _make_native(out, pl.to_native, settings)
        warnings += notes
    wrapped = pl.wrapped(list(prior))
    if not wrapped:
        if pl.to_native:
            mark_managed(out, p.MANAGED_START_ORDER)
        elif not pl.order.missing:
            warnings.append(f"{p.ANNOTATION_START_ORDER}: every container waited for is a native sidecar, "
                            f"which the kubelet starts before the regular containers")
        return out, warnings
    spec = out["spec"] = dict(out["spec"])
    containers = spec["containers"]
    wrapping = set(wrapped)
    try:
        if not managed:  # a declared order is never dropped silently: a collision denies the pod
            check_reserved(out, [c for c in containers if c["name"] in wrapping])
        else:  # re-invoked: a container added since (another webhook's) must not reach our volumes
            problems = reserved_mounts([c for c in [*(spec.get("initContainers") or []), *containers]
                                        if c["name"] not in wrapping and c["name"] != p.INIT_CONTAINER_NAME])
            if problems:
                raise RewriteError(problems[0])
    except RewriteError as e:
        raise _deny([str(e)]) from None
    try:
        argvs = argvs_of([c for c in containers if c["name"] in wrapping], images, prior)
    except RewriteError as e:
        raise _deny([str(e)]) from None
    markers = set(pl.markers)
    spec["containers"] = [
        _wrap(c, pl.waits.get(c["name"], []), c["name"] in markers, settings, *argvs[c["name"]])
        if c["name"] in wrapping else c for c in containers]

    # initshift-init copies the waiter; its requests fit in what the pod already reserves.
    inits = [c for c in spec.get("initContainers") or [] if c.get("name") != p.INIT_CONTAINER_NAME]
    ours = init_container_within(settings.rewrite, pod_requests(pod.get("spec") or {}), inits)
    spec["initContainers"] = merge_ours(spec.get("initContainers") or [], [ours],
                                        lambda n: n == p.INIT_CONTAINER_NAME)
    with_pull_secrets(spec, settings.rewrite)
    wanted = [{"name": p.BIN_VOLUME, "emptyDir": {}}]
    if pl.markers:
        wanted.append({"name": p.MARKER_VOLUME, "emptyDir": {}})
    if pl.ready_files:
        wanted.append(_container_ready_volume(pl.ready_files))
        warnings.append(f"{', '.join(map(repr, pl.ready_files))}: readiness probes the waiter cannot run on "
                        f"loopback; the containers after them wait for the watcher's "
                        f"{p.ANNOTATION_READY_PREFIX}<name> annotations")
    spec["volumes"] = merge_ours(spec.get("volumes") or [], wanted, _ours)
    mark_managed(out, p.MANAGED_START_ORDER)
    return out, warnings


# --- the watcher's part ------------------------------------------------------------------------

def _watched_containers(pod: Mapping) -> list[str]:
    """Containers whose readiness the pod reads through `initshift.io/ready-<name>`."""
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if v.get("name") == p.CONTAINER_READY_VOLUME:
            return [str(i.get("path")) for i in (v.get("downwardAPI") or {}).get("items") or []]
    return []


def start_order_ready_patch(pod: Mapping) -> dict | None:
    """The merge patch that makes each `initshift.io/ready-<name>` annotation equal the
    kubelet's `ready` for that container ("true"/"false"), or None when they already agree."""
    names = _watched_containers(pod)
    if not names:
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    changes = {}
    for name in names:
        value = "true" if (statuses.get(name) or {}).get("ready") is True else "false"
        key = f"{p.ANNOTATION_READY_PREFIX}{name}"
        if annotations.get(key) != value:
            changes[key] = value
    return {"metadata": {"annotations": changes}} if changes else None
