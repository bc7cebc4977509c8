"""Compact JSON text as bytes, for what the admission path writes on every review: the
answer, its JSONPatch, the etcd size check (webhook/rewrite/_podcheck.py) and the log line.

orjson writes it about ten times faster than the standard library's encoder, the same JSON
value with the same key order; it refuses integers beyond 64 bits and strings holding lone
surrogates, which the standard library parser lets through: those go to the standard library.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import orjson

__all__ = ["dumps"]


def dumps(obj: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """`obj` as compact JSON: non-ASCII text as UTF-8 (as \\u escapes where the standard
    library writes it, the same JSON value). `default`: what a value no JSON type fits
    is written as (as the standard library's `default`)."""
    try:
        return orjson.dumps(obj, default=default)
    except orjson.JSONEncodeError:
        return json.dumps(obj, separators=(",", ":"), default=default).encode()
