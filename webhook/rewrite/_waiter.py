"""The waiter strategy: init containers become ordered regular containers run by the waiter.

Chain written into the pod (every name from waiter/protocol.py):
- `initshift-init` (last init container) copies the waiter into emptyDir `initshift-bin`,
  mounted read-only at /initshift/bin in every wrapped container;
- every wrapped container (steps in order, then the mains) gets run emptyDir number i at
  /initshift/run/i, writable only there; it mounts read-only the run dir it waits for (the
  previous step's; the last step's for the mains), so no container can forge a step's
  completion;
- step 0 waits for the ready gate (downward-API file of `initshift.io/ready`, plus loopback
  probes when every sidecar has an httpGet/tcpSocket readiness probe);
- the mains wait for the last step (in a pod without steps, a Job's, each main waits for
  the ready gate as step 0 would, and again when the kubelet restarts it); each writes its
  record under its own name into the one emptyDir they share (`initshift-mains`), and the
  one that then finds every main's record there quits the sidecars. Each main's flags and
  mounts are the same few whatever the number of mains, so the pod grows linearly with
  them. The trade-off: any main can write there, so it could forge another main's record
  (the sidecars quit early, which only cuts the mesh from its own pod's mains) or delete
  one (the sidecars stay up until the watcher ends the pod); it cannot forge a step's
  completion, so no step can be skipped.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from waiter import protocol as p

from . import _hold as hold
from ._classify import Classification, managed_as, mark_managed, sidecar_names
from ._command import MAX_ARG_BYTES, Argv, argv_map_bytes, gate_of, gate_probes, read_argv, run_command
from ._errors import RewriteError
from ._reasons import Reason
from ._strategy import Built
from ._entrypoint import ImageEntrypoints, argv_by_platform, effective_argv, needs_image
from ._quantity import format_quantity
from ._quit import open_quit, quit_url, refused_note
from ._resources import (Amounts, Read, ReadOnce, add, apply_requests, container_amounts, effective, growth_of,
    is_restartable, mesh_alone, pin_request_refs, plan_steps, pod_level, record_budget, recorded_budget, requests_and_qos,
    restartable_sum, sum_requests, take_back)
from ..settings import RewriteSettings
from ._podcheck import MAX_OBJECT_BYTES
from ._shape import mapping_at, submap

# initshift-init copies ~20 MB once: tiny requests (capped by what the pod already
# reserves, so the pod never grows), limits that keep a runaway copy in check.
_INIT_REQUESTS: Amounts = {"cpu": 10, "memory": 16 * 2**20}  # 10m, 16Mi
_INIT_LIMITS = {"cpu": "500m", "memory": "64Mi"}

def _restricted_security_context() -> dict:
    """A new one each time (the pod owns it; built, not deep-copied: this runs per review)."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": p.IMAGE_UID,
        "runAsGroup": p.IMAGE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }

_LOOPBACK_HOSTS = (None, "", "127.0.0.1", "localhost")
OWN_CONTAINERS = (p.INIT_CONTAINER_NAME, p.COPY_CONTAINER_NAME)  # the waiter's copiers: they mount its volume


def init_container_within(settings: RewriteSettings, reserved: Amounts, init_containers: Sequence[Mapping],
                          read: Read = container_amounts) -> dict:
    """`initshift-init`, last of `init_containers` (so beside every native sidecar among
    them), its requests within what the pod `reserved` before the rewrite."""
    natives = restartable_sum(init_containers, read)
    return init_container(settings, {r: max(0, v - natives.get(r, 0)) for r, v in reserved.items()})


def _copying(settings: RewriteSettings, name: str, command: Sequence[str]) -> dict:
    """A container of initshift's own image that copies the waiter into `initshift-bin`."""
    return {
        "name": name,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(command),
        "volumeMounts": [{"name": p.BIN_VOLUME, "mountPath": p.BIN_MOUNT}],
        "securityContext": _restricted_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def init_container(settings: RewriteSettings, budget: Amounts | None = None) -> dict:
    """The injected `initshift-init` container. `budget` caps its requests (None: no cap)."""
    c = _copying(settings, p.INIT_CONTAINER_NAME, p.INIT_COMMAND)
    if budget is not None and not any(budget.get(r) for r in _INIT_REQUESTS):
        return c  # a BestEffort-like pod: adding requests would change its class
    requests = {r: format_quantity(min(v, budget.get(r, 0)) if budget is not None else v, r)
                for r, v in _INIT_REQUESTS.items()}
    c["resources"] = {"requests": requests, "limits": dict(_INIT_LIMITS)}
    return c


def copier_container(settings: RewriteSettings, reserved: Amounts) -> dict:
    """Hybrid's `initshift-copy`, the first regular container: its postStart hook copies the
    waiter (the kubelet starts step 0 only once the hook has returned), its process waits
    for the hook to end and exits 0. It runs beside the steps, so it requests nothing (the
    pod's effective request stays the one admitted; it only copies, once) and has
    initshift-init's limits; in a pod that `reserved` nothing, no resources at all (the
    pod stays BestEffort)."""
    c = _copying(settings, p.COPY_CONTAINER_NAME, p.COPY_HOLD_COMMAND)
    c["lifecycle"] = {"postStart": {"exec": {"command": list(p.COPY_HOOK_COMMAND)}}}
    if any(reserved.get(r) for r in _INIT_REQUESTS):
        c["resources"] = {"requests": {r: "0" for r in _INIT_REQUESTS}, "limits": dict(_INIT_LIMITS)}
    return c


def with_pull_secrets(spec: dict, settings: RewriteSettings) -> None:
    """INITSHIFT_IMAGE_PULL_SECRETS added to `spec`'s `imagePullSecrets` (after the pod's
    own, each name once), where the pod is given a container of initshift's image: the
    kubelet pulls every image of a pod with the pod's secrets (and the node's credentials).
    A name the namespace has no Secret of costs an event, not the pull."""
    if not settings.image_pull_secrets:
        return
    own = spec.get("imagePullSecrets") or []  # a list of objects, each `name` a string (_shape.py)
    have = {ref.get("name") for ref in own}
    added = [{"name": name} for name in settings.image_pull_secrets if name not in have]
    if added:
        spec["imagePullSecrets"] = [*own, *added]


# --- the ready gate -------------------------------------------------------------------------

def _port(container: Mapping, port: object) -> int | None:
    if isinstance(port, int):
        return port
    for cp in container.get("ports") or []:
        if cp.get("name") == port and isinstance(cp.get("containerPort"), int):
            return cp["containerPort"]
    return None


def loopback_probe(container: Mapping) -> str | None:
    """The sidecar's readiness probe as a URL the waiter can check on loopback, if it can."""
    probe = container.get("readinessProbe") or {}
    if "httpGet" in probe:
        h = probe["httpGet"] or {}
        port = _port(container, h.get("port"))
        if h.get("host") not in _LOOPBACK_HOSTS or h.get("httpHeaders") or port is None:
            return None
        scheme = str(h.get("scheme") or "HTTP").lower()
        path = str(h.get("path") or "/")
        return f"{scheme}://127.0.0.1:{port}{path if path.startswith('/') else '/' + path}"
    if "tcpSocket" in probe:
        t = probe["tcpSocket"] or {}
        port = _port(container, t.get("port"))
        if t.get("host") not in _LOOPBACK_HOSTS or port is None:
            return None
        return f"tcp://127.0.0.1:{port}"
    return None


def gate(sidecars: Sequence[Mapping], hybrid: bool = False) -> tuple[str | None, list[str]]:
    """Step 0's gate, as (ready file, loopback probes): none without sidecars; the probes
    when every sidecar has one, else the ready file, the watcher's `initshift.io/ready`
    (it writes that annotation only for a gate that reads it: a probe gate has no file).

    `hybrid`: a native sidecar without a loopback probe is left out: it holds every regular
    container back by the kubelet's start order (its startupProbe), which needs no watcher
    and comes sooner than the watcher's ready annotation for the same check."""
    if hybrid:
        sidecars = [s for s in sidecars if loopback_probe(s) or not is_restartable(s)]
    if not sidecars:
        return None, []
    probes = [loopback_probe(s) for s in sidecars]
    return (None, [str(url) for url in probes]) if all(probes) else (p.READY_FILE, [])


def _ready_volume() -> dict:
    return {
        "name": p.READY_VOLUME,
        "downwardAPI": {"items": [{
            "path": p.READY_FILE_NAME,
            "fieldRef": {"fieldPath": f"metadata.annotations['{p.ANNOTATION_READY}']"},
        }]},
    }


# --- wrapping one container --------------------------------------------------------------

@dataclass(frozen=True)
class _Chain:
    """Everything about the pod that decides a wrapped container's flags and mounts."""

    n_steps: int
    n_mains: int
    ready_file: str | None  # the gate (see gate()), decided once for every container it holds
    probes: tuple[str, ...]
    quitted: frozenset[str]  # the regular sidecars the last main quits (their quit needs: _quit.py)
    quit_urls: tuple[str, ...]
    retry: bool
    skip_fails: bool  # a skipped container exits with the failed step's code (skips_fail)
    step_timeout: int

    def is_main(self, index: int) -> bool:
        return index >= self.n_steps

    def waits_for(self, index: int) -> int | None:
        """The run dir whose record this container waits for; None: it waits for the gate
        (step 0, or every main of a pod without steps)."""
        if index < self.n_steps:
            return index - 1 if index else None
        return self.n_steps - 1 if self.n_steps else None

    def quits(self, index: int) -> bool:
        # The mains quit the sidecars; a pod without mains lets its last step do it.
        return self.is_main(index) or (self.n_mains == 0 and index == self.n_steps - 1)


# Where the waiter writes its record in a container whose termination message is its log's
# tail when it fails (_own_termination_log): its own run dir, which nothing reads it from.
OWN_TERMINATION_LOG = "termination-log"


def _own_termination_log(container: Mapping, index: int) -> str | None:
    """The waiter's `--termination-log` for the container wrapped at `index`: None (the
    kubelet's file) but for a container with `terminationMessagePolicy:
    FallbackToLogsOnError` at the default path, whose record goes to its own run dir.

    The kubelet makes a failed container's log tail its termination message only where the
    file is empty, so the waiter's record there replaced a failing step's own last words
    (`{"exitCode": 2, ..., "message": "exited with code 2"}` where `kubectl describe` and
    `initshift status` showed the error without initshift). The watcher reads such a
    container from the kubelet's report, as one whose pod sets its own path; a message the
    program writes to /dev/termination-log itself is still the kubelet's to show."""
    if container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return None
    if container.get("terminationMessagePath") not in (None, p.DEFAULT_TERMINATION_LOG):
        return None  # the waiter writes none there anyway
    return f"{p.run_mount(index)}/{OWN_TERMINATION_LOG}"


def wrap(container: Mapping, index: int, chain: _Chain,
         argv: list[str] | None, argv_map: Mapping[str, list[str]] | None) -> dict:
    """The container run by the waiter at position `index` of the execution order."""
    mounts = [m for m in container.get("volumeMounts") or [] if not _is_our_volume(m.get("name"))]
    mounts.append({"name": p.BIN_VOLUME, "mountPath": p.BIN_MOUNT, "readOnly": True})
    mounts.append({"name": p.run_volume(index), "mountPath": p.run_mount(index)})
    wait = chain.waits_for(index)
    if wait is not None:
        mounts.append({"name": p.run_volume(wait), "mountPath": p.run_mount(wait), "readOnly": True})
    ready_file, probes = (chain.ready_file, chain.probes) if wait is None else (None, ())
    if ready_file:
        mounts.append({"name": p.READY_VOLUME, "mountPath": p.READY_MOUNT, "readOnly": True})
    main = chain.is_main(index)
    if main:  # the mains learn about each other through one shared directory
        mounts.append({"name": p.MAINS_VOLUME, "mountPath": p.MAINS_MOUNT})
    out = dict(container)
    out["command"] = [p.WAITER_PATH]
    out["args"] = run_command(
        name=str(container["name"]), post=p.completion_path(index), argv=argv or [],
        wait=None if wait is None else p.completion_path(wait), ready_file=ready_file, probes=probes,
        timeout=0 if main else chain.step_timeout, retry=chain.retry, skip_fails=chain.skip_fails,
        quits=chain.quit_urls if chain.quits(index) else (),
        mains_dir=p.MAINS_MOUNT if main else None, mains=chain.n_mains if main else 0,
        # A terminationMessagePath the pod sets is its program's, in the format its reader
        # expects (Tekton's steps: a JSON array of results, which the waiter's record of a
        # skipped step would break): the waiter writes its record only to the default path,
        # which the kubelet creates only when the pod sets none. See _own_termination_log
        # for the one container whose default path gets no record either.
        termination_log=_own_termination_log(container, index),
        argv_map=None if argv_map is None else dict(argv_map))
    out["volumeMounts"] = mounts
    return out


def skips_fail(pod: Mapping) -> bool:
    """Whether the waiter's skipped containers exit with the failed step's code rather than
    0 (p.FLAG_SKIP_FAILS): in a pod a controller other than a Job owns, whose restartPolicy
    is Never.

    Such a controller reads the containers' exit codes for its verdict: kpack takes a pod
    ended by a deadline whose `completion` exited 0 for a built image (and sets that
    deadline itself when a sidecar outlives `completion`), Tekton a step's code for the
    step's result. A skip that exits 0 tells them a step that never ran succeeded. 0 stays
    where it is needed or harmless: a Job's pods (its podFailurePolicy matches every
    non-zero code of the container a rule names, and under init containers the main never
    ran), a pod without a controller (people read it; so does `initshift mutate` a Job's
    template, which has no owner yet: it must write what the webhook will), and a pod
    whose containers restart (one exiting non-zero would be restarted)."""
    if mapping_at(pod, "spec").get("restartPolicy") != "Never":
        return False
    owners = mapping_at(pod, "metadata").get("ownerReferences")
    owner = next((o for o in owners if isinstance(o, dict) and o.get("controller") is True), None) \
        if isinstance(owners, list) else None
    return owner is not None and not (owner.get("kind") == "Job" and str(owner.get("apiVersion")).startswith("batch/"))


def _chain(settings: RewriteSettings, pod: Mapping, n_steps: int, n_mains: int,
            sidecars: Sequence[Mapping], regular_sidecars: Sequence[Mapping], annotations: Mapping,
            hybrid: bool = False) -> _Chain:
    # Only regular sidecars are quit: the kubelet stops native ones after the last regular container.
    quitted = [s for s in regular_sidecars if s.get("name") in settings.quit_endpoints]
    ready_file, probes = gate(sidecars, hybrid)
    # Every container the gate holds (step 0, or each main of a pod without steps) carries
    # every probe: with many of both the pod grows as their product. Refused here, before
    # that product is built, when it alone would not fit etcd (the safety net would refuse
    # the finished pod anyway, after quadratic work).
    gated = 1 if n_steps else n_mains
    flags = sum(len(url) + len(p.FLAG_PROBE) + 8 for url in probes)  # 8: JSON quotes and commas
    if gated * flags > MAX_OBJECT_BYTES:
        raise RewriteError(f"{gated} containers would each wait for {len(probes)} sidecar probes, over "
                           f"{gated * flags} bytes, past the {MAX_OBJECT_BYTES}-byte object limit of etcd",
                           reason=Reason.TOO_LARGE)
    return _Chain(n_steps=n_steps, n_mains=n_mains, ready_file=ready_file, probes=tuple(probes),
                  quitted=frozenset(str(s["name"]) for s in quitted),
                  quit_urls=tuple(quit_url(s, settings.quit_endpoints[s["name"]], annotations) for s in quitted),
                  retry=mapping_at(pod, "spec").get("restartPolicy") == "OnFailure", skip_fails=skips_fail(pod),
                  step_timeout=settings.step_timeout_seconds)


_OUR_VOLUMES = frozenset((p.BIN_VOLUME, p.READY_VOLUME, p.MAINS_VOLUME))  # and the run dirs


def _is_our_volume(name: object) -> bool:
    return name in _OUR_VOLUMES or str(name).startswith(p.RUN_VOLUME_PREFIX)


def merge_ours(old: Sequence[dict], wanted: Sequence[dict], ours: Callable[[object], bool]) -> list[dict]:
    """`old` with our entries (by name) replaced in place by `wanted`, dropped when no longer
    wanted, and the missing ones appended: what another injector added after ours stays
    after ours, so re-invocation changes nothing it does not have to."""
    by_name = {w["name"]: w for w in wanted}
    kept = [by_name.pop(x["name"], None) if ours(x.get("name")) else x for x in old]
    return [x for x in kept if x is not None] + [w for w in wanted if w["name"] in by_name]


def _volumes(spec: Mapping, n_wrapped: int, gate: bool, mains: bool) -> list[dict]:
    wanted = [{"name": p.BIN_VOLUME, "emptyDir": {}}]
    wanted += [{"name": p.run_volume(i), "emptyDir": {}} for i in range(n_wrapped)]
    if mains:
        wanted.append({"name": p.MAINS_VOLUME, "emptyDir": {}})
    if gate:
        wanted.append(_ready_volume())
    return merge_ours(spec.get("volumes") or [], wanted, _is_our_volume)


# --- the whole pod ------------------------------------------------------------------------

def _argv_for(c: Mapping, images: Mapping[str, ImageEntrypoints]) -> tuple[list[str] | None, dict | None]:
    if not needs_image(c):
        return effective_argv(c, None), None
    # The argv goes into `args`, where the kubelet expands $(VAR): the image's words are escaped.
    per_platform = argv_by_platform(c, images.get(str(c.get("image"))), for_args=True)
    if per_platform is None:
        return None, None
    distinct = {json.dumps(v) for v in per_platform.values()}
    if len(distinct) == 1:
        return next(iter(per_platform.values())), None
    # The platforms differ: the map holds only the image's words (ENTRYPOINT, and CMD when the
    # container sets no args); the container's own args stay separate words after `--`, so
    # the kubelet expands $(VAR) in them exactly as before instead of inside a JSON string.
    args = list(c.get("args") or [])
    prefixes = {key: argv[: len(argv) - len(args)] for key, argv in per_platform.items()}
    return args, prefixes


def argvs_of(containers: Sequence[Mapping], images: Mapping[str, ImageEntrypoints],
             known: Mapping[str, Argv] | None = None) -> dict[str, Argv]:
    """Each container's argv for the waiter (`known`: read back from a wrapped container);
    RewriteError naming every container whose image's ENTRYPOINT is unknown, or whose
    per-platform words the waiter cannot be given (over one exec argument's limit: the
    container would never start, where without initshift it runs)."""
    out: dict[str, Argv] = {}
    missing, too_long = [], []
    for c in containers:
        argv, argv_map = (known or {}).get(c["name"]) or _argv_for(c, images)
        if argv is None:
            missing.append(f"{c.get('name')!r} (image {c.get('image')!r})")
        elif argv_map is not None and (size := argv_map_bytes(argv_map)) > MAX_ARG_BYTES:
            too_long.append(f"{c.get('name')!r} (image {c.get('image')!r}: {size:,} bytes)")
        out[c["name"]] = (argv or [], argv_map)
    if missing:
        raise RewriteError(f"containers without `command` need their image's ENTRYPOINT, which is not known: "
                         f"{', '.join(missing)}; set `command` on them (or turn on registry lookup)",
                         reason=Reason.UNRESOLVED_ENTRYPOINT)
    if too_long:
        # The same decision as an unknown ENTRYPOINT: on_unresolved, and auto's native fallback.
        raise RewriteError(f"containers without `command` whose image's ENTRYPOINT and CMD differ by platform, "
                           f"which the waiter gets as one argument, over the {MAX_ARG_BYTES:,} bytes Linux allows "
                           f"one: {', '.join(too_long)}; set `command` (and `args`) on them",
                           reason=Reason.UNRESOLVED_ENTRYPOINT)
    return out


_RESERVED_ROOT = p.BIN_MOUNT.rsplit("/", 1)[0]  # /initshift: every path initshift mounts is under it
_RESERVED_NAME = _RESERVED_ROOT.strip("/")
# Every volume initshift adds, whatever the strategy (the run dirs are p.RUN_VOLUME_PREFIX + i).
_RESERVED_VOLUMES = (p.BIN_VOLUME, p.READY_VOLUME, p.MAINS_VOLUME, p.MARKER_VOLUME, p.CONTAINER_READY_VOLUME)


def _is_reserved_volume(name: object) -> bool:
    return name in _RESERVED_VOLUMES or str(name).startswith(p.RUN_VOLUME_PREFIX)


def _normalised_path(path: object) -> str:
    """A mountPath as the container sees it: `//initshift/run/0`, `/./initshift/run/0` and
    `/x/../initshift/run/0` are all /initshift/run/0 (normpath keeps a leading `//`)."""
    return posixpath.normpath("/" + str(path).lstrip("/"))


def _under_reserved_root(path: object) -> bool:
    if _RESERVED_NAME not in str(path):  # normalising only drops segments: it cannot make the name appear
        return False
    normal = _normalised_path(path)
    return normal == _RESERVED_ROOT or normal.startswith(_RESERVED_ROOT + "/")


def reserved_mounts(containers: Sequence[Mapping]) -> list[str]:
    """Containers mounting a volume initshift adds: only the ones it wraps may (a container
    it does not wrap could forge a step's completion or replace the waiter every step runs)."""
    return [f"container {c.get('name')!r} mounts {m.get('name')!r}, a volume only initshift's own containers mount"
            for c in containers for m in c.get("volumeMounts") or [] if _is_reserved_volume(m.get("name"))]


def _every_container(spec: Mapping) -> list[Mapping]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or [])]


def unlabelled_copy(pod: Mapping) -> str | None:
    """initshift's own container in a pod that also defines initshift's volume but has no
    `initshift.io/managed` label: a copy of a pod initshift rewrote, made without its labels
    (`kubectl debug --copy-to` drops them by default). None for any other pod."""
    if managed_as(pod) is not None:
        return None
    spec = mapping_at(pod, "spec")
    if not any(v.get("name") == p.BIN_VOLUME for v in spec.get("volumes") or []):
        return None
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return next((str(c["name"]) for c in containers if c.get("name") in OWN_CONTAINERS), None)


def check_reserved(pod: Mapping, wrapped: Sequence[Mapping]) -> None:
    """Before the first rewrite: the pod uses none of initshift's names or paths."""
    spec = pod.get("spec") or {}
    for v in spec.get("volumes") or []:
        if _is_reserved_volume(v.get("name")):
            raise RewriteError(f"volume name {v.get('name')!r} is reserved by initshift", reason=Reason.RESERVED)
    containers = _every_container(spec)
    for c in containers:
        if c.get("name") in OWN_CONTAINERS:
            raise RewriteError(f"container name {c.get('name')!r} is reserved by initshift", reason=Reason.RESERVED)
    problems = reserved_mounts(containers)
    if problems:
        raise RewriteError(f"{problems[0]}; the pod does not define it, initshift would", reason=Reason.RESERVED)
    for c in wrapped:
        for m in c.get("volumeMounts") or []:
            if _under_reserved_root(m.get("mountPath", "")):
                raise RewriteError(f"container {c.get('name')!r} mounts {m.get('mountPath')!r}; {_RESERVED_ROOT} "
                                   f"is reserved by initshift", reason=Reason.RESERVED)


def build(pod: Mapping, cls: Classification, settings: RewriteSettings,
          images: Mapping[str, ImageEntrypoints], lookup_error: str | None = None) -> Built:
    """The waiter strategy (the module docstring); raises RewriteError when it cannot be done."""
    out, warnings = wrap_pod(pod, cls, settings, images, lookup_error)
    out, notes = release_hooks(out, settings, {})  # a first admission trusts no record it came with
    return Built(out, [*warnings, *notes])


def gated_probes(containers: Sequence[Mapping], steps: Sequence[str], mains: Sequence[str]) -> set[str]:
    """The loopback probes the gate waits for in every container it holds (step 0; each main
    in a pod without steps): none when one of them is missing or not the waiter's."""
    by_name = {c.get("name"): c for c in containers}
    probed = [gate_probes(by_name[n]) if n in by_name else None for n in (steps[:1] or mains)]
    return set.intersection(*(set(x) for x in probed)) if probed and None not in probed else set()


def release_hooks(pod: dict, settings: RewriteSettings, hooks: Mapping[str, dict]) -> tuple[dict, list[str]]:
    """The kubelet starts regular containers in the pod's order, each once the one before
    has started and its postStart hook returned. A recognised regular sidecar's readiness
    wait (_hold.py; Linkerd puts its proxy, and that hook, first) only repeats step 0's gate
    where the gate probes that sidecar on loopback and every other regular container is one
    the waiter runs or a recognised sidecar: it goes, recorded, and comes back on a
    re-invocation that finds this no longer so (`hooks`: the record the pod came with)."""
    spec = pod["spec"]
    containers = spec.get("containers") or []
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if not hooks and p.ANNOTATION_POST_START_REMOVED not in annotations and \
            not any("postStart" in mapping_at(c, "lifecycle") for c in containers):
        return pod, []  # no hook to settle, no record to keep or drop: the common case, at no cost
    names = managed_names(pod)
    assert names is not None
    steps, mains = names
    proxies = sidecar_names(annotations, settings)
    gated = gated_probes(containers, steps, mains)
    wrapped = {*steps, *mains}
    waiting = all(c.get("name") in wrapped or c.get("name") in proxies for c in containers)
    kept: dict[str, dict] = {}
    notes: list[str] = []
    out_containers = [
        hold.settle_hook(c, waiting and loopback_probe(c) in gated, hooks, kept, notes)
        if c.get("name") in proxies and c.get("name") not in wrapped else c
        for c in containers]
    out = dict(pod)
    out["spec"] = {**spec, "containers": out_containers}
    return hold.record(out, p.ANNOTATION_POST_START_REMOVED, kept), notes


def wrap_pod(pod: Mapping, cls: Classification, settings: RewriteSettings,
             images: Mapping[str, ImageEntrypoints], lookup_error: str | None = None, *,
             origin: Mapping | None = None, how: str = p.MODE_WAITER) -> tuple[dict, list[str]]:
    """The pod with its steps and mains run by the waiter, and the warnings.
    `lookup_error` says why images are missing when a registry lookup failed. `origin`: the
    pod as admitted when `pod` is already another strategy's work (hybrid: the sidecars made
    native), whose effective request and QoS class are the ones to keep; `how`: the label."""
    spec = pod.get("spec") or {}
    origin_spec = (origin or pod).get("spec") or {}
    wrapped_src = [*cls.steps, *cls.mains]
    check_reserved(pod, wrapped_src)

    try:
        argvs = argvs_of(wrapped_src, images)
    except RewriteError as e:
        raise RewriteError(lookup_error or str(e), deny=settings.on_unresolved == "deny", reason=e.reason) from None

    warnings: list[str] = []
    read = ReadOnce()
    old_total, old_qos = requests_and_qos(origin_spec, read)
    fixed = add(restartable_sum(cls.kept_init, read), sum_requests([*cls.mains, *cls.sidecars], read))
    plan = plan_steps(cls.steps, fixed, old_total, settings.resources_policy, read)
    if plan.problem:
        raise RewriteError(plan.problem, reason=Reason.RESOURCES)
    warnings += plan.warnings
    steps = [apply_requests(pin_request_refs(s), new) for s, new in zip(cls.steps, plan.step_requests)]

    annotations = mapping_at(pod, "metadata", "annotations")
    chain = _chain(settings, pod, len(steps), len(cls.mains),
                     cls.all_sidecars, cls.sidecars, annotations, how == p.MODE_HYBRID)
    wrapped_steps = [wrap(c, i, chain, *argvs[c["name"]]) for i, c in enumerate(steps)]
    mains_by_name = {c["name"]: wrap(c, len(steps) + j, chain, *argvs[c["name"]])
                     for j, c in enumerate(cls.mains)}

    containers: list[dict] = []
    placed = False
    for c in spec.get("containers") or []:
        main = mains_by_name.get(c["name"])
        if main is not None and not placed:
            containers += wrapped_steps  # steps go right before the first main
            placed = True
        containers.append(main if main is not None else open_quit(c, annotations) if c["name"] in chain.quitted else c)
    if not placed:
        containers += wrapped_steps
    containers = sidecars_before_hooks(containers, frozenset(c["name"] for c in [*steps, *cls.mains]), cls.sidecars)

    if how == p.MODE_HYBRID:  # the proxy stays the last init container (protocol.COPY_CONTAINER_NAME)
        init = list(cls.kept_init)
        containers.insert(0, copier_container(settings, old_total))
    else:
        init = [*cls.kept_init, init_container_within(settings, old_total, cls.kept_init, read)]

    out = dict(pod)
    new_spec = out["spec"] = dict(spec)
    new_spec["initContainers"] = init
    new_spec["containers"] = containers
    new_spec["volumes"] = _volumes(spec, len(wrapped_steps) + len(cls.mains), chain.ready_file is not None,
                                   bool(cls.mains))
    with_pull_secrets(new_spec, settings)
    level = pod_level(origin_spec)[0]  # a pod-level request stays the pod's request
    _mark(out, [c["name"] for c in cls.steps], [c["name"] for c in cls.mains], how, effective(old_total, level))

    new_total, new_qos = requests_and_qos(new_spec, read)
    grown = growth_of(effective(old_total, level), effective(new_total, level), f"policy {settings.resources_policy}")
    if grown:
        warnings.append(grown)
    if new_qos != old_qos:
        warnings.append(f"QoS class changes from {old_qos} to {new_qos}: steps now run as regular containers "
                        f"and share the pod's requests")
    waited = "the steps; a build" if steps else "the sidecars to be ready; a proxy start"
    for c in cls.mains:
        probes = [f for f in ("livenessProbe", "startupProbe") if f in c]
        if probes:
            warnings.append(f"main container {c['name']!r} has a {' and a '.join(probes)} that the kubelet runs "
                            f"while it waits for {waited} longer than the probe allows gets it killed")
    warnings += refused_note(annotations, [s for s in cls.sidecars if s["name"] in chain.quitted])
    if spec.get("restartPolicy") == "OnFailure":
        warnings.append("restartPolicy OnFailure: a failed step is re-run by the kubelet and later steps wait for it, "
                        "as with init containers" if steps else
                        "restartPolicy OnFailure: a main the kubelet restarts waits for the sidecars again; they are "
                        "quit once every main has succeeded")
    return out, warnings


_COMPACT = json.JSONEncoder(separators=(",", ":"))  # json.dumps(..., separators=...) would build one per call


def _mark(pod: dict, steps: list[str], mains: list[str], how: str, budget: Amounts) -> None:
    mark_managed(pod, how)
    annotations = submap(pod, "metadata", "annotations")
    annotations[p.ANNOTATION_STEPS] = _COMPACT.encode(steps)
    annotations[p.ANNOTATION_MAINS] = _COMPACT.encode(mains)
    record_budget(pod, budget)


def give_back_beyond(spec: Mapping, steps: Sequence[str], budget: Amounts, settings: RewriteSettings) -> list[Mapping]:
    """The regular containers of `spec` with what their phase holds beyond the effective
    request the mesh alone would give the pod (_resources.mesh_alone) taken back from the
    steps, which the rewrite gave what the pod reserved (`preserve`, `divide`; `keep` lets
    the pod grow)."""
    containers = spec.get("containers") or []
    if settings.resources_policy == "keep":
        return list(containers)
    names = set(steps)
    # The regular phase (where the steps now run, beside every native sidecar) back within
    # that; an init phase that a native sidecar grows the steps cannot give back to.
    regular = add(sum_requests(containers), restartable_sum(spec.get("initContainers") or []))
    target = mesh_alone(spec, names, budget, OWN_CONTAINERS)
    return take_back(containers, names, {r: v - target.get(r, 0) for r, v in regular.items() if v > target.get(r, 0)})


def managed_names(pod: Mapping) -> tuple[list[str], list[str]] | None:
    """Steps and mains of a pod this strategy (or hybrid) already rewrote, or None."""
    how = managed_as(pod)
    if how not in (p.MODE_WAITER, p.MODE_HYBRID):
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        steps = json.loads(annotations.get(p.ANNOTATION_STEPS, ""))
        mains = json.loads(annotations.get(p.ANNOTATION_MAINS, "[]"))
    except (TypeError, ValueError):
        raise RewriteError(f"pod is labelled {p.LABEL_MANAGED}={how} but its {p.ANNOTATION_STEPS} "
                         f"annotation is not a JSON list") from None
    if not (isinstance(steps, list) and isinstance(mains, list) and (steps or mains)
            and all(isinstance(x, str) for x in [*steps, *mains])):
        raise RewriteError(f"pod is labelled {p.LABEL_MANAGED}={how} but its {p.ANNOTATION_STEPS}/"
                         f"{p.ANNOTATION_MAINS} annotations are not lists of names")
    return steps, mains


def sidecars_before_hooks(containers: list[dict], wrapped: frozenset[str], sidecars: Sequence[Mapping]) -> list[dict]:
    """`containers` with the regular sidecars declared after a wrapped container that has a
    postStart hook moved ahead of the first wrapped one. The kubelet starts a pod's regular
    containers one by one, each only once the hook of the one before has returned; a main's
    hook that waits for its own program (which the waiter holds until the sidecars are
    ready) would keep a sidecar declared after it from ever starting: the pod never runs
    (seen on v1.34.9 with Istio's proxy, which Istio appends). Before the steps, such a
    sidecar starts first, as Linkerd's proxy (put first) always does."""
    hooked = next((i for i, c in enumerate(containers)
                   if c.get("name") in wrapped and mapping_at(c, "lifecycle").get("postStart")), None)
    names = {s.get("name") for s in sidecars}
    late = [c for c in containers[hooked + 1:] if c.get("name") in names] if hooked is not None else []
    if not late:
        return containers
    moved = {id(c) for c in late}
    rest = [c for c in containers if id(c) not in moved]
    first = next(i for i, c in enumerate(rest) if c.get("name") in wrapped)
    return [*rest[:first], *late, *rest[first:]]


def give_back_to_sidecars(containers: Sequence[Mapping], steps: Sequence[str], sidecars: Sequence[Mapping],
                          settings: RewriteSettings) -> list[Mapping]:
    """`containers` with the requests of `sidecars` injected after the rewrite taken back from
    the steps' budget (`preserve`, `divide`; `keep` lets the pod grow): the pod's effective
    request is then the one the mesh alone would have given it, max(steps, mains + sidecars),
    as a first admission of the injected pod would have budgeted it."""
    if settings.resources_policy == "keep":
        return list(containers)
    return take_back(containers, set(steps), sum_requests(sidecars))


def _refreshed_argv(container: Mapping) -> Argv:
    """A step's or main's argv at re-invocation: read back from the waiter's command line,
    or, where the container's `command` was replaced since the first rewrite (`kubectl debug
    --copy-to=COPY --container=STEP -- CMD`, which keeps the pod's labels and annotations
    with --keep-labels --keep-annotations), the new command: it runs in the step's place."""
    command = container.get("command")
    if command and command != [p.WAITER_PATH]:
        return _argv_for(container, {})  # as a first rewrite reads a step with its own command
    return read_argv(container)


def refresh(pod: Mapping, settings: RewriteSettings) -> dict:
    """Re-invocation: the same pod, with the sidecar-dependent parts (step 0's gate, the
    quit endpoints) recomputed for the sidecars it has now."""
    names = managed_names(pod)
    assert names is not None
    steps, mains = names
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    by_name = {c.get("name"): c for c in containers}
    order = [*steps, *mains]
    for name in order:
        if name not in by_name:
            raise RewriteError(f"container {name!r} named in {p.ANNOTATION_STEPS}/{p.ANNOTATION_MAINS} is missing")
    index = {name: i for i, name in enumerate(order)}
    regular_sidecars = [c for c in containers if c.get("name") not in index and c.get("name") not in OWN_CONTAINERS]
    # A container added since the first rewrite (another webhook's) must not reach our
    # volumes, which exist now: admitting the pod as it is would leave it able to forge.
    problems = reserved_mounts([c for c in _every_container(spec)
                                if c.get("name") not in index and c.get("name") not in OWN_CONTAINERS])
    if problems:
        raise RewriteError(f"{problems[0]}", deny=True, reason=Reason.RESERVED)
    budget = recorded_budget(pod)
    if budget is not None and not pod_level(spec)[0]:
        # Sidecars injected since the rewrite (the mesh's webhook runs after initshift's)
        # were left out of the steps' budget. (Pod-level requests: the pod's request stays
        # theirs, and _podlevel.py fits the containers within it.)
        containers = give_back_beyond(spec, steps, budget, settings)
    elif regular_sidecars and steps and managed_as(pod) == p.MODE_WAITER and gate_of(by_name[steps[0]]) == (None, ()):
        # No budget recorded (an earlier initshift's pod) and step 0 has no gate: the pod had
        # no sidecar when it was rewritten, and these came after. Its steps' budget left them out.
        containers = give_back_to_sidecars(containers, steps, regular_sidecars, settings)
    natives = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    annotations = mapping_at(pod, "metadata", "annotations")
    chain = _chain(settings, pod, len(steps), len(mains),
                     [*natives, *regular_sidecars], regular_sidecars, annotations, managed_as(pod) == p.MODE_HYBRID)
    out = dict(pod)
    out["spec"] = dict(spec)
    out["spec"]["containers"] = [
        wrap(c, index[c["name"]], chain, *_refreshed_argv(c)) if c.get("name") in index else
        open_quit(c, annotations) if c.get("name") in chain.quitted else c
        for c in sidecars_before_hooks(containers, frozenset(index), regular_sidecars)
    ]
    out["spec"]["volumes"] = _volumes(spec, len(order), chain.ready_file is not None, bool(mains))
    if managed_as(pod) == p.MODE_WAITER:  # (hybrid's sidecars are native: its own refresh settles them)
        out, _ = release_hooks(out, settings, hold.removed_post_start(pod))
    return out
