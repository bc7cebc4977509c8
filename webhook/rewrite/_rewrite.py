"""The pure rewrite: (pod, settings) -> RewriteResult. No I/O, never mutates its input.

One admission makes one `Plan`, the decision for that pod, taken once: the pod is checked
and classified once, the strategy is chosen once (with INITSHIFT_NATIVE_SIDECARS applied
here and nowhere else). Each kind of decision is a type of its own:

- `Unchanged`: the pod is left as it is, with the reason (`_reasons.Reason`) and why;
- `Failed`: the pod cannot be handled: denied, or left as it is with the error as warning;
- `Rewritten`: a strategy rewrites it, one function of one shape (`_strategy.Build`);
- `Refreshed`: a pod the waiter or hybrid strategy already rewrote, sent again;
- `Ordered`: a declared start order, composed after the native strategy where it applies.

Both the registry lookups (`Plan.lookups`) and the rewrite (`Plan.rewrite`) read the plan.
Every pod left unchanged carries a warning saying why. The JSONPatch sent to the apiserver
is the diff (webhook/admission/_patch.py).
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Mapping, Sequence

from waiter import protocol as p

from ..settings import Settings
from . import _hybrid as hybrid_strategy, _native as native_strategy, _start_order as start_order
from . import _limitrange as limitrange, _podlevel as podlevel, _quota as quota, _waiter as waiter_strategy
from ._classify import (Classification, classify, has_mesh_marker, injection_pending, managed_as, native_proxies,
                        native_requested, pod_mode)
from ._entrypoint import ImageEntrypoints, Lookup, needs_image
from ._errors import RewriteError
from ._podcheck import pod_problems, size_problems
from ._reasons import FINAL, UNTOUCHED, Reason
from ._resources import pod_level, pod_level_defaults_pending
from ._shape import mapping_at, shape_problem
from ._strategy import Build

# The strategies by the name they are labelled with, and whether they wrap containers in
# the waiter (whose argv may need the image's ENTRYPOINT from the registry).
_STRATEGIES: dict[str, tuple[Build, bool]] = {
    p.MODE_WAITER: (waiter_strategy.build, True),
    p.MODE_HYBRID: (hybrid_strategy.build, True),
    p.MODE_NATIVE: (native_strategy.build, False),
}


@dataclass
class RewriteResult:
    """`changed`: a strategy rewrote the pod. A pod left as it is may still differ from the
    input by one annotation, ANNOTATION_NOT_REWRITTEN (the reason); the patch is the diff."""

    pod: dict
    warnings: list[str] = field(default_factory=list)
    changed: bool = False
    strategy: str | None = None
    reason: Reason = Reason.REWRITTEN
    denied: str | None = None


def _prefix(message: str) -> str:
    return f"initshift: {message}"


# --- the decisions ------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Plan(abc.ABC):
    """What one admission does with one pod (see the module docstring)."""

    pod: dict
    forged: tuple[str, ...] = ()  # watcher-owned annotations the pod came with, removed from `pod`
    # Whether `rewrite` applies the namespace's LimitRanges and quotas: a pod left as it is
    # needs none read (the server then makes no live list for it).
    reads_namespace_limits: ClassVar[bool] = True

    @property
    def reads_namespace(self) -> bool:
        """Whether `rewrite` reads the pod's Namespace: its labels may ask a mesh for a proxy."""
        return self.reads_namespace_limits

    def lookups(self) -> list[Lookup]:
        """Images whose configuration the rewrite will need (containers without `command`)."""
        return []

    def rewrite(self, *, images: Mapping[str, ImageEntrypoints] | None = None, lookup_error: str | None = None,
                limit_ranges: Sequence[Mapping] = (), quotas: Sequence[Mapping] = (),
                namespace: Mapping | None = None) -> RewriteResult:
        """`lookup_error`: why the registry lookup failed, the message given for containers
        without `command` whose image is missing from `images`; `limit_ranges`, `quotas`:
        the LimitRange and ResourceQuota objects of the pod's namespace, which the rewritten
        pod must pass; `namespace`: the pod's Namespace, whose labels may ask a mesh for a
        proxy (None: not known)."""
        try:
            result = self._result(images or {}, lookup_error)
        except RewriteError as e:
            result = _failed(self.pod, e)
        if result.reason is Reason.NO_SIDECAR and not result.changed and not has_mesh_marker(self.pod) \
                and injection_pending(self.pod, namespace):
            # Only the pod's Namespace asks the mesh (Istio's label): its proxy is injected
            # after initshift's webhook, which rewrites the pod when re-invoked then.
            result.warnings = [_prefix(_INJECTED_LATER)]
        if result.changed and self._awaits_proxy(namespace) and (why := _bounded(self.pod, quotas)):
            # The proxy's resources are unknown until the mesh injects it (after initshift's
            # webhook, which sorts first), and the bounds may not hold them beside the steps:
            # the re-invoked review rewrites the pod as a first admission of the injected one.
            result = RewriteResult(pod=self.pod, reason=Reason.NO_SIDECAR, warnings=[_prefix(
                f"the mesh has not injected its proxy yet and {why}: the pod is rewritten when initshift is "
                f"re-invoked after the mesh, if they hold the proxy beside the steps; admitted unchanged")])
        if result.changed:
            result = _within(self.pod, result, limit_ranges, quotas, self._budgeted_steps(result.pod))
        if not result.denied:
            before = result.pod
            result = _decision_on_pod(self.pod, result)
            if result.pod is not before and size_problems(result.pod):
                result.pod = before  # the note would not fit etcd's limit: the warning still says why
        if self.forged and result.denied is None:
            result.changed = True  # `pod` is already without them: whatever else happens, they go
            result.warnings.insert(0, _prefix(
                f"removed {', '.join(self.forged)}: only the initshift watcher writes "
                f"{'them' if len(self.forged) > 1 else 'it'}, never the pod's creator"))
        return result

    def _budgeted_steps(self, rewritten: Mapping) -> list[str]:
        """The steps of `rewritten` whose requests share the pod's budget (none by default)."""
        return []

    def _awaits_proxy(self, namespace: Mapping | None) -> bool:
        """The pod, or its namespace, asks a mesh for a proxy it does not have yet
        (rewritten ahead of it)."""
        return False

    @abc.abstractmethod
    def _result(self, images: Mapping[str, ImageEntrypoints], lookup_error: str | None) -> RewriteResult:
        """The result, or a RewriteError."""


@dataclass(frozen=True, kw_only=True)
class Unchanged(Plan):
    """Left as it is, for `reason`; `message` says why (the warning)."""

    reads_namespace_limits: ClassVar[bool] = False

    reason: Reason
    message: str

    @property
    def reads_namespace(self) -> bool:
        # A pod without a sidecar whose Namespace asks a mesh for one: the warning says the
        # proxy comes later (a first review in an Istio-labelled namespace, before its webhook).
        return self.reason is Reason.NO_SIDECAR

    def _result(self, images: Mapping[str, ImageEntrypoints], lookup_error: str | None) -> RewriteResult:
        return RewriteResult(pod=self.pod, warnings=[_prefix(self.message)], reason=self.reason)


@dataclass(frozen=True, kw_only=True)
class Failed(Plan):
    """The pod cannot be handled: denied when `error.deny`, else left as it is with the error."""

    reads_namespace_limits: ClassVar[bool] = False

    error: RewriteError

    def _result(self, images: Mapping[str, ImageEntrypoints], lookup_error: str | None) -> RewriteResult:
        raise self.error


@dataclass(frozen=True, kw_only=True)
class Rewritten(Plan):
    """Rewritten by `strategy` (a key of _STRATEGIES); `notes` are warnings about the choice."""

    settings: Settings
    strategy: str
    cls: Classification
    notes: tuple[str, ...] = ()
    # auto's choice when `strategy` turns out impossible for want of an image's ENTRYPOINT
    fallback: Plan | None = None

    def _awaits_proxy(self, namespace: Mapping | None) -> bool:
        return (not self.cls.sidecars and not native_proxies(self.cls) and has_mesh_marker(self.pod)) \
            or injection_pending(self.pod, namespace)

    def lookups(self) -> list[Lookup]:
        if not _STRATEGIES[self.strategy][1]:
            return []
        return [Lookup(str(c.get("name")), str(c.get("image"))) for c in [*self.cls.steps, *self.cls.mains]
                if needs_image(c)]

    def _budgeted_steps(self, rewritten: Mapping) -> list[str]:
        return _budgeted(rewritten, self.settings)

    def _result(self, images: Mapping[str, ImageEntrypoints], lookup_error: str | None) -> RewriteResult:
        build = _STRATEGIES[self.strategy][0]
        try:
            built = build(self.pod, self.cls, self.settings.rewrite, images, lookup_error)
        except RewriteError as e:
            if self.fallback is None or e.reason != Reason.UNRESOLVED_ENTRYPOINT:
                raise
            result = self.fallback._result(images, lookup_error)
            result.warnings.insert(0, _prefix(f"{e}: the {self.strategy} strategy runs them under the waiter, so "
                                              f"auto chose native for the pod, whose init containers stay as they are"))
            return result
        return _checked(self.pod, built.pod, [*self.notes, *self.cls.warnings, *built.warnings], built.reason,
                        self.strategy)


@dataclass(frozen=True, kw_only=True)
class Refreshed(Plan):
    """A pod the waiter or hybrid strategy rewrote, sent again (reinvocationPolicy IfNeeded)."""

    settings: Settings

    def _budgeted_steps(self, rewritten: Mapping) -> list[str]:
        return _budgeted(rewritten, self.settings)

    def _result(self, images: Mapping[str, ImageEntrypoints], lookup_error: str | None) -> RewriteResult:
        how = p.MODE_HYBRID if managed_as(self.pod) == p.MODE_HYBRID else p.MODE_WAITER
        refresh = hybrid_strategy.refresh if how == p.MODE_HYBRID else waiter_strategy.refresh
        return _checked(self.pod, refresh(self.pod, self.settings.rewrite), [], Reason.REFRESHED, how)


@dataclass(frozen=True, kw_only=True)
class Ordered(Plan):
    """A declared start order (webhook/rewrite/_start_order.py) applied to `base`: the pod,
    or the native strategy's pod where the native strategy applies."""

    settings: Settings
    base: dict
    order: start_order.Ordering
    notes: tuple[str, ...] = ()

    def lookups(self) -> list[Lookup]:
        return start_order.lookups(self.base, self.order)

    def _result(self, images: Mapping[str, ImageEntrypoints], lookup_error: str | None) -> RewriteResult:
        out, warnings = start_order.build(self.base, self.settings, images, self.order)
        return _checked(self.pod, out, [*self.notes, *warnings], Reason.REWRITTEN, p.MANAGED_START_ORDER)


# --- choosing -------------------------------------------------------------------------------

_RUN_TO_COMPLETION = ("Never", "OnFailure")


def _runs_to_completion(pod: Mapping) -> bool:
    """restartPolicy Never or OnFailure (Jobs, CronJobs, bare pods): the mains end, and a
    classic sidecar that does not keeps the pod running."""
    spec = pod.get("spec")
    return isinstance(spec, dict) and spec.get("restartPolicy", "Always") in _RUN_TO_COMPLETION


@dataclass(frozen=True)
class _Case:
    """What the choice reads: the pod, the settings, its mode and where that mode came from,
    the cluster's support (INITSHIFT_NATIVE_SIDECARS applied), its classification."""

    pod: dict
    settings: Settings
    mode: str
    asked_by: str  # the mode as the user set it: `initshift.io/mode=hybrid`, `INITSHIFT_MODE=hybrid`, ...
    native: bool | None
    cls: Classification

    def skip(self, reason: Reason, message: str) -> Unchanged:
        return Unchanged(pod=self.pod, reason=reason, message=message)

    def go(self, strategy: str, notes: list[str] | tuple[str, ...] = (),
           fallback: Plan | None = None) -> Rewritten | Unchanged:
        if strategy != p.MODE_NATIVE and _host_network(self.pod):
            # The waiter checks and quits the sidecars on 127.0.0.1: here the node's, where
            # another pod's servers listen (a hostNetwork Istio gateway's :15020/quitquitquit).
            # Neither Istio nor Linkerd injects such a pod; the native strategy uses no loopback.
            return self.skip(Reason.HOST_NETWORK, f"the pod uses the node's network (hostNetwork): its 127.0.0.1 is "
                                                  f"the node's, where the {strategy} strategy's sidecar checks and "
                                                  f"quits would reach other pods' servers ({p.ANNOTATION_MODE}=native "
                                                  f"uses none); admitted unchanged")
        return Rewritten(pod=self.pod, settings=self.settings, strategy=strategy, cls=self.cls, notes=tuple(notes),
                         fallback=fallback)

    @property
    def annotated(self) -> bool:
        """The pod's own `initshift.io/mode` annotation chose the mode (not the server's default)."""
        return p.ANNOTATION_MODE in mapping_at(self.pod, "metadata", "annotations")

    @property
    def proxies(self) -> list[str]:
        return native_proxies(self.cls)


def _host_network(pod: Mapping) -> bool:
    return mapping_at(pod, "spec").get("hostNetwork") is True


def _mode_origin(pod: Mapping, mode: str, mode_from: str | None) -> str:
    """Where the pod's mode came from, as the user wrote it."""
    if p.ANNOTATION_MODE in mapping_at(pod, "metadata", "annotations"):
        return f"{p.ANNOTATION_MODE}={mode}"
    return f"{mode_from} {mode}" if mode_from else f"{p.ENV_PREFIX}MODE={mode}"


def _strategy(pod: Mapping, mode: str, native_supported: bool | None) -> str:
    if native_strategy.is_managed(pod):
        return p.MODE_NATIVE  # decided at the first admission; re-invocations finish the job
    if mode == p.MODE_AUTO:
        if not native_supported:
            return p.MODE_WAITER
        # Hybrid runs the steps as regular containers: a run-to-completion pod's only, and
        # never a declared start order (its init containers stay in place) or a pod on the
        # node's network (its gate checks the sidecars on loopback: _Case.go).
        hybrid = _runs_to_completion(pod) and not start_order.requested(pod) and not _host_network(pod)
        return p.MODE_HYBRID if hybrid else p.MODE_NATIVE
    return mode


def _no_native(native_supported: bool | None) -> str:
    return ("the cluster does not run native sidecars" if native_supported is False
            else "native-sidecar support of the cluster is unknown")


_INJECTED_LATER = ("no sidecar yet: the namespace asks a mesh for its proxy, injected after initshift's webhook; "
                   "the pod is rewritten when the apiserver re-invokes initshift after the mesh")


def _no_sidecar(case: _Case) -> Unchanged:
    return case.skip(Reason.NO_SIDECAR, "no sidecar and no mesh injection requested: nothing to fix; admitted "
                                        "unchanged (re-invoked if a mesh injects later)")


def _bounded(pod: Mapping, quotas: Sequence[Mapping]) -> str | None:
    """What bounds the pod's resources that a proxy injected later could break, if anything."""
    if pod_level(mapping_at(pod, "spec"))[0]:
        return "the pod sets pod-level requests"
    if quota.charges_resources(quotas):
        return "the namespace has ResourceQuotas"
    return None


def _unsupported(case: _Case) -> Unchanged:
    return case.skip(Reason.NATIVE_UNSUPPORTED, f"{case.asked_by}, but {_no_native(False)} (Kubernetes 1.29 or "
                                                f"later); admitted unchanged")


def _honoured(case: _Case) -> str:
    return f"{_no_native(None)}; native sidecars used as {case.asked_by} asks"


def _order_notes(cls: Classification, keeps_order: bool) -> list[str]:
    """What to say of the init containers that stay init containers though declared after
    steps (the pod's own native sidecars, `keep-init` ones): the native strategy keeps
    their place (`keeps_order`); the waiter and hybrid move the steps out, after them."""
    if keeps_order:
        return [f"native sidecar {name!r} comes after step {before[-1]!r}: the native strategy keeps that order "
                f"(hybrid would start it before {', '.join(map(repr, before))})" for name, before in cls.late_sidecars]
    return [*(f"native sidecar {name!r} now starts before the steps declared ahead of it "
              f"({', '.join(map(repr, before))}), which run as regular containers once it has started: one that needs "
              f"what they prepare never starts and the pod never ends; {p.ANNOTATION_MODE}=native keeps the order"
              for name, before in cls.late_sidecars),
            *(f"init container {name!r} is kept ({p.ANNOTATION_KEEP_INIT}) and now runs before the steps that "
              f"preceded it" for name in cls.kept_after_steps)]


def _choose_native(case: _Case, notes: Sequence[str] = ()) -> Plan:
    pod, mode = case.pod, case.mode
    managed = native_strategy.is_managed(pod)
    if not case.cls.steps and not _runs_to_completion(pod):  # first: such a pod needs nothing, whatever the cluster
        return case.skip(Reason.NO_INIT_CONTAINERS, "no init container needs the sidecars; admitted unchanged")
    notes = list(notes)
    if mode in (p.MODE_NATIVE, p.MODE_HYBRID) and not managed and case.native is not True:
        if case.native is False:
            return _unsupported(case)
        notes.append(_honoured(case))
    if case.cls.sidecars:
        return case.go(p.MODE_NATIVE, notes)
    proxies = case.proxies
    if managed and (proxies or not has_mesh_marker(pod)):
        grown = native_strategy.injected_growth(pod)
        return case.skip(Reason.UNCHANGED, "the pod is already set up for native sidecars; nothing to do"
                         + (f" ({grown})" if grown else ""))
    if proxies:
        return case.skip(Reason.ALREADY_NATIVE, f"the proxy {proxies[0]!r} already runs as a native sidecar; "
                                                f"admitted unchanged")
    if has_mesh_marker(pod):
        return case.go(p.MODE_NATIVE, notes)  # the proxy comes later: ask the mesh for a native one
    return _no_sidecar(case)


def _choose(pod: dict, settings: Settings, native: bool | None, mode_from: str | None) -> Plan:
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        return Unchanged(pod=pod, reason=Reason.INVALID, message="the object has no spec.containers; admitted unchanged")
    if _is_mirror(pod):
        return Unchanged(pod=pod, reason=Reason.MIRROR_POD, message="a static pod's mirror: the kubelet runs the pod "
                                                                   "from its manifest on the node, not from this "
                                                                   "object; admitted unchanged")
    if not settings.feature_gate:
        return Unchanged(pod=pod, reason=Reason.FEATURE_GATE_OFF,
                         message=f"{p.FEATURE_GATE_ENV} is off; admitted unchanged")
    mode = pod_mode(pod, settings.rewrite)
    if mode not in p.MODES:
        return Unchanged(pod=pod, reason=Reason.INVALID_MODE, message=f"{p.ANNOTATION_MODE}={mode!r} is not one of "
                                                                      f"{', '.join(p.MODES)}; admitted unchanged")
    if mode == p.MODE_DISABLED:
        return Unchanged(pod=pod, reason=Reason.DISABLED,
                         message=f"{_mode_origin(pod, mode, mode_from)}; admitted unchanged")
    if (spec.get("os") or {}).get("name") == "windows":
        return Unchanged(pod=pod, reason=Reason.WINDOWS, message="Windows pods are not supported; admitted unchanged")
    strategy = _strategy(pod, mode, native)
    case = _Case(pod, settings, mode, _mode_origin(pod, mode, mode_from), native, classify(pod, settings.rewrite))
    cls = case.cls
    if strategy == p.MODE_NATIVE or (mode == p.MODE_AUTO and cls.late_sidecars and native):
        # auto: a sidecar of the pod's own placed after steps keeps its place among them
        return _choose_native(case, _order_notes(cls, keeps_order=True) if strategy != p.MODE_NATIVE else ())
    policy = spec.get("restartPolicy", "Always")
    if not cls.steps and policy not in _RUN_TO_COMPLETION:
        # A long-running pod without init containers: nothing for any strategy to move.
        return case.skip(Reason.NO_INIT_CONTAINERS, "no init container needs the sidecars; admitted unchanged")
    if policy not in _RUN_TO_COMPLETION:
        if mode == p.MODE_AUTO or (strategy == p.MODE_HYBRID and native is False):
            why = f"; native sidecars would, but {_no_native(native)}"
        elif strategy == p.MODE_HYBRID:  # native asked for by name runs where support is unknown
            why = f"; {p.ANNOTATION_MODE}=native handles it"
        else:
            why = ""
        return case.skip(Reason.RESTART_POLICY, f"restartPolicy {policy}: the {strategy} strategy runs steps only in "
                                                f"run-to-completion pods (Never or OnFailure){why}; admitted unchanged")
    if not cls.steps:
        return _choose_for_mains(case, strategy)
    proxies = case.proxies
    # A proxy already native, or asked for natively and not injected yet (one that still
    # landed in containers says the mesh found no native support: the waiter keeps it).
    if strategy == p.MODE_WAITER and (proxies or (native_requested(pod) and not cls.sidecars)):
        if start_order.requested(pod) and proxies:
            return case.skip(Reason.ALREADY_NATIVE, f"the proxy {proxies[0]!r} already runs as a native sidecar; "
                                                    f"admitted unchanged")
        strategy = p.MODE_HYBRID  # the proxy is (or will be) native: steps beside it are the hybrid's
    notes = _order_notes(cls, keeps_order=False)
    if strategy == p.MODE_HYBRID and proxies:
        notes.append(f"the proxy {proxies[0]!r} already runs as a native sidecar: the steps run beside it under "
                     f"the waiter (hybrid)")
    # Asked for by name, hybrid needs native sidecars even for a pod without a sidecar yet:
    # one another webhook adds later is made native on re-invocation.
    if strategy == p.MODE_HYBRID and mode == p.MODE_HYBRID and native is not True and not proxies:
        if native is False:
            return _unsupported(case)
        notes.append(_honoured(case))
    if not cls.sidecars and not has_mesh_marker(pod) and not proxies:
        if len(cls.steps) > 1 and case.annotated and mode in (p.MODE_WAITER, p.MODE_HYBRID):
            return case.go(strategy, [f"no sidecar: the steps run under the waiter as {case.asked_by} asks, handed "
                                      f"off in milliseconds instead of the kubelet's init order", *notes])
        return _no_sidecar(case)  # native sidecars already run beside the init containers
    if strategy == p.MODE_HYBRID and case.mode == p.MODE_AUTO:
        # Hybrid needs the argv of every step and main; where one has no `command` and its
        # image's ENTRYPOINT is not known (no registry lookup, or a failed one), auto picks
        # native, which moves no container, rather than deny a pod native can run.
        return case.go(strategy, notes, fallback=_choose_native(case, _order_notes(cls, keeps_order=True)))
    return case.go(strategy, notes)


def _choose_for_mains(case: _Case, strategy: str) -> Plan:
    """A run-to-completion pod without steps (a Job's): only its mains' start and end need
    the sidecars. With native sidecars the proxy becomes one (the native strategy, no waiter);
    else every main runs under the waiter, gated like step 0, the last one quitting the sidecars."""
    pod, cls = case.pod, case.cls
    if strategy == p.MODE_HYBRID:  # no step for the waiter: the native half is the whole rewrite
        return _choose_native(case)
    if cls.sidecars:
        if not cls.mains:
            return case.skip(Reason.NO_MAINS, "every regular container is a sidecar: no main to gate; admitted "
                                              "unchanged")
        return case.go(strategy)
    proxies = case.proxies
    if proxies:
        return case.skip(Reason.ALREADY_NATIVE, f"the proxy {proxies[0]!r} already runs as a native sidecar: the "
                                                f"kubelet starts the mains after it and stops it after them; "
                                                f"admitted unchanged")
    if has_mesh_marker(pod):
        return case.skip(Reason.NO_SIDECAR, "the mesh has not injected its proxy yet: the mains are rewritten when "
                                            "initshift is re-invoked after it; admitted unchanged")
    return _no_sidecar(case)


def plan(pod: dict, settings: Settings, *, native_supported: bool | None = None,
         mode_from: str | None = None) -> Plan:
    """The plan for one pod; never raises (a pod it cannot handle is `Unchanged` or `Failed`).
    `mode_from`: what set the server's mode, named in messages about it (`initshift mutate`
    passes `--mode`); INITSHIFT_MODE by default."""
    native = native_strategy.resolve_support(settings.rewrite.native_sidecars, native_supported)
    problem = shape_problem(pod)
    if problem:
        return Unchanged(pod=pod, reason=Reason.INVALID, message=f"{problem}; admitted unchanged")
    # A mirror pod is left as it is, forged annotations included: it describes the static pod
    # the kubelet runs from its manifest, which no change to this object reaches.
    cleaned, forged = _without_watcher_state(pod) if settings.feature_gate and not _is_mirror(pod) else (pod, ())
    try:
        choice = _plan(cleaned, settings, native, mode_from)
        return dataclasses.replace(choice, forged=forged) if forged else choice
    except RewriteError as e:
        return Failed(pod=cleaned, error=e, forged=forged)


def _plan(pod: dict, settings: Settings, native: bool | None, mode_from: str | None) -> Plan:
    if settings.feature_gate and waiter_strategy.managed_names(pod) is not None:
        if pod_mode(pod, settings.rewrite) == p.MODE_DISABLED:
            return Unchanged(pod=pod, reason=Reason.DISABLED,
                             message="pod is already rewritten; mode=disabled leaves it as it is")
        return Refreshed(pod=pod, settings=settings)
    own = waiter_strategy.unlabelled_copy(pod) if settings.feature_gate else None
    if own is not None:
        return Unchanged(pod=pod, reason=Reason.RESERVED, message=(
            f"the pod holds {own!r}, initshift's own container, but not its {p.LABEL_MANAGED} label: a copy of a "
            f"pod initshift rewrote, made without its labels (`kubectl debug --copy-to` drops them unless given "
            f"--keep-labels --keep-annotations, which kubectl before v1.36 reads only with --profile=general; with "
            f"those and the probes, --keep-readiness --keep-startup, a step whose command the copy replaces runs in "
            f"the step's place); admitted unchanged"))
    choice = _choose(pod, settings, native, mode_from)
    if start_order.requested(pod) and not (isinstance(choice, Unchanged) and choice.reason in FINAL):
        return _ordered(pod, choice, settings, native)
    return choice


def _ordered(pod: dict, choice: Plan, settings: Settings, native: bool | None) -> Ordered:
    """Declared start order, composed after the native strategy."""
    if isinstance(choice, Rewritten) and choice.strategy in (p.MODE_WAITER, p.MODE_HYBRID):
        # A run-to-completion pod's mains under the waiter: it gates them and its last main
        # quits the proxy. The declared order alone would gate them too but quit nothing,
        # leaving a Job's pod running after its mains; waiter run and start-after do not nest.
        why = "this pod's init containers would become steps" if choice.cls.steps else \
            "this pod's mains would run under the waiter, whose last main quits the proxy"
        raise RewriteError(
            f"{p.ANNOTATION_START_ORDER} cannot be combined with the {choice.strategy} strategy ({why}); use "
            f"{p.ANNOTATION_MODE}=native on a cluster with native sidecars, or remove the annotation",
            deny=True, reason=start_order.REASON)
    base, notes = pod, []
    if isinstance(choice, Rewritten):
        try:
            built = native_strategy.build(pod, choice.cls, settings.rewrite, {})
            base, notes = built.pod, [*choice.notes, *choice.cls.warnings, *built.warnings]
        except RewriteError as e:
            notes = [f"{e}; admitted unchanged"]
    return Ordered(pod=pod, settings=settings, base=base, notes=tuple(notes),
                   order=start_order.ordering(base, settings, native))


def rewrite(pod: dict, settings: Settings, *, images: Mapping[str, ImageEntrypoints] | None = None,
            native_supported: bool | None = None, lookup_error: str | None = None,
            mode_from: str | None = None, limit_ranges: Sequence[Mapping] = (),
            quotas: Sequence[Mapping] = (), namespace: Mapping | None = None) -> RewriteResult:
    """`plan(...).rewrite(...)` in one call, for callers that make no registry lookup."""
    return plan(pod, settings, native_supported=native_supported, mode_from=mode_from).rewrite(
        images=images, lookup_error=lookup_error, limit_ranges=limit_ranges, quotas=quotas, namespace=namespace)


# --- the result -----------------------------------------------------------------------------

def _is_watcher_state(key: str) -> bool:
    return key in (p.ANNOTATION_READY, p.ANNOTATION_OUTCOME) or key.startswith(p.ANNOTATION_READY_PREFIX)


def _is_mirror(pod: Mapping) -> bool:
    return p.MIRROR_POD_ANNOTATION in mapping_at(pod, "metadata", "annotations")


def _without_watcher_state(pod: dict) -> tuple[dict, tuple[str, ...]]:
    """The pod without the annotations the watcher owns (a pod created with the ready gate
    already open, or a made-up outcome, would skip or misreport its steps), and their keys."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    forged = tuple(sorted(k for k in annotations if _is_watcher_state(k)))
    if not forged:
        return pod, ()
    kept = {k: v for k, v in annotations.items() if k not in forged}
    return {**pod, "metadata": {**pod["metadata"], "annotations": kept}}, forged


def _decision_on_pod(pod: dict, result: RewriteResult) -> RewriteResult:
    """A pod with init containers, or a run-to-completion one, that is not rewritten says why
    on itself (the one change made to it); a rewritten pod drops the reason an earlier
    admission left.

    Not where a pod-level request is still to be defaulted: any patch makes the apiserver
    default it then, to the containers' aggregate before the webhooks after initshift's add
    theirs (a mesh's proxy), which then exceeds it and the pod is refused. The warning
    alone says why."""
    meta, notes = mapping_at(pod, "metadata"), mapping_at(pod, "metadata", "annotations")
    spec = mapping_at(pod, "spec")
    inits = spec.get("initContainers")
    if result.changed and p.ANNOTATION_NOT_REWRITTEN in (result.pod["metadata"].get("annotations") or {}):
        annotations = dict(result.pod["metadata"]["annotations"])
        del annotations[p.ANNOTATION_NOT_REWRITTEN]
        result.pod = {**result.pod, "metadata": {**result.pod["metadata"], "annotations": annotations}}
    elif not result.changed and result.strategy is None and result.reason not in UNTOUCHED \
            and ((isinstance(inits, list) and inits) or _runs_to_completion(pod)) \
            and isinstance(pod.get("metadata"), (dict, type(None))) \
            and p.LABEL_MANAGED not in mapping_at(pod, "metadata", "labels") \
            and notes.get(p.ANNOTATION_NOT_REWRITTEN) != result.reason \
            and not pod_level_defaults_pending(spec):
        note = {**notes, p.ANNOTATION_NOT_REWRITTEN: Reason(result.reason).value}
        result.pod = {**pod, "metadata": {**meta, "annotations": note}}
    return result


def _failed(pod: dict, e: RewriteError) -> RewriteResult:
    if e.deny:
        return RewriteResult(pod=pod, reason=e.reason, denied=_prefix(str(e)))
    return RewriteResult(pod=pod, warnings=[_prefix(f"{e}; admitted unchanged")], reason=e.reason)


def _budgeted(rewritten: Mapping, settings: Settings) -> list[str]:
    """The steps of a waiter or hybrid pod whose requests share the pod's budget."""
    names = waiter_strategy.managed_names(rewritten)
    return names[0] if names and settings.rewrite.resources_policy != "keep" else []


def _within(before: dict, result: RewriteResult, limit_ranges: Sequence[Mapping], quotas: Sequence[Mapping] = (),
            steps: Sequence[str] = ()) -> RewriteResult:
    """The rewritten pod fitted to the namespace's LimitRanges (_limitrange.py) and to its
    own pod-level resources (_podlevel.py), or the pod as admitted when it would still break
    one of them, or exceed one of the namespace's ResourceQuotas (_quota.py), that the
    admitted pod does not. `steps`: those whose requests share the pod's budget."""
    pod, notes, broken = result.pod, [], []
    if limit_ranges:
        pod, notes = limitrange.fit(before, pod, limit_ranges, steps=steps)
    if podlevel.has_pod_level(before):
        pod = podlevel.fit(before, pod, steps)
        if problems := podlevel.added(before, pod):
            broken.append(f"its pod-level resources ({'; '.join(x.message for x in problems)})")
    if limit_ranges and (violations := limitrange.added_violations(before, pod, limit_ranges)):
        broken.insert(0, f"the namespace's limits ({'; '.join(v.text() for v in violations)})")
    if quotas and (over := quota.exceeded(before, pod, quotas)):
        broken.append(f"the namespace's quota ({'; '.join(over)})")
    if broken:
        return RewriteResult(pod=before, reason=Reason.RESOURCES, warnings=[_prefix(
            f"the rewritten pod would break {' and '.join(broken)}; admitted unchanged")])
    if pod is result.pod:
        return result
    return dataclasses.replace(result, pod=pod, warnings=[*result.warnings, *map(_prefix, notes)])


def _checked(before: dict, after: dict, warnings: list[str], reason: Reason,
             strategy: str = p.MODE_WAITER) -> RewriteResult:
    """Every strategy's pod passes here: kubectl's default container kept, then a last guard:
    a pod the apiserver would reject, or etcd could not store, is never emitted."""
    after = _kubectl_default(before, after)
    problems = pod_problems(after)
    if problems:
        return RewriteResult(pod=before, reason=Reason.INVALID, warnings=[
            _prefix(f"the rewritten pod would be invalid ({'; '.join(problems)}); admitted unchanged")])
    problems = size_problems(after)
    if problems:
        return RewriteResult(pod=before, reason=Reason.TOO_LARGE, warnings=[
            _prefix(f"the rewritten pod would not fit ({'; '.join(problems)}); admitted unchanged")])
    changed = after != before
    return RewriteResult(pod=after if changed else before, warnings=[_prefix(w) for w in warnings],
                         changed=changed, strategy=strategy, reason=reason if changed else Reason.UNCHANGED)


def _kubectl_default(before: Mapping, after: dict) -> dict:
    """`after`, naming kubectl's default container where the rewrite made first a container
    that was not one of the pod's regular containers (a step, initshift's copier). kubectl's
    `logs`, `exec`, `attach` and `cp` without `-c` take the container the annotation names,
    else the first of `containers`: they would reach that one instead of the pod's own. The
    name is the first of the pod's regular containers that is still one: the container they
    took before, or, where that was a proxy now a native sidecar (Linkerd's comes first),
    the pod's main. A name the pod already has (Istio's injector writes one) is kept."""
    annotations = mapping_at(after, "metadata", "annotations")
    if annotations.get(p.DEFAULT_CONTAINER_ANNOTATION):
        return after
    was = [c.get("name") for c in mapping_at(before, "spec").get("containers") or [] if isinstance(c, dict)]
    now = [c.get("name") for c in mapping_at(after, "spec").get("containers") or [] if isinstance(c, dict)]
    regular = set(now)  # sets: linear in the pod's size, however many containers move
    own = next((name for name in was if name in regular), None)
    if not now or now[0] in set(was) or own is None:
        return after
    return {**after, "metadata": {**mapping_at(after, "metadata"),
                                  "annotations": {**annotations, p.DEFAULT_CONTAINER_ANNOTATION: own}}}
