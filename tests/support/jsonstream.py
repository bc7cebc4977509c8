"""JSON documents written one after another (`initshift status -w -o json`: one per drawing)."""

from __future__ import annotations

import json
from typing import Any


def json_documents(text: str) -> list[Any]:
    decoder, docs, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        doc, at = decoder.raw_decode(text, len(text) - len(text[at:].lstrip()))
        docs.append(doc)
    return docs
