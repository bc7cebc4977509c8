"""The shipped memory limits hold the server the default worker count starts (issue 24):
the Deployment (kustomize) and the chart (Helm) render a limit that holds two workers and
their supervisor by the budget `INITSHIFT_WORKERS=0` counts with, and a request no higher."""

from __future__ import annotations

import pytest

from tests.support.deploy_render import Rendered, helm, kustomize
from webhook.admission._workers import SUPERVISOR_BYTES, WORKER_BYTES, workers_for_memory
from webhook.rewrite._quantity import parse


@pytest.mark.parametrize("render", [lambda: kustomize("base"), lambda: helm()], ids=["kustomize", "helm"])
def test_the_default_memory_limit_holds_two_workers(render):
    res = Rendered(render()).container["resources"]
    limit, request = parse(res["limits"]["memory"], "memory"), parse(res["requests"]["memory"], "memory")
    assert workers_for_memory(limit) == 2
    assert limit >= SUPERVISOR_BYTES + 2 * WORKER_BYTES
    assert request <= limit
