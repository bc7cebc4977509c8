"""The operator-facing pages against the code: install starts with the image, every chart
value is in docs/install.md's values table, every exported series and every alert is in
docs/monitoring.md, and each alert has a runbook entry there."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.support import docs, kubectl_args, promql
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


# --- the docs' kubectl commands name objects the install has -----------------------------------

def _known_objects() -> set[tuple[str, str | None, str]]:
    """(kind, namespace or None, name) of everything an install renders, in every flavour, of
    what cert-manager creates from it (each Certificate's Secret), and of what the server
    creates itself (its certificate Secret, the watcher's Lease)."""
    from tests.support.deploy_render import NAMESPACE, helm, kustomize
    from webhook.settings import Settings

    out = set()
    for objects in (kustomize("."), kustomize("overlays/cert-manager"), kustomize(".", ["components/monitoring"]),
                    kustomize(".", ["components/pod-monitor"]), helm(), helm({"certificates": {"mode": "cert-manager"}})):
        for o in objects:
            out.add((o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]))
            if o["kind"] == "Certificate":
                out.add(("Secret", o["metadata"].get("namespace"), o["spec"]["secretName"]))
    s = Settings()
    out |= {("Secret", NAMESPACE, s.server.cert_secret), ("Lease", NAMESPACE, s.watcher.lease_name),
            ("Namespace", None, NAMESPACE)}
    return out


def test_every_kubectl_command_in_the_docs_names_what_exists():
    from tests.support.deploy_render import NAMESPACE

    known = _known_objects()
    found = [(p.name, c) for p in docs.pages() for c in kubectl_args.commands(p.read_text())]
    assert len(found) >= 20 and any("delete" in c for _, c in found)
    created = {n.name for _, c in found for n in kubectl_args.named(c) if n.verb == "create" and n.kind == "Namespace"}
    wrong = []
    for page, command in found:
        for n in kubectl_args.named(command):
            if n.verb == "create":
                continue
            if n.kind == "Namespace":
                ok = n.name in created or ("Namespace", None, n.name) in known
            elif n.kind in kubectl_args.CLUSTER_SCOPED:
                ok = (n.kind, None, n.name) in known
            elif n.namespace == NAMESPACE:
                ok = (n.kind, n.namespace, n.name) in known
            else:  # the reader's own namespace (builds) and the docs' example pod
                ok = n.namespace in created
            if not ok:
                wrong.append(f"{page}: `{command}` names {n.kind} {n.namespace or ''}/{n.name}, which no install has")
    assert wrong == []


def test_the_kubectl_grammar_catches_the_old_uninstall():
    old = kubectl_args.named("kubectl -n initshift-system delete secret initshift-tls lease initshift-watcher")
    assert [(n.kind, n.name) for n in old] == [("Secret", "initshift-tls"), ("Secret", "lease"),
                                                ("Secret", "initshift-watcher")]
    new = kubectl_args.named("kubectl -n initshift-system delete secret/initshift-tls lease/initshift-watcher")
    assert [(n.kind, n.namespace, n.name) for n in new] == [("Secret", "initshift-system", "initshift-tls"),
                                                           ("Lease", "initshift-system", "initshift-watcher")]
    assert [(n.kind, n.name) for n in kubectl_args.named("kubectl -n x rollout status deploy/initshift")] == \
        [("Deployment", "initshift")]
    assert kubectl_args.named("kubectl -n x port-forward svc/initshift 8443:443 &")[0].kind == "Service"
    assert kubectl_args.named("kubectl label namespace builds initshift.io/enabled-")[0].name == "builds"
    assert kubectl_args.named("kubectl delete -k my-initshift/") == []
    assert kubectl_args.named("kubectl drain node-1 --pod-selector app.kubernetes.io/name=initshift --timeout=60s") == []
    debug = kubectl_args.named("kubectl -n b debug fetch --copy-to=x --container=fetch -- sh -c 'ls /'")
    assert [(n.kind, n.namespace, n.name) for n in debug] == [("Pod", "b", "fetch")]
    with pytest.raises(kubectl_args.KubectlSyntaxError):
        kubectl_args.named("kubectl delete secret/a lease")
    with pytest.raises(kubectl_args.KubectlSyntaxError):
        kubectl_args.named("kubectl delete lese initshift-watcher")
    text = "```sh\nkubectl -n a get \\\n  pod x   # c\n```\nthen `kubectl delete ns a` and `helm list`\n"
    assert kubectl_args.commands(text) == ["kubectl -n a get pod x   # c", "kubectl delete ns a"]
