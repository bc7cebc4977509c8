"""The informer (client-go's reflector) against the API double, the backoff it retries with and
how its warnings repeat."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.clock import ManualClock
from tests.support.kubedouble import KubeDouble
from webhook.kube import Backoff, Informer
from webhook.logs import REPEAT_SECONDS, Repeats

BOUND = 20.0  # no single wait may take longer: a bug fails instead of hanging
SOURCE = "initshift"  # the Events' source.component the informer selects


def test_the_backoff_doubles_up_to_its_cap_with_jitter_and_resets() -> None:
    backoff = Backoff(0.2, cap=1.0)
    delays = [backoff.next() for _ in range(5)]
    assert all(0.8 * d <= got <= d for got, d in zip(delays, [0.2, 0.4, 0.8, 1.0, 1.0]))
    backoff.reset()
    assert backoff.next() <= 0.2


async def test_an_event_informer_resumes_from_now_after_a_410_never_re_listing(kube: KubeDouble) -> None:
    """The Events' watch has no bookmarks: after a compaction its resume point is gone (410).
    It resumes from the collection's resourceVersion now (one object listed, no selector); a
    failed attempt is retried; the watcher's next Event is seen; the field-selected list (every
    Event read from etcd) happens once, at the start."""
    api = kube.kube_api("informer")
    lists: list[int] = []
    seen: list[str] = []
    informer = Informer(api, "events", "ci", field_selector=f"source={SOURCE}", relist_on_gone=False,
                        on_list=lambda ns, items: lists.append(len(items)),
                        on_event=lambda kind, obj: seen.append(obj["metadata"]["name"]), backoff_initial=0.01)
    task = asyncio.ensure_future(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), BOUND)
        kube.put("configmaps", {"metadata": {"name": "churn", "namespace": "ci"}})
        kube.compact()
        compacted = kube.resource_version
        kube.fail_next("/api/v1/namespaces/ci/events", 503, method="GET", watch=False)  # the first resume fails
        kube.drop_watches(graceful=True)
        for _ in range(int(BOUND / 0.02)):
            if int(informer.resource_version or 0) >= compacted:
                break
            await asyncio.sleep(0.02)
        kube.put("events", {"metadata": {"name": "mine", "namespace": "ci"}, "source": {"component": SOURCE},
                            "involvedObject": {"kind": "Pod", "namespace": "ci", "name": "p", "uid": "u"}})
        for _ in range(int(BOUND / 0.02)):
            if seen:
                break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    assert seen == ["mine"] and lists == [0]
    queries = [r.query for r in kube.requests if r.path == "/api/v1/namespaces/ci/events" and "watch" not in r.query]
    assert [(q.get("fieldSelector"), q.get("limit")) for q in queries] == [
        (f"source={SOURCE}", "500"), (None, "1"), (None, "1")], queries


async def test_a_lasting_failure_is_logged_once_a_minute_and_counted_at_every_retry(
        kube: KubeDouble, caplog: pytest.LogCaptureFixture) -> None:
    """A list refused again and again (RBAC without the grant, an outage) is retried with
    backoff and counted each time, but its warning comes when it changes, not per retry."""
    api = kube.kube_api("informer")
    errors: list[int] = []
    kube.fail_next("/api/v1/namespaces/ci/pods", 403, times=6, method="GET", message='pods is forbidden')
    informer = Informer(api, "pods", "ci", on_list=lambda ns, items: None, on_event=lambda kind, obj: None,
                        on_error=lambda e: errors.append(e.status), backoff_initial=0.01)
    with caplog.at_level("WARNING", logger="initshift.informer"):
        task = asyncio.ensure_future(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), BOUND)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.close()
    assert errors == [403] * 6
    said = [r.getMessage() for r in caplog.records if r.name == "initshift.informer"]
    assert len(said) == 1 and said[0].endswith("403 Forbidden: pods is forbidden"), said


def test_repeats_says_a_warning_when_it_changes_and_the_same_one_once_a_minute() -> None:
    clock = ManualClock()
    repeats = Repeats(clock=clock.monotonic)
    assert [repeats.new("a"), repeats.new("a"), repeats.new("b"), repeats.new("a")] == [True, False, True, True]
    clock.advance(REPEAT_SECONDS - 1)
    assert not repeats.new("a")
    clock.advance(1)
    assert repeats.new("a") and not repeats.new("a")
