"""Fixtures shared by the test modules."""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from tests.support.kubedouble import SYSTEM_NAMESPACES, KubeDouble
from webhook.settings import ServerSettings


@pytest.fixture
async def kube(request: pytest.FixtureRequest) -> AsyncIterator[KubeDouble]:
    """A fresh in-process Kubernetes API double, stopped after the test: a new cluster's
    namespaces and initshift's own (as the install makes it). Its version is the double's
    default unless a test names one: `@pytest.mark.parametrize("kube", ["v1.34.9"],
    indirect=True)`."""
    version = getattr(request, "param", None)
    namespaces = (*SYSTEM_NAMESPACES, ServerSettings().namespace)
    async with KubeDouble(namespaces=namespaces, **({"version": version} if version else {})) as double:
        yield double
