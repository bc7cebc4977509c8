"""PromQL in deploy/ checked against what initshift exports.

Parsing is promql-parser (PyPI, a binding of the Rust `promql-parser` crate, which follows
Prometheus' own grammar and type rules: unknown functions, a range vector where an
instant vector is needed and unbalanced expressions are errors). On top of the parse,
`selectors()` walks the tree and returns every metric a query reads with the labels it
matches on or groups by, so a test can hold them against the registry's real series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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


# Series the alerts read that initshift does not export: Prometheus' own `up` (per target,
# `job` set by the monitors' relabeling) and the apiserver's admission-webhook counters
# (Kubernetes metrics reference: fail_open_count by name and type, rejection_count by name,
# type, operation, error_type and rejection_code).
EXTERNAL_SERIES: dict[str, set[str]] = {
    "up": {"job"},
    "apiserver_admission_webhook_fail_open_count": {"name", "type"},
    "apiserver_admission_webhook_rejection_count": {"name", "type", "operation", "error_type", "rejection_code"},
}

PROMTOOL = "promtool"  # Debian's `prometheus` package (the Makefile's APT_PACKAGES)


@dataclass
class AlertCase:
    """One promtool unit test: input series (`series{labels}` -> promtool's expanding
    notation, e.g. `0+1x30`), evaluated at `at`; `fires` the labels each expected alert
    carries beyond the rule's own (empty list: the alert must not fire)."""

    alert: str
    series: dict[str, str]
    at: str
    fires: list[dict[str, str]]


def promtool_test(groups: list[dict], cases: list[AlertCase], workdir: Path) -> None:
    """Run `promtool test rules` on `groups` (a PrometheusRule's spec.groups) with `cases`;
    AssertionError with promtool's report when a case fails. The expected annotations are
    the rule's own (promtool compares them too)."""
    import shutil
    import subprocess

    import yaml

    binary = shutil.which(PROMTOOL)
    assert binary, "promtool missing: `make system-deps` installs Debian's prometheus package (as root)"
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tests = []
    for case in cases:
        rule = rules[case.alert]
        tests.append({
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
            "alert_rule_test": [{
                "eval_time": case.at, "alertname": case.alert,
                "exp_alerts": [{"exp_labels": {**rule.get("labels", {}), **labels},
                                "exp_annotations": rule.get("annotations", {})} for labels in case.fires],
            }],
        })
    (workdir / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                                        "tests": tests}))
    proc = subprocess.run([binary, "test", "rules", str(workdir / "tests.yaml")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
