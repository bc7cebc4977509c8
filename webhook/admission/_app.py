"""The FastAPI application: POST /mutate, /healthz, /readyz (metrics have their own plain-HTTP
port, see _https.py).

The review path reads the raw body itself (bounded), so a malformed review is a one-line
HTTP 400 and FastAPI's own validation never runs. The rewrite is pure and synchronous
and runs inline: it takes well under a millisecond and a thread hop would cost more.
Everything after parsing follows the failure mode: an internal error never becomes a 500.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from . import _review as admission
from .. import logs, metrics
from ._review import BadReview, Review
from ..rewrite import EntrypointResolver, UnresolvedEntrypoint
from ..settings import Settings

log = logging.getLogger("initshift.server")

MUTATE_PATH = "/mutate"


@dataclass(frozen=True)
class Decision:
    """What the server answered, for the response, the log line and the metrics."""

    answer: dict
    outcome: str  # patched, allowed, denied, error
    reason: str
    pod_result: str | None = None  # rewritten, skipped, denied; None for non-pod requests


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing early on Content-Length and again while streaming (chunked)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadReview("invalid Content-Length") from None
        if size > limit:
            raise BadReview(f"body of {size} bytes is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    total = 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise BadReview(f"body is over the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise BadReview("client disconnected before the body was complete") from None
    return b"".join(chunks)


def _protected(settings: Settings) -> frozenset[str]:
    return frozenset((*admission.ALWAYS_PROTECTED, settings.server.namespace))


class Reviewer:
    """Turns a parsed review into a decision; holds the hooks the app was built with."""

    def __init__(self, settings: Settings, resolver: EntrypointResolver | None,
                 native_supported: Callable[[], bool | None]) -> None:
        # Imported here so the app module stays importable (and /healthz cheap) on its own.
        from ..rewrite import plan
        from ._patch import make_patch

        self.settings = settings
        self.resolver = resolver
        self.native_supported = native_supported
        self.protected = _protected(settings)
        self._plan, self._make_patch = plan, make_patch

    async def decide(self, review: Review) -> Decision:
        if not review.is_pod_create:
            return Decision(admission.response(review), "allowed", "not-pod-create")
        namespace = review.namespace or _meta(review.obj).get("namespace") or ""
        if namespace in self.protected:
            why = f"initshift: namespace {namespace!r} is never mutated"
            return Decision(admission.response(review, warnings=[why]), "allowed", "protected-namespace", "skipped")
        try:
            return await self._rewrite_pod(review)
        except Exception as e:  # noqa: BLE001 - the failure mode decides, never a 500
            log.error("rewrite failed", exc_info=True, extra={"uid": review.uid})
            why = f"initshift: internal error, pod {'denied' if self._deny_on_error else 'left unchanged'}: " \
                  f"{type(e).__name__}: {e}"
            if self._deny_on_error:
                return Decision(admission.response(review, denied=why, code=500), "error", "internal-error", "denied")
            return Decision(admission.response(review, warnings=[why]), "error", "internal-error", "skipped")

    @property
    def _deny_on_error(self) -> bool:
        return self.settings.server.failure_mode == "deny"

    async def _rewrite_pod(self, review: Review) -> Decision:
        pod = review.obj
        plan = self._plan(pod, self.settings, native_supported=self.native_supported())
        images: dict[str, Any] | None = None
        lookup_error: str | None = None
        if self.resolver is not None:
            lookups = plan.lookups()
            if lookups:
                try:
                    # The pod of a CREATE review often has no namespace: the request's decides.
                    images = await self.resolver.resolve(pod, lookups, namespace=review.namespace or None)
                except UnresolvedEntrypoint as e:
                    # Rewrite without the image: it denies or admits per on_unresolved, saying why.
                    lookup_error = str(e)
        result = plan.rewrite(images=images, lookup_error=lookup_error)
        warnings = list(result.warnings)
        if result.denied:
            answer = admission.response(review, denied=result.denied, warnings=warnings)
            return Decision(answer, "denied", result.reason or "denied", "denied")
        patch = self._make_patch(pod, result.pod) if result.pod is not pod else []
        if patch and result.changed:
            # "rewritten" would repeat the result: the reason says which strategy did it.
            reason = result.strategy if result.reason == "rewritten" and result.strategy else result.reason
            return Decision(admission.response(review, patch=patch, warnings=warnings), "patched",
                            reason or "rewritten", "rewritten")
        if not warnings:  # every pod left unchanged says why
            warnings = [f"initshift: pod left unchanged ({result.reason or 'nothing to do'})"]
        # Not rewritten: the patch, if any, only records the reason on the pod.
        return Decision(admission.response(review, patch=patch or None, warnings=warnings), "allowed",
                        result.reason or "unchanged", "skipped")


def _meta(obj: Any) -> dict:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":")).encode(), status, media_type="application/json")


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
    limit = settings.server.max_body_bytes
    app.state.reviewer = reviewer

    @app.post(MUTATE_PATH)
    async def mutate(request: Request) -> Response:
        start = time.perf_counter()
        body = b""
        try:
            admission.check_content_type(request.headers.get("content-type"))
            body = await read_body(request, limit)
            review = admission.parse_review(body)
        except BadReview as e:
            elapsed = time.perf_counter() - start
            metrics.REQUESTS.labels("bad_request").inc()
            metrics.LATENCY.observe(elapsed)
            logs.log_review(uid=admission.request_uid(body) if len(body) < 65536 else "", namespace="", name="",
                            kind="", operation="", decision="bad_request", reason=str(e), dry_run=False,
                            duration=elapsed, level=logging.WARNING)
            return _json({"error": str(e)}, 400)
        decision = await reviewer.decide(review)
        elapsed = time.perf_counter() - start
        metrics.REQUESTS.labels(decision.outcome).inc()
        metrics.LATENCY.observe(elapsed)
        if decision.pod_result:
            metrics.PODS.labels(decision.pod_result, decision.reason).inc()
        logs.log_review(uid=review.uid, namespace=review.namespace or _meta(review.obj).get("namespace") or "",
                        name=review.display_name, kind=review.kind, operation=review.operation,
                        decision=decision.outcome, reason=decision.reason, dry_run=review.dry_run, duration=elapsed)
        return _json(decision.answer)

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
        log.error("unexpected error", exc_info=exc)
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, 500)

    return app
