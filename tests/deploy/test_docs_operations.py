"""The operator-facing pages against the code: install starts with the image, every chart
value is in docs/install.md's values table, every exported series and every alert is in
docs/monitoring.md, and each alert has a runbook entry there."""

from __future__ import annotations

import re

import yaml

from tests.support import docs, promql
from tests.support.deploy_render import CHART, DEPLOY


def leaves(values: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        # maps whose keys are the user's (labels, selectors, endpoints) are one value
        if isinstance(value, dict) and value and key not in ("quitEndpoints", "namespaceSelector", "labels",
                                                            "resources", "annotations"):
            out |= leaves(value, path + ".")
        else:
            out.add(path)
    return out


def test_install_lists_every_chart_value():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    table = docs.section(docs.page("install.md"), "Helm values")
    rows = set(re.findall(r"^\| `([\w.]+)` \|", table, re.M))
    assert rows == leaves(values)


def test_install_starts_with_building_and_pushing_the_image():
    for name, apply in (("install.md", "2. **Apply.**"), ("README.md", "2. **Apply**")):
        steps = docs.page(name)
        first = steps[steps.index("1. **Build and push the image"):steps.index(apply)]
        assert "docker build" in first and "docker push" in first and "nothing publishes" in first.lower(), name


def alerts() -> list[dict]:
    rule = yaml.safe_load((DEPLOY / "components/monitoring/prometheusrule.yaml").read_text())
    return rule["spec"]["groups"][0]["rules"]


def test_monitoring_lists_every_series_and_alert():
    import webhook.admission._cluster  # noqa: F401
    import webhook.watcher._metrics  # noqa: F401
    from webhook.metrics import REGISTRY

    text = docs.section(docs.page("monitoring.md"), "Metrics")
    families = {re.sub(r"_(total|bucket|count|sum)$", "", n) + ("_total" if n.endswith("_total") else "")
                for n in promql.exported(REGISTRY) if n.startswith("initshift_")}
    for name in families:
        assert f"`{name}`" in text, name
    table = docs.section(docs.page("monitoring.md"), "Alerts")
    for r in alerts():
        assert f"[`{r['alert']}`](#{r['alert'].lower()})" in table, r["alert"]
    assert "promql-parser" in docs.page("monitoring.md")


def test_every_alert_has_a_runbook_entry():
    page = docs.page("monitoring.md")
    runbook = docs.section(page, "Runbook")
    entries = set(re.findall(r"^#### (\w+)$", runbook, re.M))
    assert entries == {r["alert"] for r in alerts()}
    for name in entries:
        entry = docs.section(runbook, name)
        assert all(f"*{part}.*" in entry for part in ("Meaning", "Look", "Act")), name
