"""A namespace's ResourceQuotas, which the rewritten pod must still fit where the pod as
admitted fits.

The apiserver's ResourceQuota admission plugin (plugin/pkg/admission/resourcequota, the
pod evaluator) runs after the mutating webhooks and charges a pod, against every quota
whose scopes match it, its requests and limits as the scheduler counts them (init
containers as their largest, native sidecars in both phases, the pod-level amounts where
the pod sets them, plus its overhead); a pod that would take a quota past its `hard` is
refused (`exceeded quota: NAME, requested: ..., used: ..., limited: ...`).

The rewrite keeps what the pod requests (`preserve`), but its steps' limits add up once
they are regular containers: a build whose six steps each have a 2-CPU limit (a
LimitRange's `default`, often) is charged 2 CPUs of `limits.cpu` as admitted and 12 once
rewritten. `exceeded` is what the rewritten pod would exceed that the pod as admitted
would not, in the apiserver's words: such a pod is admitted unchanged (reason
`resources`). Checked against `status.used` as last seen: a quota the apiserver charges
for other pods meanwhile can still refuse a pod (as it would have without initshift).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ._quantity import QuantityError, format_quantity, parse
from ._resources import Amounts, effective, pod_level, pod_limits, pod_requests, qos_class
from ._shape import mapping_at

__all__ = ["charges", "charges_resources", "exceeded"]

# What a quota's key charges a pod: (requests or limits, resource). `cpu` and `memory` are
# the old names of `requests.cpu` and `requests.memory` (and of ephemeral-storage's).
_PLAIN = ("cpu", "memory", "ephemeral-storage")


def _charged(key: str) -> tuple[str, str] | None:
    if key in _PLAIN:
        return "requests", key
    kind, _, resource = key.partition(".")
    if kind in ("requests", "limits") and resource:
        return kind, resource
    return None


def _resource(key: str) -> str:
    """The resource a quota key or a resource name counts, for its quantities' unit."""
    charged = _charged(key)
    return charged[1] if charged else key


def _amounts(values: object) -> Amounts:
    out: Amounts = {}
    for key, value in (values.items() if isinstance(values, Mapping) else ()):
        try:
            out[str(key)] = parse(value, _resource(str(key)))
        except QuantityError:
            pass  # the apiserver refused such a quota when it was written
    return out


def charges(spec: Mapping) -> dict[str, Amounts]:
    """The pod's requests and limits as the quota charges them (resource.PodRequests,
    PodLimits: the pod-level amounts where set, the overhead added)."""
    requests, limits = pod_level(spec)
    overhead = _amounts(spec.get("overhead"))
    charged = {"requests": effective(pod_requests(spec), requests), "limits": effective(pod_limits(spec), limits)}
    for kind, amounts in charged.items():
        for r, v in overhead.items():
            if kind == "requests" or r in amounts:  # a limit only where the pod has one
                amounts[r] = amounts.get(r, 0) + v
    return charged


def _scope_matches(scope: str, operator: str, values: Sequence[str], spec: Mapping) -> bool:
    """One scope of a quota, as the pod evaluator's MatchingScopes reads it; a scope that
    does not apply to pods (VolumeAttributesClass) matches none."""
    if scope in ("Terminating", "NotTerminating"):
        deadline = spec.get("activeDeadlineSeconds")
        terminating = isinstance(deadline, int) and deadline >= 0
        return terminating if scope == "Terminating" else not terminating
    if scope in ("BestEffort", "NotBestEffort"):
        best_effort = qos_class(spec) == "BestEffort"
        return best_effort if scope == "BestEffort" else not best_effort
    if scope == "PriorityClass":
        name = str(spec.get("priorityClassName") or "")
        return {"In": name in values, "NotIn": name not in values, "Exists": bool(name),
                "DoesNotExist": not name}.get(operator, False)
    if scope == "CrossNamespacePodAffinity":
        affinity = mapping_at(spec, "affinity")
        terms = [t for kind in ("podAffinity", "podAntiAffinity") for key in
                 ("requiredDuringSchedulingIgnoredDuringExecution", "preferredDuringSchedulingIgnoredDuringExecution")
                 for t in (mapping_at(affinity, kind).get(key) or [])]
        terms = [t.get("podAffinityTerm", t) if isinstance(t, Mapping) else {} for t in terms]
        return any(t.get("namespaces") or t.get("namespaceSelector") is not None for t in terms)
    return False


def _matches(quota: Mapping, spec: Mapping) -> bool:
    qspec = mapping_at(quota, "spec")
    scopes = [(str(s), "Exists", ()) for s in qspec.get("scopes") or []]
    for e in mapping_at(qspec, "scopeSelector").get("matchExpressions") or []:
        if isinstance(e, Mapping):
            scopes.append((str(e.get("scopeName")), str(e.get("operator")), [str(v) for v in e.get("values") or []]))
    return all(_scope_matches(scope, op, values, spec) for scope, op, values in scopes)


def charges_resources(quotas: Sequence[Mapping]) -> bool:
    """Some quota charges requests or limits (not only object counts)."""
    return any(_charged(str(key)) for q in quotas for key in mapping_at(q, "status").get("hard") or {})


def _q(value: int, key: str) -> str:
    return format_quantity(value, _resource(key))


def exceeded(before: Mapping, after: Mapping, quotas: Sequence[Mapping]) -> list[str]:
    """The quotas `after` (the rewrite of `before`) would exceed and `before` would not, as
    the apiserver words each refusal. A quota whose status the quota controller has not
    filled yet refuses every pod, rewritten or not: it is not one the rewrite breaks."""
    old_spec, new_spec = mapping_at(before, "spec"), mapping_at(after, "spec")
    both: tuple[dict[str, Amounts], dict[str, Amounts]] | None = None  # computed once a quota needs them
    out = []
    for quota in quotas:
        status = mapping_at(quota, "status")
        hard, used = _amounts(status.get("hard")), _amounts(status.get("used"))
        if not any(map(_charged, hard)) or not _matches(quota, old_spec):
            continue
        old, new = both = both or (charges(old_spec), charges(new_spec))
        over = []
        for key in sorted(hard):
            charged = _charged(key)
            if charged is None:
                continue
            kind, r = charged
            was, now, limit = old[kind].get(r, 0), new[kind].get(r, 0), hard[key]
            if now > was and used.get(key, 0) + now > limit >= used.get(key, 0) + was:
                over.append((key, now, used.get(key, 0), limit))
        if over:
            name = str(mapping_at(quota, "metadata").get("name") or "")
            requested = ",".join(f"{k}={_q(n, k)}" for k, n, _, _ in over)
            in_use = ",".join(f"{k}={_q(u, k)}" for k, _, u, _ in over)
            limited = ",".join(f"{k}={_q(h, k)}" for k, _, _, h in over)
            out.append(f"exceeded quota: {name}, requested: {requested}, used: {in_use}, limited: {limited}")
    return out
