"""The README's operator-facing parts against the code: install starts with the image,
every chart value is in the values table, every exported series and every alert is in
"Metrics and alerts", and the README stands on its own (no links out of the repository)."""

from __future__ import annotations

import re

import yaml

from tests.support import promql
from tests.support.deploy_render import CHART, DEPLOY, REPO

README = (REPO / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else None]


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


def test_readme_lists_every_chart_value():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    install = section("Install")
    rows = set(re.findall(r"^\| `([\w.]+)` \|", install[install.index("**Helm values**"):], re.M))
    assert rows == leaves(values)


def test_install_starts_with_building_and_pushing_the_image():
    install = section("Install")
    first = install[:install.index("1. **Apply.**")]
    assert "docker build" in first and "docker push" in first and "Nothing publishes" in first


def test_metrics_section_lists_every_series_and_alert():
    import webhook.admission._cluster  # noqa: F401
    import webhook.watcher._metrics  # noqa: F401
    from webhook.metrics import REGISTRY

    text = section("Metrics and alerts")
    families = {re.sub(r"_(total|bucket|count|sum)$", "", n) + ("_total" if n.endswith("_total") else "")
                for n in promql.exported(REGISTRY) if n.startswith("initshift_")}
    for name in families:
        assert f"`{name}`" in text, name
    rule = yaml.safe_load((DEPLOY / "components/monitoring/prometheusrule.yaml").read_text())
    for r in rule["spec"]["groups"][0]["rules"]:
        assert f"`{r['alert']}`" in text, r["alert"]
    assert "promql-parser" in text


def test_readme_stands_on_its_own():
    assert "../shared" not in README and "DESIGN.md" not in README
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (REPO / target).exists(), target
    assert (REPO / "docs" / "design.md").is_file()
