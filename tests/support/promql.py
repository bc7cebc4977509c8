"""PromQL in deploy/ checked against what initshift exports.

Parsing is promql-parser (PyPI, a binding of the Rust `promql-parser` crate, which follows
Prometheus' own grammar and type rules: unknown functions, a range vector where an
instant vector is needed and unbalanced expressions are errors). On top of the parse,
`selectors()` walks the tree and returns every metric a query reads with the labels it
matches on or groups by, so a test can hold them against the registry's real series.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import promql_parser as pp
from prometheus_client import CollectorRegistry

# Labels Prometheus adds to every scraped series (target labels from the ServiceMonitor
# or PodMonitor), which queries may match or group on.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "container", "endpoint"})


class PromQLError(ValueError):
    pass


@dataclass
class Uses:
    """What one query reads: metric name -> labels it names (matchers, by/on/ignoring)."""

    metrics: dict[str, set[str]] = field(default_factory=dict)
    grouping: set[str] = field(default_factory=set)  # by (...), on (...), group_left (...)


def parse(query: str) -> pp.Expr:
    try:
        return pp.parse(query)
    except ValueError as e:
        raise PromQLError(f"{query!r}: {e}") from None


def uses(query: str) -> Uses:
    out = Uses()
    _walk(parse(query), out)
    return out


def _walk(node: object, out: Uses) -> None:
    if isinstance(node, pp.VectorSelector):
        if not node.name:
            raise PromQLError(f"selector without a metric name: {node}")
        labels = out.metrics.setdefault(node.name, set())
        labels.update(m.name for m in node.matchers.matchers if m.name != "__name__")
    elif isinstance(node, pp.MatrixSelector):
        _walk(node.vector_selector, out)
    elif isinstance(node, pp.BinaryExpr):
        modifier = node.modifier
        if modifier is not None:
            if modifier.matching is not None:
                out.grouping.update(modifier.matching.labels)
            out.grouping.update(modifier.group_labels or [])
        _walk(node.lhs, out)
        _walk(node.rhs, out)
    elif isinstance(node, pp.AggregateExpr):
        if node.modifier is not None:
            out.grouping.update(node.modifier.labels)
        _walk(node.expr, out)
        if node.param is not None:
            _walk(node.param, out)
    elif isinstance(node, pp.Call):
        for arg in node.args:
            _walk(arg, out)
    elif isinstance(node, (pp.ParenExpr, pp.UnaryExpr, pp.SubqueryExpr)):
        _walk(node.expr, out)
    elif not isinstance(node, (pp.NumberLiteral, pp.StringLiteral)):
        raise PromQLError(f"unexpected PromQL node {type(node).__name__}")


def exported(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Every series name the registry can export -> its label names (`le` for buckets).

    Derived from the metric families' types, so labelled metrics that have seen no
    observation yet still count."""
    out: dict[str, set[str]] = {}
    for family in registry.collect():
        labels: set[str] = set()
        for sample in family.samples:
            labels.update(sample.labels)
        described = getattr(registry, "_names_to_collectors", {})  # labels of unobserved children
        collector = described.get(family.name) or described.get(family.name + "_total")
        labels.update(getattr(collector, "_labelnames", ()))
        if family.type == "counter":
            out[family.name + "_total"] = set(labels)
        elif family.type == "histogram":
            out[family.name + "_bucket"] = labels | {"le"}
            out[family.name + "_count"] = set(labels)
            out[family.name + "_sum"] = set(labels)
        else:
            out[family.name] = set(labels)
    return out
