"""Kubernetes resource quantities, parsed exactly (Fraction) and formatted canonically.

Grammar (k8s.io/apimachinery resource.Quantity): a signed decimal number followed by a
binary suffix (Ki..Ei), a decimal SI suffix (n, u, m, "", k, M, G, T, P, E) or a decimal
exponent (e3, E-2). JSON numbers are accepted as well, as the apiserver does.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

from ._errors import RewriteError

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
            "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
            "P": Fraction(10**15), "E": Fraction(10**18)}
_RE = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|[numkMGTPE]?)$")

ZERO = Fraction(0)


class QuantityError(RewriteError, ValueError):
    """Not a Kubernetes quantity (the pod is left unchanged, reason `invalid`)."""


# A pod's quantities are read by several rules (requests, QoS, growth, the safety net) and
# the same few strings recur across pods: each distinct value is parsed once.
@functools.lru_cache(maxsize=4096, typed=True)
def parse(value: str | int | float) -> Fraction:
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"not a quantity: {value!r}")
    m = _RE.match(value.strip())
    if not m:
        raise QuantityError(f"not a quantity: {value!r}")
    number, suffix = Fraction(m.group(1)), m.group(2)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    return number * _DECIMAL[suffix]


def is_valid(value: object) -> bool:
    try:
        parse(value)  # type: ignore[arg-type]
    except QuantityError:
        return False
    return True


def format_quantity(value: Fraction, resource: str) -> str:
    """A canonical string no larger than `value`: CPU in whole cores or millicores, other
    resources in whole units with the largest exact binary suffix (bytes are integers)."""
    if value <= 0:
        return "0"
    if resource == "cpu":
        millis = (value * 1000).__floor__()
        if millis % 1000 == 0:
            return str(millis // 1000)
        return f"{millis}m"
    units = value.__floor__()
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if units >= _BINARY[suffix] and units % _BINARY[suffix] == 0:
            return f"{units // _BINARY[suffix]}{suffix}"
    return str(units)
