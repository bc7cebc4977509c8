"""The large lane's parser (pure-Python scanner, gives up the GIL) reads every body exactly
as the C scanner does: the same Review, or the same one-line BadReview."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from tests.admission.test_server import BAD, GOOD
from tests.support import hostile
from webhook.admission import _review as admission


def _outcome(body: bytes, yielding: bool):
    try:
        review = admission.parse_review(body, yielding=yielding)
    except admission.BadReview as e:
        return "bad", str(e)
    return "ok", (review.uid, review.operation, review.obj)


@pytest.mark.parametrize("name", list(BAD))
def test_bad_bodies_get_the_same_message(name):
    body = BAD[name][0]
    assert _outcome(body, True) == _outcome(body, False)


def test_a_large_review_parses_to_the_same_pod():
    body = hostile.large_body(400_000)
    kind, value = _outcome(body, True)
    assert kind == "ok" and (kind, value) == _outcome(body, False)


def test_surrogates_and_escapes_are_read_alike():
    doc = json.loads(GOOD)
    doc["request"]["object"]["metadata"]["annotations"] = {"a": "\u00e9\\\"\t\U0001F600", "b": "\udfff"}
    body = json.dumps(doc).encode()
    assert _outcome(body, True) == _outcome(body, False)
    assert _outcome(body, True)[0] == "bad"  # a lone surrogate is no Unicode text


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                     | st.text(), lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                     max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(extra=_json)
def test_any_json_value_inside_a_review_is_read_alike(extra):
    doc = json.loads(GOOD)
    doc["request"]["object"]["metadata"]["annotations"] = {"x": json.dumps(extra)}
    doc["request"]["extra"] = extra
    body = json.dumps(doc).encode()
    assert _outcome(body, True) == _outcome(body, False)
