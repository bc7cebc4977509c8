"""One server process per pod: the Deployment (kustomize) and the chart (Helm) render the
same resources, the limit the sizing in docs/admission-server.md derives, and no
INITSHIFT_WORKERS (the in-pod supervisor is gone). The limit itself is tested where it
matters: tests/admission/test_server_attacks.py runs every attack inside it."""

from __future__ import annotations

import re

import pytest

from tests.support import docs
from tests.support.deploy_render import Rendered, helm, kustomize
from webhook.rewrite._quantity import parse


@pytest.mark.parametrize("render", [lambda: kustomize("base"), lambda: helm()], ids=["kustomize", "helm"])
def test_the_default_resources_are_the_documented_ones(render):
    rendered = Rendered(render())
    res = rendered.container["resources"]
    limit, request = parse(res["limits"]["memory"], "memory"), parse(res["requests"]["memory"], "memory")
    assert request <= limit
    assert "INITSHIFT_WORKERS" not in rendered.plain_env()
    page = docs.page("admission-server.md")
    stated = re.search(r"memory limit of (\d+)Mi", page)
    assert stated and limit == int(stated.group(1)) * 1024 * 1024, "docs/admission-server.md#sizing states the limit"
    assert f"request {res['requests']['cpu']} of CPU" in page and f"{res['requests']['memory']} of memory" in page


def test_kustomize_and_helm_agree():
    assert Rendered(kustomize("base")).container["resources"] == Rendered(helm()).container["resources"]
