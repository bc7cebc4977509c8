"""Validation of emitted pods: the real Kubernetes OpenAPI schemas (kubernetes-validate,
strict: unknown fields fail) for the oldest supported and the newest version, plus the
apiserver rules the schema does not express (webhook.podcheck)."""

from __future__ import annotations

import kubernetes_validate

from webhook.rewrite._podcheck import pod_problems

OLDEST = "1.28.0"
NEWEST = kubernetes_validate.latest_version()
VERSIONS = (OLDEST, NEWEST)


def assert_valid_pod(pod: dict, versions: tuple[str, ...] = VERSIONS) -> None:
    for version in versions:
        kubernetes_validate.validate(pod, version, strict=True)
    problems = pod_problems(pod)
    assert not problems, problems
