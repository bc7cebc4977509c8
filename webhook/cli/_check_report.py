"""`initshift check`'s vocabulary: what is checked (`Target`), a line of the report (`Line`),
and label selectors as the apiserver evaluates them (`selects`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..settings import Settings


@dataclass
class Line:
    """One line of the report: ✔ or ✘, a title, and for a failure the hint to act on."""

    section: str
    ok: bool
    title: str
    hint: str = ""
    data: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"section": self.section, "ok": self.ok, "title": self.title, "hint": self.hint, **self.data}


@dataclass(frozen=True)
class Target:
    """What is checked: initshift's names in the cluster."""

    namespace: str
    webhook_config: str
    service_account: str
    lease: str
    service_url: str | None = None  # connect here instead of the configuration's address

    @property
    def deployment(self) -> str:
        return self.service_account  # deploy/ and the chart name the Deployment like the Service too

    @classmethod
    def defaults(cls, namespace: str | None = None) -> "Target":
        s = Settings()
        # deploy/ names the ServiceAccount like the Service.
        return cls(namespace or s.server.namespace, s.server.webhook_config, s.server.service_name,
                   s.watcher.lease_name)


Report = Callable[[Line], None]


def selects(selector: dict | None, labels: dict) -> bool:
    """A metav1.LabelSelector against labels (an empty selector selects everything)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True
