"""The FastAPI application: POST /mutate, /healthz, /readyz (metrics have their own plain-HTTP
port, see _https.py).

The review path reads the raw body itself (bounded in size, time and bytes held across
requests), so a malformed review is a one-line HTTP 400 and FastAPI's own validation
never runs. Parsing, the rewrite and the answer's encoding run on a worker thread (one per
size lane, see _capacity.py): the event loop stays free to accept connections, finish TLS
handshakes and answer /healthz while a review is being worked on, and complete reviews
beyond a fixed number in hand are refused at once with a 503 (the apiserver then applies
the webhook's failurePolicy) instead of waiting in a queue past the webhook's timeout.
Everything after parsing follows the failure mode: an internal error never becomes a 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from . import _review as admission
from .. import logs, metrics
from ._capacity import Capacity, Holding, Refused as _Refused
from ._review import BadReview, Review
from ..rewrite import EntrypointResolver, UnresolvedEntrypoint
from ..settings import Settings

log = logging.getLogger("initshift.server")

MUTATE_PATH = "/mutate"


T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """What the server answered, for the response, the log line and the metrics."""

    answer: dict
    outcome: str  # patched, allowed, denied, error
    reason: str
    pod_result: str | None = None  # rewritten, skipped, denied; None for non-pod requests


def _declared_length(request: Request, limit: int) -> int | None:
    """Content-Length, refused early when over the limit; None for a chunked body."""
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    try:
        size = int(declared)
    except ValueError:
        raise BadReview("invalid Content-Length") from None
    if size < 0:
        raise BadReview("invalid Content-Length")
    if size > limit:
        raise BadReview(f"body of {size} bytes is over the limit of {limit} bytes")
    return size


async def _read_body(request: Request, limit: int, timeout: float | None, held: Holding) -> bytes:
    """The body, refusing over `limit` while streaming (chunked) and after `timeout` seconds;
    each chunk is counted in `held` as it arrives."""
    chunks: list[bytes] = []
    total = 0

    async def read() -> None:
        nonlocal total
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise BadReview(f"body is over the limit of {limit} bytes")
            held.add_bytes(len(chunk))
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), timeout)
    except ClientDisconnect:
        raise BadReview("client disconnected before the body was complete") from None
    except asyncio.TimeoutError:
        raise _Refused(408, f"initshift: the body was not complete after {timeout:g} s "
                           f"(INITSHIFT_BODY_TIMEOUT_SECONDS)", close=True) from None
    return b"".join(chunks)


def _protected(settings: Settings) -> frozenset[str]:
    return frozenset((*admission.ALWAYS_PROTECTED, settings.server.namespace))


class Reviewer:
    """Turns a parsed review into a decision; holds the hooks the app was built with.

    `decide` runs the synchronous parts through `offload` (the app's worker thread) and
    only the registry lookups, which are I/O, on the event loop."""

    def __init__(self, settings: Settings, resolver: EntrypointResolver | None,
                 native_supported: Callable[[], bool | None]) -> None:
        # Imported here so the app module stays importable (and /healthz cheap) on its own.
        from ..rewrite import plan
        from ._patch import make_patch

        self.settings = settings
        self.resolver = resolver
        self.native_supported = native_supported
        self.protected = _protected(settings)
        self._make_plan, self._make_patch = plan, make_patch

    def start(self, body: bytes) -> tuple[Review, Answer | tuple[Any, list], bytes | None]:
        """On the worker thread, in one hop: parse (BadReview propagates), plan, and when no
        registry lookup is needed the whole decision and its encoded answer."""
        review = admission.parse_review(body)
        first = self._safe(review, self._plan, review)
        return review, first, _encode(first.answer) if isinstance(first, Answer) else None

    async def decide(self, review: Review, offload: Callable[..., Any] | None = None) -> Answer:
        run = offload or _inline
        return await self.complete(review, await run(self._safe, review, self._plan, review), run)

    async def complete(self, review: Review, first: Answer | tuple[Any, list], run: Callable[..., Any]) -> Answer:
        """The decision once the registry lookups `first` asks for are done (on the loop)."""
        if isinstance(first, Answer):
            return first
        plan, lookups = first
        try:
            images, lookup_error = await self._resolve(review, lookups)
        except Exception as e:  # noqa: BLE001 - the failure mode decides, never a 500
            return self._failed(review, e)
        return await run(self._safe, review, self._finish, review, plan, images, lookup_error)

    def _safe(self, review: Review, fn: Callable[..., T], *args: Any) -> T | Answer:
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - the failure mode decides, never a 500
            return self._failed(review, e)

    def _failed(self, review: Review, e: Exception) -> Answer:
        log.error("rewrite failed", exc_info=e, extra={"uid": review.uid})
        why = f"initshift: internal error, pod {'denied' if self._deny_on_error else 'left unchanged'}: " \
              f"{type(e).__name__}: {e}"
        if self._deny_on_error:
            return Answer(admission.response(review, denied=why, code=500), "error", "internal-error", "denied")
        return Answer(admission.response(review, warnings=[why]), "error", "internal-error", "skipped")

    @property
    def _deny_on_error(self) -> bool:
        return self.settings.server.failure_mode == "deny"

    def _plan(self, review: Review) -> Answer | tuple[Any, list]:
        """A decision without I/O, or the rewrite's plan and the image lookups it needs."""
        if not review.is_pod_create:
            return Answer(admission.response(review), "allowed", "not-pod-create")
        namespace = review.namespace or _meta(review.obj).get("namespace") or ""
        if namespace in self.protected:
            why = f"initshift: namespace {namespace!r} is never mutated"
            return Answer(admission.response(review, warnings=[why]), "allowed", "protected-namespace", "skipped")
        plan = self._make_plan(review.obj, self.settings, native_supported=self.native_supported())
        lookups = plan.lookups() if self.resolver is not None else []
        if not lookups:
            return self._finish(review, plan, None, None)
        return plan, lookups

    async def _resolve(self, review: Review, lookups: list) -> tuple[dict[str, Any] | None, str | None]:
        try:
            # The pod of a CREATE review often has no namespace: the request's decides.
            assert self.resolver is not None
            return await self.resolver.resolve(review.obj, lookups, namespace=review.namespace or None), None
        except UnresolvedEntrypoint as e:
            # Rewrite without the image: it denies or admits per on_unresolved, saying why.
            return None, str(e)

    def _finish(self, review: Review, plan: Any, images: dict[str, Any] | None,
                lookup_error: str | None) -> Answer:
        pod = review.obj
        result = plan.rewrite(images=images, lookup_error=lookup_error)
        warnings = list(result.warnings)
        if result.denied:
            answer = admission.response(review, denied=result.denied, warnings=warnings)
            return Answer(answer, "denied", result.reason or "denied", "denied")
        patch = self._make_patch(pod, result.pod) if result.pod is not pod else []
        if patch and result.changed:
            # "rewritten" would repeat the result: the reason says which strategy did it.
            reason = result.strategy if result.reason == "rewritten" and result.strategy else result.reason
            return Answer(admission.response(review, patch=patch, warnings=warnings), "patched",
                            reason or "rewritten", "rewritten")
        if not warnings:  # every pod left unchanged says why
            warnings = [f"initshift: pod left unchanged ({result.reason or 'nothing to do'})"]
        # Not rewritten: the patch, if any, only records the reason on the pod.
        return Answer(admission.response(review, patch=patch or None, warnings=warnings), "allowed",
                        result.reason or "unchanged", "skipped")


async def _inline(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


def _encode(answer: dict) -> bytes:
    return json.dumps(answer, separators=(",", ":")).encode()


def _meta(obj: Any) -> dict:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data, separators=(",", ":")).encode(), status, media_type="application/json",
                    headers=headers)


def create_app(settings: Settings, *, resolver: EntrypointResolver | None = None,
               native_supported: Callable[[], bool | None] = lambda: None,
               ready: Callable[[], bool] = lambda: True,
               strategy: Callable[[], str | None] = lambda: None) -> FastAPI:
    """The webhook application.

    `resolver`: registry lookups for steps without `command` (None: no lookups).
    `native_supported`: whether the cluster runs native sidecars (None: unknown).
    `ready`: the readiness condition (the server passes "a valid certificate is loaded").
    `strategy`: what `/readyz` reports as the strategy in use (filled by native detection).
    """
    app = FastAPI(title="initshift", docs_url=None, redoc_url=None, openapi_url=None)
    reviewer = Reviewer(settings, resolver, native_supported)
    srv = settings.server
    limit = srv.max_body_bytes
    capacity = Capacity(srv.max_pending_reviews, srv.max_large_reviews, srv.max_body_bytes_in_flight,
                        srv.large_review_bytes)
    app.state.reviewer = reviewer
    app.state.capacity = capacity

    def bad_request(body: bytes, error: Exception, elapsed: float, outcome: str) -> None:
        metrics.REQUESTS.labels(outcome).inc()
        metrics.LATENCY.observe(elapsed)
        logs.log_review(uid=admission.request_uid(body) if 0 < len(body) < 65536 else "", namespace="", name="",
                        kind="", operation="", decision=outcome, reason=str(error), dry_run=False,
                        duration=elapsed, level=logging.WARNING)

    @app.post(MUTATE_PATH)
    async def mutate(request: Request) -> Response:
        start = time.perf_counter()
        body = b""
        held = capacity.hold()
        try:
            admission.check_content_type(request.headers.get("content-type"))
            await held.wait_turn(_declared_length(request, limit), srv.body_timeout_seconds)
            body = await _read_body(request, limit, srv.body_timeout_seconds, held)
            offload = held.take_lane(len(body)).run  # in hand only once the body is complete
            review, first, payload = await offload(reviewer.start, body)
            if payload is None:  # registry lookups first (I/O, on the loop)
                decision = await reviewer.complete(review, first, offload)
                payload = await offload(_encode, decision.answer)
            else:
                decision = first
        except BadReview as e:
            bad_request(body, e, time.perf_counter() - start, "bad_request")
            return _json({"error": str(e)}, 400)
        except _Refused as e:
            bad_request(body, e, time.perf_counter() - start, "refused")
            headers = {"Connection": "close"} if e.close else {"Retry-After": "1"}
            return _json({"error": str(e)}, e.status, headers)
        finally:
            held.release()
        elapsed = time.perf_counter() - start
        metrics.REQUESTS.labels(decision.outcome).inc()
        metrics.LATENCY.observe(elapsed)
        if decision.pod_result:
            metrics.PODS.labels(decision.pod_result, decision.reason).inc()
        logs.log_review(uid=review.uid, namespace=review.namespace or _meta(review.obj).get("namespace") or "",
                        name=review.display_name, kind=review.kind, operation=review.operation,
                        decision=decision.outcome, reason=decision.reason, dry_run=review.dry_run, duration=elapsed)
        return Response(payload, media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        ok = ready()
        return _json({"status": "ok" if ok else "not ready", "certificate": ok, "strategy": strategy(),
                      "native_supported": native_supported()}, 200 if ok else 503)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Last line of defence: a bug outside the review path is logged, answered in one line.
        # The connection is closed after it (uvicorn drops it once the app raised): say so,
        # so an HTTP/1.1 client does not send its next request on it.
        log.error("unexpected error", exc_info=exc)
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, 500, headers={"Connection": "close"})

    return app
