"""The JSONPatch the apiserver applies: the diff between the pod it sent and ours.

A structural diff, not a minimal one: objects are compared key by key, lists of the same
length element by element, and a list whose length changed is replaced whole. For the
rewrite that is exactly right (steps move between `initContainers` and `containers`, so
those lists are replaced; a re-invocation that only changes step 0's args yields a few
ops), and it is linear, where jsonpatch.make_patch's move detection dominated the
admission latency.
"""

from __future__ import annotations

from typing import Any, Mapping


def _token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _diff(path: str, a: Any, b: Any, ops: list[dict]) -> None:
    # What the rewrite leaves alone it shares with its input (`is`): skipped before any
    # path is built for it.
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a:
            if key not in b:
                ops.append({"op": "remove", "path": f"{path}/{_token(key)}"})
        for key, value in b.items():
            if key not in a:
                ops.append({"op": "add", "path": f"{path}/{_token(key)}", "value": value})
            elif a[key] is not value:
                _diff(f"{path}/{_token(key)}", a[key], value, ops)
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x is not y:
                _diff(f"{path}/{i}", x, y, ops)
        return
    # Scalars compare with their JSON type: 1 == True and 1 == 1.0 in Python, not in JSON.
    if type(a) is not type(b) or a != b:
        ops.append({"op": "replace", "path": path, "value": b})


def make_patch(before: Mapping, after: Mapping) -> list[dict]:
    """JSONPatch ops that turn `before` into `after` (values are shared, not copied)."""
    ops: list[dict] = []
    if before is not after:
        _diff("", before, after, ops)
    return ops
