"""Kubernetes resource quantities, parsed once into integers and formatted canonically.

Grammar (k8s.io/apimachinery resource.Quantity): a signed decimal number followed by a
binary suffix (Ki..Ei), a decimal SI suffix (n, u, m, "", k, M, G, T, P, E) or a decimal
exponent (e3, E-2). JSON numbers are accepted as well, as the apiserver does.

The value is an `int` in the unit the scheduler counts in: milli-units for `cpu`
(resource.Quantity.MilliValue) and whole units (bytes) for everything else (Value()),
both rounded up away from zero as those methods do. Kubernetes' own bounds hold: at most
2^63-1 of that unit, so at most 19 significant digits (apimachinery keeps 18 exactly in
its int64 fast path); anything beyond is a QuantityError, found without ever building the number, so parsing costs
O(length of the text) however large the exponent or the digit string.
"""

from __future__ import annotations

import functools
import re

from ._errors import RewriteError

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}  # powers of two
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}  # powers of ten
_RE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE]?)")

MAX = 2**63 - 1  # resource.Quantity's int64 bound, in the resource's own unit here
_MAX_DIGITS = 19  # significant digits of 2^63-1: more can only be out of range or finer than a nano-unit
_MAX_EXPONENT_DIGITS = 4  # |exponent| <= 9999: anything larger is out of range whatever the digits
ZERO = 0


class QuantityError(RewriteError, ValueError):
    """Not a Kubernetes quantity (the pod is left unchanged, reason `invalid`)."""


# Powers of ten between a resource's unit and its integer: cpu counts milli-units, others 0.
_UNIT_EXPONENT = {"cpu": 3}


_CACHED_LENGTH = 64  # longer text is never a real quantity: parse it (linearly), keep nothing


def parse(value: object, resource: str = "") -> int:
    """`value` in `resource`'s integer unit (milli-CPU, bytes or units), rounded up."""
    if type(value) is str and len(value) <= _CACHED_LENGTH:
        return _parse_cached(value, _UNIT_EXPONENT.get(resource, 0))
    return _parse(value, _UNIT_EXPONENT.get(resource, 0))


# A pod's quantities are read by several rules (requests, QoS, growth, the safety net) and
# the same few strings recur across pods: each distinct short value is parsed once.
@functools.lru_cache(maxsize=4096)
def _parse_cached(value: str, unit: int) -> int:
    return _parse(value, unit)


def _parse(value: object, unit: int) -> int:
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        if value.bit_length() > 63:
            raise QuantityError(f"quantity {_short(value)} is out of range")
        return _bounded(value * 10**unit, value)
    if isinstance(value, float):
        value = repr(value)  # '1e+20', '0.25': the decimal text the number was written as
    if not isinstance(value, str):
        raise QuantityError(f"not a quantity: {_short(value)}")
    text = value.strip()
    m = _RE.fullmatch(text)
    if not m or not (m.group(2) or m.group(3)):
        raise QuantityError(f"not a quantity: {_short(value)}")
    sign, whole, frac, suffix = m.group(1), m.group(2), m.group(3) or "", m.group(4)
    two, ten = 0, -len(frac)
    if suffix in _BINARY:
        two = _BINARY[suffix]
    elif len(suffix) > 1:  # e3, E-2 (a lone E is exa)
        exp = suffix[1:].lstrip("+-").lstrip("0")
        if len(exp) > _MAX_EXPONENT_DIGITS:
            raise QuantityError(f"quantity {_short(value)}: exponent out of range")
        ten += -int(exp or 0) if suffix[1:2] == "-" else int(exp or 0)
    else:
        ten += _DECIMAL[suffix]
    digits = (whole + frac).lstrip("0")
    stripped = digits.rstrip("0")
    ten += len(digits) - len(stripped)
    if not stripped:
        return 0
    if len(stripped) > _MAX_DIGITS:
        raise QuantityError(f"quantity {_short(value)} has more than {_MAX_DIGITS} significant digits")
    ten += unit
    # Magnitude check before any arithmetic: the value is at least 10^(len-1+ten) * 2^two.
    if len(stripped) - 1 + ten + two * 3 // 10 > 19:
        raise QuantityError(f"quantity {_short(value)} is out of range")
    mantissa = int(stripped) << two
    if ten >= 0:
        amount = mantissa * 10**ten
    elif -ten > 40:  # far below one unit: rounds up to one (a non-zero request stays non-zero)
        amount = 1
    else:
        amount = -(-mantissa // 10**-ten)
    return -_bounded(amount, value) if sign == "-" else _bounded(amount, value)


def _bounded(amount: int, value: object) -> int:
    if abs(amount) > MAX:
        raise QuantityError(f"quantity {_short(value)} is out of range")
    return amount


def _short(value: object) -> str:
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else f"<{value.bit_length()}-bit integer>"
    return text if len(text) <= 40 else text[:37] + "..."


def _is_valid(value: object, resource: str = "") -> bool:
    try:
        parse(value, resource)
    except QuantityError:
        return False
    return True


def format_quantity(value: int, resource: str) -> str:
    """The canonical string of `value` (in `resource`'s integer unit): CPU in whole cores or
    millicores, other resources in whole units with the largest exact binary suffix."""
    if value <= 0:
        return "0"
    if resource == "cpu":
        if value % 1000 == 0:
            return str(value // 1000)
        return f"{value}m"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = 1 << _BINARY[suffix]
        if value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
