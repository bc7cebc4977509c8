"""Quantities as integers (milli-CPU, bytes/units) within resource.Quantity's bounds: exact
against a Fraction oracle, and hostile text (issue 17, finding 4) a QuantityError found in
time linear in its length."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.rewrite._quantity import MAX, QuantityError, format_quantity, parse

SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "n": Fraction(1, 10**9),
            "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1, "k": 10**3, "M": 10**6, "G": 10**9,
            "T": 10**12, "P": 10**15, "E": 10**18}


def oracle(text: str, resource: str) -> int:
    """ceil(|value| in the unit) with the sign, as MilliValue()/Value() round."""
    number, suffix = re.fullmatch(r"([-+0-9.]+)(.*)", text).groups()
    scale = Fraction(10) ** int(suffix[1:]) if len(suffix) > 1 and suffix[1] != "i" else SUFFIXES[suffix]
    value = Fraction(number) * scale * (1000 if resource == "cpu" else 1)
    magnitude = math.ceil(abs(value))
    return -magnitude if value < 0 else magnitude


@pytest.mark.parametrize("text,resource,expected", [
    ("100m", "cpu", 100), ("1", "cpu", 1000), ("1.5", "cpu", 1500), ("0.1m", "cpu", 1), ("2e3", "cpu", 2_000_000),
    ("1Gi", "memory", 2**30), ("1.5Gi", "memory", 3 * 2**29), ("0.5", "memory", 1), ("128974848", "memory", 128974848),
    ("129e6", "memory", 129_000_000), ("123Mi", "memory", 123 * 2**20), ("1E-2", "cpu", 10), (".5", "cpu", 500),
    ("5.", "cpu", 5000), ("+1k", "memory", 1000), ("-1", "memory", -1), ("0", "cpu", 0), ("000", "cpu", 0),
    (" 1 ", "cpu", 1000), ("1e-9999", "cpu", 1), ("1n", "cpu", 1), ("1Ei", "memory", 2**60), ("7Ei", "memory", 7 * 2**60),
    (2, "cpu", 2000), (0.25, "cpu", 250), (1e3, "memory", 1000), (2**63 - 1, "memory", MAX),
])
def test_parse_into_the_unit_the_scheduler_counts(text, resource, expected):
    assert parse(text, resource) == expected


@pytest.mark.parametrize("text,resource", [
    ("1e3000000", "cpu"), ("1e-3000000", "memory"), ("1" * 5000, "memory"), ("0." + "1" * 5000, "cpu"),
    ("9223372036854775808", "memory"), ("9223372036854775807", "cpu"), ("8Ei", "memory"), ("9300000P", "memory"),
    ("12345678901234567890", "memory"), ("1.234567890123456789012", "cpu"), ("lots", "cpu"), ("", "cpu"), (".", "cpu"), ("1Kb", "memory"), ("1 Gi", "memory"),
    ("--1", "cpu"), ("1e", "cpu"), ("0x10", "cpu"), (True, "cpu"), (None, "cpu"), ([1], "cpu"), (2**63, "memory"),
    (2**70, "memory"), (1e300, "memory"), ("١", "cpu"),
])
def test_out_of_bounds_or_malformed_is_a_quantity_error(text, resource):
    with pytest.raises(QuantityError) as e:
        parse(text, resource)
    assert "\n" not in str(e.value) and len(str(e.value)) < 120


def test_huge_text_costs_linear_time():
    """1e3000000 once cost 7 s of Fraction arithmetic; the bounds are checked on the text.
    (No timing assert: the operation count is what is bounded. A 3 MB digit string would
    take minutes quadratically; linear it is a few milliseconds.)"""
    for text in ("1e" + "9" * 3_000_000, "9" * 3_000_000, "1" * 3_000_000 + "e-3000000"):
        with pytest.raises(QuantityError):
            parse(text, "memory")
    assert parse("0." + "0" * 3_000_000 + "1", "cpu") == 1  # tiny, rounded up as MilliValue() does


quantities = st.builds(
    lambda sign, whole, frac, suffix: f"{sign}{whole}{'.' + frac if frac is not None else ''}{suffix}",
    st.sampled_from(["", "+", "-"]), st.from_regex(r"[0-9]{1,7}", fullmatch=True),
    st.none() | st.from_regex(r"[0-9]{0,5}", fullmatch=True), st.sampled_from([*SUFFIXES, "e3", "E-2", "e+0", "e-12"]))


@settings(max_examples=500, deadline=None)
@given(quantities, st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]))
def test_parse_matches_exact_arithmetic(text, resource):
    expected = oracle(text, resource)
    if abs(expected) > MAX:
        with pytest.raises(QuantityError):
            parse(text, resource)
    else:
        assert parse(text, resource) == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(0, MAX), st.sampled_from(["cpu", "memory", "ephemeral-storage"]))
def test_format_round_trips(value, resource):
    assert parse(format_quantity(value, resource), resource) == value


@pytest.mark.parametrize("value,resource,text", [
    (0, "cpu", "0"), (-5, "memory", "0"), (1500, "cpu", "1500m"), (2000, "cpu", "2"), (2**30, "memory", "1Gi"),
    (3 * 2**29, "memory", "1536Mi"), (1000, "memory", "1000"), (1024, "memory", "1Ki"),
])
def test_format_is_canonical(value, resource, text):
    assert format_quantity(value, resource) == text
