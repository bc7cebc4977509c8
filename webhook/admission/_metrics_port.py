"""The plain-HTTP `/metrics` port, served from the server's own event loop.

prometheus_client's own server starts a thread per connection with no timeout and no cap:
a few thousand unfinished requests held that many threads and a core. Here a connection
costs a coroutine; at most MAX_CONNECTIONS are open at once (more are closed at once), a
request's head must arrive within READ_TIMEOUT seconds and fit MAX_REQUEST_BYTES, and the
exposition is rendered on one thread of its own (reading every worker's values is file
I/O and CPU work the event loop must not do), so scrapes run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor

from .. import metrics

MAX_CONNECTIONS = 16  # a Prometheus server or two scrape one connection each
READ_TIMEOUT = 5.0  # seconds for the request's head, and for the answer to be taken
MAX_REQUEST_BYTES = 8 * 1024

_PATHS = (b"/metrics", b"/")


class MetricsPort:
    """`GET /metrics` on `host:port` (0: a free port) while `start()`ed."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.wanted = host, port
        self.port: int | None = None
        self.open = 0
        self._server: asyncio.Server | None = None
        self._render = ThreadPoolExecutor(max_workers=1, thread_name_prefix="initshift-metrics")

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.wanted, limit=MAX_REQUEST_BYTES,
                                                  backlog=128)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server, self.port = None, None
        self._render.shutdown(wait=False)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_CONNECTIONS:
            metrics.CONNECTIONS_CLOSED.labels("metrics-over-limit").inc()
            writer.transport.abort()
            return
        self.open += 1
        try:
            await self._answer(reader, writer)
        except (asyncio.TimeoutError, asyncio.LimitOverrunError, asyncio.IncompleteReadError, ValueError):
            metrics.CONNECTIONS_CLOSED.labels("metrics-bad-request").inc()
        except ConnectionError:
            pass
        finally:
            self.open -= 1
            writer.transport.abort()  # one request per connection; nothing left to flush

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
        method, path = (head.split(b"\r\n", 1)[0].split(b" ") + [b"", b""])[:2]
        if method not in (b"GET", b"HEAD"):
            status, body, ctype = b"405 Method Not Allowed", b"only GET\n", "text/plain"
        elif path.split(b"?", 1)[0] not in _PATHS:
            status, body, ctype = b"404 Not Found", b"metrics are at /metrics\n", "text/plain"
        else:
            body, ctype = await asyncio.get_running_loop().run_in_executor(self._render, metrics.exposition)
            status = b"200 OK"
        writer.write(b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                     % (status, ctype.encode(), len(body)))
        if method != b"HEAD":
            writer.write(body)
        await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
        # The answer is in the kernel's buffer: close politely so the client reads it all.
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), READ_TIMEOUT)
