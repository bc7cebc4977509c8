"""The JSONPatch the apiserver applies: the diff between the pod it sent and ours."""

from __future__ import annotations

from typing import Mapping

import jsonpatch


def make_patch(before: Mapping, after: Mapping) -> list[dict]:
    return list(jsonpatch.make_patch(before, after))


def apply_patch(doc: Mapping, ops: list[dict]) -> dict:
    return jsonpatch.apply_patch(doc, ops, in_place=False)
