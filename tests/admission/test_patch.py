"""The structural JSONPatch: applying it to the input always gives the output."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.patching import apply_patch
from webhook.admission._patch import make_patch

KEYS = st.sampled_from(["a", "b", "x/y", "~t", "", "spec"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYS, JSON, max_size=4), st.dictionaries(KEYS, JSON, max_size=4))
def test_patch_round_trips(a, b):
    assert apply_patch(a, make_patch(a, b)) == b


def test_no_ops_for_equal_documents_and_json_types_are_kept_apart():
    assert make_patch({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}) == []
    assert make_patch({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]


def test_pointer_escaping_and_list_shapes():
    ops = make_patch({"m": {"a/b": 1, "c~d": 2}, "l": [1, 2]}, {"m": {"a/b": 3}, "l": [1, 2, 3]})
    assert {"op": "replace", "path": "/m/a~1b", "value": 3} in ops
    assert {"op": "remove", "path": "/m/c~0d"} in ops
    assert {"op": "replace", "path": "/l", "value": [1, 2, 3]} in ops
