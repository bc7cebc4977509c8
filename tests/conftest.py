"""Fixtures shared by the test modules."""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from tests.support.kubedouble import KubeDouble


@pytest.fixture
async def kube(request: pytest.FixtureRequest) -> AsyncIterator[KubeDouble]:
    """A fresh in-process Kubernetes API double, stopped after the test. Its version is the
    double's default unless a test names one: `@pytest.mark.parametrize("kube", ["v1.34.9"],
    indirect=True)`."""
    version = getattr(request, "param", None)
    async with (KubeDouble(version=version) if version else KubeDouble()) as double:
        yield double
