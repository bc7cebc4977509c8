"""Shared by the server tests and the admission benchmark: certificates in a directory,
a real uvicorn HTTPS server on a free loopback port, and AdmissionReviews."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from webhook.admission import _certs as manage
from certs import rotation, store
from tests.support.fixtures import pods
from webhook.admission._https import HttpsServer, bind
from webhook.cli._review import wrap
from webhook.settings import ServerSettings, Settings

LOOPBACK = rotation.Wanted(("localhost",), ("127.0.0.1",))
T = TypeVar("T")


def make_certs(directory: Path) -> Path:
    """CA + serving pair for 127.0.0.1 in `directory`; returns the CA file."""
    manage.ensure_local_certificates(directory, LOOPBACK)
    return directory / store.CA_CERT


def ipv6_loopback() -> bool:
    """Whether this machine can listen on ::1 (a container without IPv6 cannot)."""
    try:
        bind("::1").close()
    except OSError:
        return False
    return True


def settings_for(directory: Path, **server: Any) -> Settings:
    srv = ServerSettings(tls_cert=str(directory / store.TLS_CERT), tls_key=str(directory / store.TLS_KEY),
                         host="127.0.0.1", port=0, metrics_port=0)  # metrics off unless a test asks
    return Settings(feature_gate=True, server=dataclasses.replace(srv, **server))


def client_context(ca: Path | str, *, cert: tuple[str, str] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert:
        ctx.load_cert_chain(*cert)
    return ctx


@contextlib.contextmanager
def running(settings: Settings, *, sock: socket.socket | None = None, **kwargs: Any) -> Iterator[HttpsServer]:
    """A real server in a thread, on `sock` (default: a free 127.0.0.1 port), stopped on
    exit. One that stopped on its own before the test ended (an error, uvicorn returning)
    fails the test, saying so: a test that then met a dead socket would say nothing of why."""
    server = HttpsServer(settings, sock=sock or bind(), reload_interval=0.1, graceful_seconds=2, **kwargs)
    errors: list[BaseException] = []
    thread = start_in_thread(server, errors=errors)
    try:
        yield server
    finally:
        # uvicorn's should_exit: the test stopped it (or a companion's failure did, in errors).
        early = not thread.is_alive() and not server.uvicorn.should_exit
        server.stop()
        thread.join(30)
        if thread.is_alive():
            raise AssertionError("the server did not stop within 30 s of being told to")
        server.sock.close()
        if errors:
            raise AssertionError(f"the server stopped with {errors[0]!r}") from errors[0]
        if early:
            raise AssertionError("the server stopped before the test ended (uvicorn returned)")


def start_in_thread(server: HttpsServer, timeout: float = 60.0,
                    errors: list[BaseException] | None = None) -> threading.Thread:
    """`server.run()` in a daemon thread, once uvicorn serves; the error it stopped with if
    not. `errors` receives the error the server stops with later."""
    errors = [] if errors is None else errors

    def target() -> None:
        try:
            server.run()
        except BaseException as e:  # noqa: BLE001 - surfaced by the caller
            errors.append(e)

    thread = threading.Thread(target=target, name="initshift-https", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.uvicorn.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.uvicorn.started:
        server.stop()
        thread.join(10)
        if errors:
            raise errors[0]
        raise RuntimeError("server did not start")
    return thread


def on_loop(server: HttpsServer, fn: Callable[[], T]) -> T:
    """`fn()` run on the server's event loop, between its callbacks. For gc.get_objects():
    called from another thread it can take a tuple the server's thread is still building
    from a generator, whose next resize then fails with SystemError (CPython gh-39117,
    gh-107137): a test that counted objects so stopped the server it measured."""
    async def call() -> T:
        return fn()
    loop = server.uvicorn.servers[0].get_loop()
    return asyncio.run_coroutine_threadsafe(call(), loop).result(60)


def wait_until(condition: Any, seconds: float, what: str) -> None:
    """Polls `condition` until true; fails naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def base_url(server: HttpsServer) -> str:
    return f"https://127.0.0.1:{server.port}"


def kpack_istio() -> dict:
    return pods.inject_istio(pods.load("kpack-build"))


def seven_step_pod() -> dict:
    """kpack's six lifecycle steps plus one more (a cache warm-up), Istio injected."""
    pod = pods.load("kpack-build")
    extra = copy.deepcopy(pod["spec"]["initContainers"][0])
    extra.update(name="warm-cache", command=["/cnb/lifecycle/restorer"], args=["-cache-dir=/cache"])
    pod["spec"]["initContainers"].append(extra)
    return pods.inject_istio(pod)


def review(pod: dict, **kw: Any) -> dict:
    kw.setdefault("uid", "00000000-0000-4000-8000-000000000001")
    return wrap(copy.deepcopy(pod), **kw)


def serve_process(directory: Path, body: bytes, *, tree: Path | None = None,
                  env: dict[str, str] | None = None, preexec_fn: Any = None,
                  log: Path | None = None) -> tuple["subprocess.Popen", int]:
    """`initshift serve` as a process (JSON logs on, as in production) with the certificates
    of `directory`, on a free port (metrics on another), once it answers and rewrites `body`;
    the benchmarks' server. `tree`: the checkout it runs from (default: this one); `env`:
    more variables; `preexec_fn`: run in the child (resource limits); `log`: a file for its
    standard output and error (default: dropped)."""
    import os
    import sys
    import time

    import httpx

    socks = [bind(), bind()]
    port, metrics_port = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()  # the server binds them; loopback ports are not reused that fast
    env = {**os.environ, "SUPPORT_INJECTED_SIDECARS": "true", "INITSHIFT_HOST": "127.0.0.1",
           "INITSHIFT_PORT": str(port), "INITSHIFT_METRICS_PORT": str(metrics_port),
           "INITSHIFT_TLS_CERT": str(directory / store.TLS_CERT),
           "INITSHIFT_TLS_KEY": str(directory / store.TLS_KEY), **(env or {})}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - the child holds it
    try:
        proc = subprocess.Popen([sys.executable, "-m", "webhook.cli", "serve"], env=env, cwd=tree,
                                stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
    finally:
        if log is not None:
            out.close()
    url, ctx = f"https://127.0.0.1:{port}", client_context(directory / store.CA_CERT)
    try:
        for _ in range(400):
            try:
                httpx.get(f"{url}/readyz", verify=ctx)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        answer = httpx.post(f"{url}/mutate", content=body, verify=ctx,
                            headers={"content-type": "application/json"}).json()
        assert answer["response"].get("patch"), "the benchmark pod must be rewritten"
    except BaseException:
        proc.terminate()
        proc.wait(30)
        raise
    return proc, port
