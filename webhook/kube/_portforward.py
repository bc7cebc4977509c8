"""A port-forward to a pod through the API, as `kubectl port-forward` makes one, over the
WebSocket form of the `pods/portforward` subresource (`v4.channel.k8s.io`, which the
kubelet has spoken since long before 1.28; kubectl's own SPDY needs a library initshift
does not carry).

Each connection is one WebSocket: channel 0 carries its bytes both ways, channel 1 the
kubelet's error for it (nothing listens on the port, the pod is gone); the kubelet's first
frame on each channel is the port number (2 bytes, little-endian), not data. `connect()`
hands the caller one end of a socket pair, the other piped to the WebSocket, so the caller
speaks to the pod's port as to any socket, TLS included.
"""

from __future__ import annotations

import asyncio
import socket

import aiohttp
from kubernetes_asyncio.stream import WsApiClient

from ._api import _AUTH, _REQUEST_TIMEOUT_SECONDS, KubeApi, KubeError, _transport_error

_DATA, _ERROR = b"\x00", 1  # the channels of the one port forwarded
_READ_BYTES = 64 * 1024


class PortForward:
    """Connections to `port` of pod `namespace/pod`. Close it with `close()`, or use it as an
    async context manager; `errors` holds what the kubelet said of failed connections."""

    def __init__(self, api: KubeApi, namespace: str, pod: str, port: int) -> None:
        self.namespace, self.pod, self.port = namespace, pod, port
        self.errors: list[str] = []
        self._client = WsApiClient(api.client.configuration)
        self._client.user_agent = api.user_agent
        self._pipes: set[asyncio.Task] = set()

    async def connect(self) -> socket.socket:
        """A socket connected, through the apiserver and the kubelet, to the pod's port; a
        KubeError when the apiserver refuses the forward (forbidden, no such pod, no node)."""
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}/portforward"
        where = f"port-forward to pod {self.namespace}/{self.pod} port {self.port}"
        try:
            async with asyncio.timeout(_REQUEST_TIMEOUT_SECONDS):
                opened = await self._client.call_api(
                    path, "GET", query_params=[("ports", str(self.port))], header_params={},
                    auth_settings=_AUTH, _preload_content=False)
                # kubernetes-asyncio 30 hands back the open WebSocket, 31 and later aiohttp's
                # connect still to be awaited.
                ws = opened if isinstance(opened, aiohttp.ClientWebSocketResponse) else await opened
        except aiohttp.WSServerHandshakeError as e:
            why = {403: "forbidden (it needs get on pods/portforward)", 404: "no such pod"}.get(e.status, e.message)
            raise KubeError(e.status, f"{where}: {why}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise KubeError(0, f"{where}: {_transport_error(e)}") from None
        ours, theirs = socket.socketpair()
        try:
            reader, writer = await asyncio.open_connection(sock=theirs)
        except BaseException:
            ours.close()
            theirs.close()
            await ws.close()
            raise
        pipe = asyncio.create_task(self._pipe(ws, reader, writer), name=where)
        self._pipes.add(pipe)
        pipe.add_done_callback(self._pipes.discard)
        return ours

    async def _pipe(self, ws: aiohttp.ClientWebSocketResponse, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        async def upstream() -> None:
            while data := await reader.read(_READ_BYTES):
                await ws.send_bytes(_DATA + data)
            await ws.close()  # the caller closed its end: so does the pod's connection

        sending = asyncio.create_task(upstream())
        numbered: set[int] = set()
        try:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                    continue
                channel, data = message.data[0], message.data[1:]
                if channel not in numbered:  # the port number, once per channel
                    numbered.add(channel)
                elif channel == _ERROR:
                    self.errors.append(data.decode("utf-8", "replace").strip())
                    break
                elif data:
                    writer.write(data)
                    await writer.drain()
        except (aiohttp.ClientError, ConnectionError):
            pass  # the connection is gone either way; the caller sees it closed
        finally:
            sending.cancel()
            writer.close()
            await ws.close()

    async def close(self) -> None:
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._client.close()

    async def __aenter__(self) -> "PortForward":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
