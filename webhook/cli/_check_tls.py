"""`initshift check`: reach the webhook server as the apiserver does and see what it serves.

Two TLS connections to the same address, both with the name the apiserver verifies (the
Service's `NAME.NAMESPACE.svc`, or the configuration URL's host) as SNI: one that accepts
any certificate, to read what the server presents even when it is wrong (expired, other
CA), and one that trusts only the configuration's caBundle and checks the name, exactly the
apiserver's verification. `/readyz` is read over the verified connection, else the other.
The connections go straight to the address (`direct`), or through a port-forward to one of
the Service's pods (`forwarded`): TLS and its checks are the same either way.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from cryptography import x509

from ..errors import InitshiftError
from ..kube import KubeError, PortForward

_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Served:
    """What the server at one address answered."""

    address: str  # host:port connected to
    server_name: str  # the name verified (and sent as SNI)
    error: str = ""  # the server could not be reached over TLS at all
    certificate: x509.Certificate | None = None
    verify_error: str = ""  # "" = the caBundle verifies the certificate for server_name
    ready_status: int | None = None
    ready: dict | None = None
    ready_error: str = ""


# Opens one TLS connection with a context and the name to send as SNI and verify.
Opener = Callable[[ssl.SSLContext, str], Awaitable[tuple[Any, Any]]]


class Unreachable(InitshiftError):
    """The way to the server is refused before any TCP (a port-forward the API refuses)."""


def direct(host: str, port: int) -> Opener:
    async def open_(ctx: ssl.SSLContext, server_name: str) -> tuple[Any, Any]:
        return await asyncio.open_connection(host, port, ssl=ctx, server_hostname=server_name)
    return open_


def forwarded(forward: PortForward) -> Opener:
    async def open_(ctx: ssl.SSLContext, server_name: str) -> tuple[Any, Any]:
        try:
            sock = await forward.connect()
        except KubeError as e:
            raise Unreachable(e.message) from None
        return await asyncio.open_connection(sock=sock, ssl=ctx, server_hostname=server_name)
    return open_


def _unverified() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _verifying(ca_pem: bytes) -> ssl.SSLContext:
    """Trusts only the caBundle (no system CAs), checks the name: the apiserver's rule."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cadata=ca_pem.decode("ascii", errors="replace"))
    return ctx


async def _open(opener: Opener, ctx: ssl.SSLContext, server_name: str) -> tuple[Any, Any]:
    return await asyncio.wait_for(opener(ctx, server_name), _TIMEOUT_SECONDS)


async def _get(reader: Any, writer: Any, server_name: str, path: str) -> tuple[int, bytes]:
    """One HTTP/1.1 GET over an open connection; (status, body)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {server_name}\r\nAccept: application/json\r\n"
                 f"Connection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), _TIMEOUT_SECONDS)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
    if any(h.lower().replace(" ", "") == "transfer-encoding:chunked" for h in lines[1:]):
        body = _dechunk(body)
    return int(parts[1]), body


def _dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, body = out + rest[:size], rest[size + 2:]
    return out


async def _close(writer: Any) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), _TIMEOUT_SECONDS)
    except (OSError, ssl.SSLError, asyncio.TimeoutError):
        pass


def _why(e: BaseException) -> str:
    if isinstance(e, Unreachable):
        return str(e)
    if isinstance(e, ssl.SSLCertVerificationError):
        return str(e.verify_message or e.reason or e)
    if isinstance(e, asyncio.TimeoutError):
        return f"no answer within {_TIMEOUT_SECONDS:.0f}s"
    return f"{type(e).__name__}: {e}" if not str(e).startswith(type(e).__name__) else str(e)


async def probe(address: str, opener: Opener, server_name: str, ca_pem: bytes, path: str = "/readyz") -> Served:
    """What the server reached by `opener` (said to be at `address`) serves."""
    try:
        reader, writer = await _open(opener, _unverified(), server_name)
    except (OSError, ssl.SSLError, asyncio.TimeoutError, Unreachable) as e:
        return Served(address, server_name, error=_why(e))
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    certificate = x509.load_der_x509_certificate(der) if der else None
    verify_error = "the configuration has no caBundle" if not ca_pem.strip() else ""
    if not verify_error:
        try:
            verified = await _open(opener, _verifying(ca_pem), server_name)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ValueError, Unreachable) as e:
            verify_error = _why(e)
        else:
            await _close(writer)
            reader, writer = verified
    try:
        status, body = await _get(reader, writer, server_name, path)
        ready = json.loads(body) if body else None
        return Served(address, server_name, certificate=certificate, verify_error=verify_error,
                      ready_status=status, ready=ready if isinstance(ready, dict) else None)
    except (OSError, ssl.SSLError, asyncio.TimeoutError, ValueError) as e:
        return Served(address, server_name, certificate=certificate, verify_error=verify_error,
                      ready_error=_why(e))
    finally:
        await _close(writer)
