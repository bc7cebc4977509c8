"""The webhook application: POST /mutate, /healthz, /readyz (metrics: _https.py).

POST /mutate is a plain ASGI handler in front of FastAPI (whose middleware and routing
cost more than a small review) that reads the raw body itself: a malformed review is a
one-line 400. Memory is bounded by how reviews are taken (docs/admission-server.md): a
review up to INLINE_MAX_BYTES is read, parsed, rewritten and encoded on the event loop
without a pause, so one is in the works at a time; a larger one waits for the
large turn with its body unread (uvicorn reads no more than 64 KiB of a body the app does
not ask for), then is read and worked on the turn's thread, the cyclic collector paused,
while the loop serves. A client that leaves gives its turn back. Everything after parsing follows the failure mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from . import _review as admission
from .. import jsontext, logs, metrics
from ._patch import make_patch
from ._review import BadReview, Review
from ..errors import InitshiftError
from ..rewrite import EntrypointResolver, Reason, UnresolvedEntrypoint, plan
from ..settings import Settings

if TYPE_CHECKING:
    from ._guards import Connection
    from ..kube import LimitRanges, Namespaces, NamespaceView, ResourceQuotas

log = logging.getLogger("initshift.server")

MUTATE_PATH = "/mutate"
INLINE_MAX_BYTES = 64 * 1024  # reviews up to this size are worked on the event loop

T = TypeVar("T")


class Refused(InitshiftError):
    """A request the server will not take now: HTTP `status`, a one-line message; `close`:
    the body was not read to its end, so the connection cannot be reused."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.close = status, close


class ClientGone(InitshiftError):
    """The client left before its answer: nothing is sent, the work stops."""


@dataclass(frozen=True)
class Answer:
    """What the server answered, for the response, the log line and the metrics."""

    answer: dict
    outcome: str  # patched, allowed, denied, error
    reason: str
    pod_result: str | None = None  # rewritten, skipped, denied; None for non-pod requests


def _never() -> bool:
    return False


async def _inline(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


def _check(gone: Callable[[], bool]) -> None:
    if gone():
        raise ClientGone("the client left while its review was worked on")


class Reviewer:
    """A review's body to its decision (`decide`). `limit_ranges`, `quotas`, `namespaces`:
    the cluster's views (None: no API access, none are read)."""

    def __init__(self, settings: Settings, resolver: EntrypointResolver | None,
                 native_supported: Callable[[], bool | None], limit_ranges: "LimitRanges | None" = None,
                 quotas: "ResourceQuotas | None" = None, namespaces: "Namespaces | None" = None) -> None:
        self.settings, self.resolver, self.native_supported = settings, resolver, native_supported
        self.views: tuple["NamespaceView | None", ...] = (limit_ranges, quotas, namespaces)

    def parse(self, body: bytes) -> Review:
        """The body as a review (BadReview propagates); a large one builds its objects in
        Python, so the thread parsing it hands the GIL to the loop."""
        return admission.parse_review(body, yielding=len(body) > INLINE_MAX_BYTES)

    async def decide(self, body: bytes, run: Callable[..., Any] = _inline,
                     gone: Callable[[], bool] = _never) -> tuple[Review, Answer]:
        """The review and its decision. The steps without I/O go through `run` (the loop,
        or the large turn's thread); registry lookups and live lists of the namespace's
        objects run on the loop, beside each other, only when the plan needs them. `gone`
        is asked between steps: once true, ClientGone."""
        review = await run(self.parse, body)
        first = await run(self._safe, review, self._plan, review)
        _check(gone)
        if isinstance(first, Answer):
            return review, first
        pod_plan, lookups = first
        # The views the plan reads (LimitRanges, quotas, the Namespace); None: only a live
        # list can say (it never raises).
        reads = (pod_plan.reads_namespace_limits, pod_plan.reads_namespace_limits, pod_plan.reads_namespace)
        known: list[Any] = [[] if view is None or not read else view.known(review.pod_namespace)
                            for view, read in zip(self.views, reads)]
        listings = [None if objs is not None else asyncio.ensure_future(view.lookup(review.pod_namespace))
                    for objs, view in zip(known, self.views)]
        images, lookup_error = None, None
        try:
            if lookups:
                # The pod of a CREATE review often has no namespace: the request's decides.
                images = await self.resolver.resolve(review.obj, lookups, namespace=review.namespace or None)  # type: ignore[union-attr]
        except UnresolvedEntrypoint as e:
            lookup_error = str(e)  # the rewrite denies or admits per on_unresolved, saying why
        except Exception as e:  # noqa: BLE001 - the failure mode decides, never a 500
            return review, self._failed(review, e)  # (a live list still running ends on its own, cached)
        known = [objs if listing is None else await listing for objs, listing in zip(known, listings)]
        _check(gone)
        return review, await run(self._safe, review, self._finish, review, pod_plan, images, lookup_error, *known)

    def _safe(self, review: Review, fn: Callable[..., T], *args: Any) -> T | Answer:
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - the failure mode decides, never a 500
            return self._failed(review, e)

    def _failed(self, review: Review, e: Exception) -> Answer:
        log.error("rewrite failed", exc_info=e, extra={"uid": review.uid})
        deny = self.settings.server.failure_mode == "deny"
        why = f"initshift: internal error, pod {'denied' if deny else 'left unchanged'}: {type(e).__name__}: {e}"
        if deny:
            return Answer(admission.response(review, denied=why, code=500), "error", "internal-error", "denied")
        return Answer(admission.response(review, warnings=[why]), "error", "internal-error", "skipped")

    def _plan(self, review: Review) -> Answer | tuple[Any, list]:
        """A decision without the rewrite, or the rewrite's plan and the image lookups it needs."""
        if not review.is_pod_create:
            return Answer(admission.response(review), "allowed", "not-pod-create")
        why = admission.protected(review.pod_namespace, self.settings.server.namespace)
        if why:
            return Answer(admission.response(review, warnings=[why]), "allowed", "protected-namespace", "skipped")
        pod_plan = plan(review.obj, self.settings, native_supported=self.native_supported())
        return pod_plan, (pod_plan.lookups() if self.resolver is not None else [])

    def _finish(self, review: Review, pod_plan: Any, images: dict[str, Any] | None, lookup_error: str | None,
                limit_ranges: Sequence[Mapping], quotas: Sequence[Mapping], namespaces: Sequence[Mapping]) -> Answer:
        pod = review.obj
        result = pod_plan.rewrite(images=images, lookup_error=lookup_error, limit_ranges=limit_ranges, quotas=quotas,
                                  namespace=namespaces[0] if namespaces else None)
        warnings = list(result.warnings)
        if result.denied:
            answer = admission.response(review, denied=result.denied, warnings=warnings)
            return Answer(answer, "denied", result.reason or "denied", "denied")
        patch = make_patch(pod, result.pod) if result.pod is not pod else []
        if patch and result.changed:
            # "rewritten" would repeat the result: the reason says which strategy did it.
            reason = result.strategy if result.reason == Reason.REWRITTEN and result.strategy else result.reason
            return Answer(admission.response(review, patch=patch, warnings=warnings), "patched",
                          reason or Reason.REWRITTEN, "rewritten")
        if not warnings:  # every pod left unchanged says why
            warnings = [f"initshift: pod left unchanged ({result.reason or 'nothing to do'})"]
        # Not rewritten: the patch, if any, only records the reason on the pod.
        return Answer(admission.response(review, patch=patch or None, warnings=warnings), "allowed",
                      result.reason or Reason.UNCHANGED, "skipped")


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header `name` (lower case, as ASGI servers give them)."""
    return next((value for key, value in scope["headers"] if key == name), None)


class _Mutate:
    """POST /mutate as a plain ASGI application (see the module docstring). `conn`: the
    front door's connection (_guards.py), told when the review is worked on; its `closed`
    says when the client left."""

    def __init__(self, settings: Settings, reviewer: Reviewer) -> None:
        self.reviewer = reviewer
        self.limit, self.body_timeout = settings.server.max_body_bytes, settings.server.body_timeout_seconds
        self.turn = asyncio.Lock()  # large reviews: one at a time per process
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="initshift-review")

    async def __call__(self, scope: Scope, receive: Receive, send: Send, conn: "Connection | None" = None) -> None:
        start = time.perf_counter()
        body, review, headers = b"", None, ()
        try:
            admission.check_content_type(_header(scope, b"content-type"))
            # h11 has checked it is a number; the front door takes no body without one (_guards.py).
            size = int(_header(scope, b"content-length") or 0)
            if size > self.limit:
                raise Refused(413, f"body of {size} bytes is over the limit of {self.limit} bytes "
                                   f"(INITSHIFT_MAX_BODY_BYTES)", close=True)
            if size <= INLINE_MAX_BYTES:
                body = await self._read(receive, conn)
                review, decision = await self.reviewer.decide(body)
                status, payload = 200, jsontext.dumps(decision.answer)
            else:
                review, decision, payload = await self._large(receive, conn)
                status = 200
            outcome, why = decision.outcome, decision.reason
        except BadReview as e:
            status, payload, outcome, why = 400, jsontext.dumps({"error": str(e)}), "bad_request", str(e)
        except Refused as e:
            status, payload, outcome, why = e.status, jsontext.dumps({"error": str(e)}), "refused", str(e)
            headers = ((b"connection", b"close"),) if e.close else ()
        except ClientGone as e:
            _record(start, "gone", str(e), body)
            return  # nobody to answer
        except Exception as exc:  # noqa: BLE001 - last line of defence, as FastAPI's handler below
            log.error("unexpected error", exc_info=exc)
            status, payload = 500, jsontext.dumps({"error": f"internal error: {type(exc).__name__}"})
            headers = ((b"connection", b"close"),)  # an HTTP/1.1 client must not reuse it
        else:
            if decision.pod_result:
                metrics.PODS.labels(decision.pod_result, decision.reason).inc()
        if status != 500:
            _record(start, outcome, why, body, review)
        await send({"type": "http.response.start", "status": status, "headers": [
            *headers, (b"content-length", b"%d" % len(payload)), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})

    async def _read(self, receive: Receive, conn: "Connection | None", started: float | None = None) -> bytes:
        """The body, its Content-Length's bytes (within the limit: checked before), within
        INITSHIFT_BODY_TIMEOUT_SECONDS of `started` (default: now); one message when it is
        complete already (the usual case). The connection is then being worked on: never
        evicted."""
        loop = asyncio.get_running_loop()
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout_at((started or loop.time()) + self.body_timeout):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":  # http.disconnect
                        raise ClientGone("the client left before its body was complete")
                    chunks.append(message.get("body", b""))
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise Refused(408, f"initshift: the body was not complete after {self.body_timeout:g} s "
                               f"(INITSHIFT_BODY_TIMEOUT_SECONDS)", close=True) from None
        if conn is not None:
            conn.working()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _large(self, receive: Receive, conn: "Connection | None") -> tuple[Review, Answer, bytes]:
        """One large review: the turn, the body, then the work on the turn's thread."""
        started = asyncio.get_running_loop().time()
        await self._take_turn(conn)
        try:
            body = await self._read(receive, conn, started)
            # The body is complete: from here `receive` returns only when the client leaves.
            left = threading.Event()
            watch = asyncio.get_running_loop().create_task(_watch(receive, left))
            try:
                with _collector_paused():
                    review, decision = await self.reviewer.decide(body, self._run, left.is_set)
                    payload = await self._run(jsontext.dumps, decision.answer)
                    review = review.without_pod()  # its objects freed before collection resumes
                return review, decision, payload
            finally:
                watch.cancel()
        finally:
            self.turn.release()

    async def _take_turn(self, conn: "Connection | None") -> None:
        """The large turn within the body timeout (else 503), unless the client leaves first."""
        got = asyncio.ensure_future(self.turn.acquire())
        left = asyncio.ensure_future(conn.closed.wait() if conn is not None else asyncio.Event().wait())
        try:
            await asyncio.wait((got, left), timeout=self.body_timeout, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: a turn got meanwhile is given back
            if not got.cancel() and not got.cancelled():
                self.turn.release()
            raise
        finally:
            left.cancel()
        if got.done():
            return
        got.cancel()
        if conn is not None and conn.closed.is_set():
            raise ClientGone("the client left while its review waited for its turn")
        raise Refused(503, f"initshift: busy: a large review is being worked on in this server process; "
                           f"retry (waited {self.body_timeout:g} s)", close=True)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a large review is worked on.

    A large review is about a million objects, none in a cycle (a JSON tree and its rewrite:
    reference counting frees them). Each full collection the review's allocations set off
    walks all of them holding the interpreter lock, 10 to 50 ms each, several per review, and
    the event loop's small reviews wait behind every one. One large review is worked on at a
    time (the turn), so the pause is as long as one review's work; collection resumes after,
    over what is left."""
    paused = gc.isenabled()  # not when something else has turned it off: that one turns it on
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


async def _watch(receive: Receive, left: threading.Event) -> None:
    if (await receive())["type"] == "http.disconnect":
        left.set()


def _record(start: float, outcome: str, reason: str, body: bytes, review: Review | None = None) -> None:
    """The review's metrics and its log line (a warning for one refused before a decision)."""
    elapsed = time.perf_counter() - start
    metrics.REQUESTS.labels(outcome).inc()
    metrics.LATENCY.observe(elapsed)
    if review is None:
        logs.log_review(uid=admission.request_uid(body) if 0 < len(body) < 65536 else "", namespace="", name="",
                        kind="", operation="", decision=outcome, reason=reason, dry_run=False, duration=elapsed,
                        level=logging.WARNING)
    else:
        logs.log_review(uid=review.uid, namespace=review.pod_namespace, name=review.display_name, kind=review.kind,
                        operation=review.operation, decision=outcome, reason=reason, dry_run=review.dry_run,
                        duration=elapsed)


class _WebhookApp(FastAPI):
    """FastAPI, with POST /mutate answered before its middleware and routing."""

    mutate: _Mutate

    async def __call__(self, scope: Scope, receive: Receive, send: Send, conn: "Connection | None" = None) -> None:
        if scope["type"] == "http" and scope["path"] == MUTATE_PATH and scope["method"] == "POST":
            await self.mutate(scope, receive, send, conn)
        else:
            if conn is not None:
                conn.working()  # /healthz, /readyz: no body to wait for
            await super().__call__(scope, receive, send)


def create_app(settings: Settings, *, resolver: EntrypointResolver | None = None,
               native_supported: Callable[[], bool | None] = lambda: None,
               limit_ranges: "LimitRanges | None" = None, quotas: "ResourceQuotas | None" = None,
               namespaces: "Namespaces | None" = None, ready: Callable[[], bool] = lambda: True,
               strategy: Callable[[], str | None] = lambda: None) -> FastAPI:
    """The webhook application.

    `resolver`: registry lookups for steps without `command` (None: no lookups).
    `native_supported`: whether the cluster runs native sidecars (None: unknown).
    `limit_ranges`, `quotas`, `namespaces`: the cluster's LimitRanges and ResourceQuotas the
    rewrite respects, and its Namespaces' mesh labels (None: not read).
    `ready`: the readiness condition (the server passes "a valid certificate is loaded").
    `strategy`: what `/readyz` reports as the strategy in use (filled by native detection).
    """
    app = _WebhookApp(title="initshift", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.reviewer = Reviewer(settings, resolver, native_supported, limit_ranges, quotas, namespaces)
    app.mutate = _Mutate(settings, app.state.reviewer)
    # The route as FastAPI knows it: other methods get its 405, and it lists /mutate.
    app.router.routes.append(Route(MUTATE_PATH, app.mutate, methods=["POST"]))

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @app.get("/readyz")
    async def readyz() -> Response:
        ok = ready()
        return Response(jsontext.dumps({"status": "ok" if ok else "not ready", "certificate": ok,
                                        "strategy": strategy(), "native_supported": native_supported()}),
                         200 if ok else 503, media_type="application/json")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Last line of defence: a bug outside the review path is logged, answered in one line.
        # The connection is closed after it (uvicorn drops it once the app raised): say so,
        # so an HTTP/1.1 client does not send its next request on it.
        log.error("unexpected error", exc_info=exc)
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, 500, headers={"Connection": "close"})

    return app
