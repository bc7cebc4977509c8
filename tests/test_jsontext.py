"""webhook.jsontext: the same JSON value as the standard library, whatever orjson refuses."""

from __future__ import annotations

import json

import pytest

from webhook import jsontext


@pytest.mark.parametrize("value", [
    {"a": [1, "é", None, True, 1.5, {"b": "\u2028<>&"}], "z": -0.0},
    {"big": 2**70, "neg": -(2**64)},  # over 64 bits: orjson refuses them
    {"lone": "\ud800x"},  # a lone surrogate, as json.loads makes from "\\ud800"
])
def test_dumps_is_compact_json_of_the_same_value(value):
    text = jsontext.dumps(value)
    assert isinstance(text, bytes) and b" " not in text.replace(b"\\u", b"")
    assert json.loads(text) == value


def test_object_keys_keep_their_order():
    assert jsontext.dumps({"b": 1, "a": 2}) == b'{"b":1,"a":2}'
