"""A port-forward through the API (webhook/kube/_portforward.py), against the double's
`pods/portforward` WebSocket and a real TCP server standing for the pod's port."""

from __future__ import annotations

import asyncio
import socket
from typing import AsyncIterator

import pytest

from tests.support.kubedouble import KubeDouble
from webhook.kube import KubeError, PortForward

NS, POD, PORT = "initshift-system", "initshift-0", 8443
BOUND = 10.0


class Echo:
    """What listens on the pod's port: answers what it reads in upper case; records each
    connection's end."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data.upper())
            await writer.drain()
        writer.close()
        self.ended.set()


@pytest.fixture
async def echo(kube: KubeDouble) -> AsyncIterator[Echo]:
    e = Echo()
    server = await asyncio.start_server(e.handle, "127.0.0.1", 0)
    e.port = server.sockets[0].getsockname()[1]
    kube.put("pods", {"metadata": {"name": POD, "namespace": NS}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    kube.pod_ports[(NS, POD, PORT)] = e.port
    async with server:
        yield e


async def talk(sock: socket.socket, *lines: bytes) -> list[bytes]:
    reader, writer = await asyncio.open_connection(sock=sock)
    out = []
    for line in lines:
        writer.write(line)
        out.append(await asyncio.wait_for(reader.readexactly(len(line)), BOUND))
    writer.close()
    return out


async def test_bytes_go_both_ways_one_websocket_per_connection(kube: KubeDouble, echo: Echo) -> None:
    async with kube.kube_api() as api, PortForward(api, NS, POD, PORT) as forward:
        first, second = await forward.connect(), await forward.connect()
        got = await asyncio.gather(talk(first, b"one\n", b"two\n"), talk(second, b"x" * 200_000 + b"\n"))
    assert got == [[b"ONE\n", b"TWO\n"], [b"X" * 200_000 + b"\n"]]
    assert not forward.errors
    opened = [r for r in kube.requests if r.path.endswith(f"/pods/{POD}/portforward")]
    assert len(opened) == 2 and all(r.query == {"ports": str(PORT)} for r in opened)


async def test_closing_our_end_closes_the_pods_connection(kube: KubeDouble, echo: Echo) -> None:
    async with kube.kube_api() as api, PortForward(api, NS, POD, PORT) as forward:
        assert await talk(await forward.connect(), b"hello\n") == [b"HELLO\n"]
        await asyncio.wait_for(echo.ended.wait(), BOUND)


async def test_nothing_listening_closes_the_connection_with_the_kubelets_words(kube: KubeDouble, echo: Echo) -> None:
    async with kube.kube_api() as api, PortForward(api, NS, POD, 9999) as forward:
        reader, writer = await asyncio.open_connection(sock=await forward.connect())
        assert await asyncio.wait_for(reader.read(), BOUND) == b""  # closed, nothing read
        writer.close()
    assert forward.errors == [f"error forwarding port 9999 to pod {POD}: dial tcp4 127.0.0.1:9999: connect: "
                              f"connection refused"]


async def test_a_refused_forward_is_a_kube_error(kube: KubeDouble, echo: Echo) -> None:
    async with kube.kube_api() as api:
        async with PortForward(api, NS, "gone", PORT) as forward:
            with pytest.raises(KubeError) as e:
                await forward.connect()
        assert e.value.status == 404
        assert e.value.message == f"port-forward to pod {NS}/gone port {PORT}: no such pod"
        kube.fail_next(f"/api/v1/namespaces/{NS}/pods/{POD}/portforward", 403)
        async with PortForward(api, NS, POD, PORT) as forward:
            with pytest.raises(KubeError, match="forbidden \\(it needs get on pods/portforward\\)"):
                await forward.connect()
