"""The shape of the pod fields the rewrite reads, checked before it reads them.

The apiserver only sends typed pods, but the webhook answers anything that reaches it
(`initshift mutate`, curl, a fuzzer): a field of the wrong JSON type becomes one clear
reason and an unchanged pod, never an exception deep inside the rewrite.
"""

from __future__ import annotations

from typing import Any, Callable

# A check returns None, or the problem below the value it was given: the path from there,
# then what is wrong (`.containers[0].name must be a string`). Each level adds its step
# only on the way out of a problem, so a well-formed pod builds no path strings at all.
_Check = Callable[[Any], "str | None"]

_SCALAR = (str, int, float)


def _is(kind: type | tuple[type, ...], what: str) -> _Check:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    problem = f" must be {what}"
    bool_ok = bool in kinds

    def check(value: Any) -> str | None:
        # JSON true is not a number, though Python's bool is an int.
        if not isinstance(value, kinds) or isinstance(value, bool) and not bool_ok:
            return problem
        return None
    check.plain = frozenset(kinds) - ({bool} - set(kinds))  # type: ignore[attr-defined]
    return check


def _plain(item_check: _Check) -> frozenset:
    """The exact types a type check (`_is`) accepts; empty for other checks. A collection
    whose items are all of them (the usual case) is passed in one pass, no call per item."""
    return getattr(item_check, "plain", frozenset())


def _map_of(value_check: _Check) -> _Check:
    plain = _plain(value_check)

    def check(value: Any) -> str | None:
        if not isinstance(value, dict):
            return " must be an object"
        if plain and set(map(type, value.values())) <= plain:
            return None
        for k, v in value.items():
            problem = value_check(v)
            if problem:
                return f"[{k!r}]{problem}"
        return None
    return check


def _list_of(item_check: _Check) -> _Check:
    plain = _plain(item_check)

    def check(value: Any) -> str | None:
        if not isinstance(value, list):
            return " must be a list"
        if plain and set(map(type, value)) <= plain:
            return None
        for i, item in enumerate(value):
            problem = item_check(item)
            if problem:
                return f"[{i}]{problem}"
        return None
    return check


def _object(required: dict[str, _Check], optional: dict[str, _Check]) -> _Check:
    fields = [(key, field_check, _plain(field_check)) for key, field_check in {**required, **optional}.items()]

    def check(value: Any) -> str | None:
        if not isinstance(value, dict):
            return " must be an object"
        for key in required:
            if value.get(key) is None:  # JSON null is no value (the apiserver decodes it to "")
                return f".{key} is missing"
        for key, field_check, plain in fields:
            field = value.get(key)
            if field is not None and type(field) not in plain:
                problem = field_check(field)
                if problem:
                    return f".{key}{problem}"
        return None
    return check


_STR = _is(str, "a string")
_STRINGS = _list_of(_STR)
_OBJECT = _is(dict, "an object")
_QUANTITIES = _map_of(_is(_SCALAR, "a quantity"))

CONTAINER = _object(
    {"name": _STR},
    {
        "image": _STR, "command": _STRINGS, "args": _STRINGS, "restartPolicy": _STR,
        "terminationMessagePath": _STR,
        "env": _list_of(_OBJECT),
        "ports": _list_of(_object({}, {"name": _STR, "containerPort": _is(int, "an integer")})),
        "volumeMounts": _list_of(_object({"name": _STR, "mountPath": _STR}, {})),
        "resources": _object({}, {"requests": _QUANTITIES, "limits": _QUANTITIES}),
        "readinessProbe": _object({}, {"httpGet": _OBJECT, "tcpSocket": _OBJECT}),
    },
)

POD = _object(
    {"spec": _object({"containers": _list_of(CONTAINER)}, {
        "initContainers": _list_of(CONTAINER),
        "volumes": _list_of(_object({"name": _STR}, {})),
        "imagePullSecrets": _list_of(_object({}, {"name": _STR})),
        "restartPolicy": _STR,
        "os": _object({}, {"name": _STR}),
    })},
    {"metadata": _object({}, {"labels": _map_of(_STR), "annotations": _map_of(_STR)})},
)


# No Pod field nests anywhere near this deep (managedFields, the deepest, mirrors the spec's
# ~15 levels); deeper input would only make recursive code (copy.deepcopy, the patch diff)
# overflow the stack. `initshift mutate`/`review` refuse such a pod with the same rule.
MAX_DEPTH = 100
_CONTAINERS = frozenset((dict, list))


def _depth_over(doc: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `doc` nests more than `limit` objects/lists deep (iterative: no recursion),
    one level at a time. Parsed JSON holds plain dicts and lists only, so exact type tests
    are enough (and fast: this runs on every review)."""
    level, depth = [doc], 1
    while level:
        if depth > limit:
            return True
        level = [child for node in level for child in (node.values() if type(node) is dict else node)
                 if type(child) in _CONTAINERS]
        depth += 1
    return False


def depth_problem(pod: Any) -> str | None:
    """`the pod nests deeper than 100 levels`, or None."""
    return f"the pod nests deeper than {MAX_DEPTH} levels" if _depth_over(pod) else None


def shape_problem(pod: Any) -> str | None:
    """The first field of the wrong type, as `pod.spec.containers[0].name must be a string`."""
    problem = depth_problem(pod)
    if problem:
        return problem
    problem = POD(pod)
    return f"pod{problem}" if problem else None


def mapping_at(obj: Any, *keys: str) -> dict:
    """obj[k1][k2]... when every step is an object, else {}: for code that runs on pods the
    shape check refused too (a `spec` that is a list, `labels` that is a string)."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj if isinstance(obj, dict) else {}


def submap(obj: dict, *keys: str) -> dict:
    """A copy of the object at obj[k1][k2]..., put in its place along the way, for the
    rewrite to write into: `obj` (already the rewrite's own) shares the rest with its
    input, which is never changed. Created where missing or null (`labels:` left empty in
    YAML is null, and JSON null passes the shape check)."""
    for key in keys:
        obj[key] = dict(obj.get(key) or {})
        obj = obj[key]
    return obj
