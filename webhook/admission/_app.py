"""The webhook application: POST /mutate, /healthz, /readyz (metrics have their own plain-HTTP
port, see _https.py).

POST /mutate is a plain ASGI handler in front of FastAPI (`_WebhookApp`): it is what every
pod creation in an opted-in namespace waits for, and FastAPI's middleware stack, routing
and request objects cost more than the rest of a small review. FastAPI serves every other
route (and answers 405 for other methods on /mutate).

The review path reads the raw body itself (bounded in size, time and bytes held across
requests), so a malformed review is a one-line HTTP 400 and FastAPI's own validation
never runs. A review of up to INLINE_MAX_BYTES (an ordinary pod, a few hundred
microseconds of work) is parsed, rewritten and encoded on the event loop; a bigger one on
a worker thread (one per size lane, see _capacity.py), so the loop stays free to accept
connections, finish TLS handshakes and answer /healthz while it is worked on; after
registry lookups (I/O, on the loop) the rest of a review always runs on its lane's thread.
Complete reviews beyond a fixed number in hand are refused at once with a 503 (the
apiserver then applies the webhook's failurePolicy) instead of waiting in a queue past the
webhook's timeout. Everything after parsing follows the failure mode: an internal error
never becomes a 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from . import _review as admission
from .. import jsontext, logs, metrics
from ._capacity import Capacity, Holding, Refused as _Refused
from ._review import BadReview, Review
from ..rewrite import EntrypointResolver, UnresolvedEntrypoint
from ..settings import Settings

log = logging.getLogger("initshift.server")

MUTATE_PATH = "/mutate"
# Reviews up to this size are worked on the event loop (the 7-step kpack pod with istio-proxy
# is 12 KB, about 0.3 ms); bigger ones on the worker thread (see the module docstring).
INLINE_MAX_BYTES = 64 * 1024


T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """What the server answered, for the response, the log line and the metrics."""

    answer: dict
    outcome: str  # patched, allowed, denied, error
    reason: str
    pod_result: str | None = None  # rewritten, skipped, denied; None for non-pod requests


def _declared_length(declared: bytes | None, limit: int) -> int | None:
    """Content-Length, refused early when over the limit; None for a chunked body."""
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


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header `name` (lower case, as ASGI servers give them)."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


async def _read_body(receive: Receive, limit: int, timeout: float | None, held: Holding) -> bytes:
    """The body, refusing over `limit` while streaming (chunked) and after `timeout` seconds;
    each chunk is counted in `held` as it arrives. A body already complete when the review
    starts (the usual case) is one message."""
    chunks: list[bytes] = []
    total = 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                message = await receive()
                if message["type"] != "http.request":  # http.disconnect
                    raise BadReview("client disconnected before the body was complete")
                chunk = message.get("body", b"")
                total += len(chunk)
                if total > limit:
                    raise BadReview(f"body is over the limit of {limit} bytes")
                held.add_bytes(len(chunk))
                if not message.get("more_body", False):
                    return chunk if not chunks else b"".join((*chunks, chunk))
                chunks.append(chunk)
    except TimeoutError:
        raise _Refused(408, f"initshift: the body was not complete after {timeout:g} s "
                            f"(INITSHIFT_BODY_TIMEOUT_SECONDS)", close=True) from None


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
        self.large_bytes = settings.server.large_review_bytes
        self._make_plan, self._make_patch = plan, make_patch

    def start(self, body: bytes) -> tuple[Review, Answer | tuple[Any, list], bytes | None]:
        """On the worker thread, in one hop: parse (BadReview propagates), plan, and when no
        registry lookup is needed the whole decision and its encoded answer."""
        review = admission.parse_review(body, yielding=len(body) > self.large_bytes)
        first = self._safe(review, self._plan, review)
        return review, first, jsontext.dumps(first.answer) if isinstance(first, Answer) else None

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


def _meta(obj: Any) -> dict:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(jsontext.dumps(data), status, media_type="application/json", headers=headers)


_Headers = tuple[tuple[bytes, bytes], ...]


class _Mutate:
    """POST /mutate as a plain ASGI application: the request's headers straight from the
    scope, the body from `receive`, the answer in two `send`s (see the module docstring)."""

    def __init__(self, settings: Settings, reviewer: Reviewer, capacity: Capacity) -> None:
        self.reviewer, self.capacity = reviewer, capacity
        self.limit = settings.server.max_body_bytes
        self.body_timeout = settings.server.body_timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            status, payload, headers = await self.answer(scope, receive)
        except Exception as exc:  # noqa: BLE001 - last line of defence, as FastAPI's handler below
            log.error("unexpected error", exc_info=exc)
            status, payload = 500, jsontext.dumps({"error": f"internal error: {type(exc).__name__}"})
            headers = ((b"connection", b"close"),)  # an HTTP/1.1 client must not reuse it
        await send({"type": "http.response.start", "status": status, "headers": [
            *headers, (b"content-length", b"%d" % len(payload)), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})

    async def answer(self, scope: Scope, receive: Receive) -> tuple[int, bytes, _Headers]:
        start = time.perf_counter()
        body = b""
        held = self.capacity.hold()
        reviewer = self.reviewer
        try:
            content_type = _header(scope, b"content-type")
            admission.check_content_type(None if content_type is None else content_type.decode("latin-1"))
            await held.wait_turn(_declared_length(_header(scope, b"content-length"), self.limit), self.body_timeout)
            body = await _read_body(receive, self.limit, self.body_timeout, held)
            offload = held.take_lane(len(body)).run  # in hand only once the body is complete
            inline = len(body) <= INLINE_MAX_BYTES
            review, first, payload = reviewer.start(body) if inline else await offload(reviewer.start, body)
            if payload is None:  # registry lookups first (I/O, on the loop), the rest on the lane's thread
                decision = await reviewer.complete(review, first, offload)
                encode = jsontext.dumps
                payload = encode(decision.answer) if inline else await offload(encode, decision.answer)
            else:
                decision = first
        except BadReview as e:
            _bad_request(body, e, time.perf_counter() - start, "bad_request")
            return 400, jsontext.dumps({"error": str(e)}), ()
        except _Refused as e:
            _bad_request(body, e, time.perf_counter() - start, "refused")
            headers = ((b"connection", b"close"),) if e.close else ((b"retry-after", b"1"),)
            return e.status, jsontext.dumps({"error": str(e)}), headers
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
        return 200, payload, ()


def _bad_request(body: bytes, error: Exception, elapsed: float, outcome: str) -> None:
    metrics.REQUESTS.labels(outcome).inc()
    metrics.LATENCY.observe(elapsed)
    logs.log_review(uid=admission.request_uid(body) if 0 < len(body) < 65536 else "", namespace="", name="",
                    kind="", operation="", decision=outcome, reason=str(error), dry_run=False,
                    duration=elapsed, level=logging.WARNING)


class _WebhookApp(FastAPI):
    """FastAPI, with POST /mutate answered before its middleware and routing."""

    mutate: _Mutate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == MUTATE_PATH and scope["method"] == "POST":
            await self.mutate(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


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
    app = _WebhookApp(title="initshift", docs_url=None, redoc_url=None, openapi_url=None)
    reviewer = Reviewer(settings, resolver, native_supported)
    srv = settings.server
    capacity = Capacity(srv.max_pending_reviews, srv.max_large_reviews, srv.max_body_bytes_in_flight,
                        srv.large_review_bytes)
    app.mutate = _Mutate(settings, reviewer, capacity)
    app.state.reviewer = reviewer
    app.state.capacity = capacity
    # The route as FastAPI knows it: other methods get its 405, and it lists /mutate.
    app.router.routes.append(Route(MUTATE_PATH, app.mutate, methods=["POST"]))

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
