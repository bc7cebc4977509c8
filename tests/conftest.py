"""Fixtures shared by the test modules."""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from tests.support.kubedouble import KubeDouble


@pytest.fixture
async def kube() -> AsyncIterator[KubeDouble]:
    """A fresh in-process Kubernetes API double, stopped after the test."""
    async with KubeDouble() as double:
        yield double
