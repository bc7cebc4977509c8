"""Applying a JSONPatch in tests, as the apiserver does (RFC 6902, jsonpatch).

Only the tests apply patches (the server only makes them), so jsonpatch is a test
dependency, not a runtime one.
"""

from __future__ import annotations

from typing import Mapping

import jsonpatch


def apply_patch(doc: Mapping, ops: list[dict]) -> dict:
    return jsonpatch.apply_patch(doc, ops, in_place=False)
