"""Applying a JSONPatch in tests, as the apiserver does (RFC 6902, jsonpatch).

Only the tests apply patches (the server only makes them), so jsonpatch is a test
dependency, not a runtime one.
"""

from __future__ import annotations

import base64
import json
from typing import Mapping

import jsonpatch


def apply_patch(doc: Mapping, ops: list[dict]) -> dict:
    return jsonpatch.apply_patch(doc, ops, in_place=False)


def decode_patch(answer: Mapping) -> list[dict]:
    """The JSONPatch inside an AdmissionReview answer (empty when there is none)."""
    raw = answer.get("response", {}).get("patch")
    return json.loads(base64.b64decode(raw)) if raw else []
