"""Kubernetes object names, by the rules the apiserver validates them with
(k8s.io/apimachinery/pkg/util/validation): one home for the settings' names and the
rewrite's safety net."""

from __future__ import annotations

import re

__all__ = ["DNS_1035_LABEL", "DNS_LABEL", "DNS_SUBDOMAIN", "RULES", "is_name"]

DNS_LABEL = "RFC 1123 label"  # Namespaces, containers, volumes
DNS_1035_LABEL = "RFC 1035 label"  # Services: a letter first
DNS_SUBDOMAIN = "RFC 1123 subdomain"  # most other objects; label prefixes

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
RULES: dict[str, tuple[re.Pattern[str], int]] = {
    DNS_LABEL: (re.compile(_LABEL), 63),
    DNS_1035_LABEL: (re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?"), 63),
    DNS_SUBDOMAIN: (re.compile(rf"{_LABEL}(\.{_LABEL})*"), 253),
}


def is_name(value: str, kind: str) -> bool:
    pattern, limit = RULES[kind]
    return len(value) <= limit and pattern.fullmatch(value) is not None
