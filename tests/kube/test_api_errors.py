"""What a request that gets no answer from an apiserver says: one line in words, never
aiohttp's exception text (which names its class and repeats the address)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import pytest

from tests.support import https_helpers as h
from webhook.kube import KubeApi, KubeError


async def error_of(url: str) -> KubeError:
    async with KubeApi.for_host(url) as api:
        with pytest.raises(KubeError) as err:
            await api.request("GET", "/version")
    assert err.value.status != 0 or "Error" not in str(err.value)
    assert "\n" not in str(err.value)
    return err.value


async def test_nothing_listening() -> None:
    err = await error_of("http://127.0.0.1:9")  # the discard port: nothing listens
    assert err.status == 0 and err.message == "GET /version: cannot connect to 127.0.0.1:9: connection refused"


async def test_a_name_that_does_not_resolve() -> None:
    err = await error_of("https://apiserver.invalid:6443")  # .invalid never resolves (RFC 6761)
    assert err.message == "GET /version: cannot connect to apiserver.invalid:6443: the name does not resolve"


async def test_a_certificate_the_kubeconfig_does_not_trust(tmp_path: Path) -> None:
    h.make_certs(tmp_path)
    with h.running(h.settings_for(tmp_path)) as server:  # initshift's own server, its own CA
        port = server.port
        err = await error_of(f"https://127.0.0.1:{port}")
    assert err.message.startswith(f"GET /version: the certificate of 127.0.0.1:{port} is not trusted (")
    assert err.message.endswith("): check the kubeconfig's cluster CA")


@pytest.fixture
async def not_an_apiserver() -> AsyncIterator[dict]:
    """A plain HTTP server answering each request with `answer["raw"]` (a proxy, a load
    balancer's error page)."""
    answer: dict = {"raw": b"", "requests": []}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answer["requests"].append((await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0].decode())
        writer.write(answer["raw"])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    answer["url"] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield answer


async def test_an_empty_answer_that_is_no_status(not_an_apiserver: dict) -> None:
    not_an_apiserver["raw"] = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    err = await error_of(not_an_apiserver["url"])
    assert (err.status, err.message, str(err)) == (404, "Not Found (an empty body)", "404: Not Found (an empty body)")
    assert not err.not_found  # not the apiserver's: no object is said to be missing


@pytest.mark.parametrize("body, not_found", [
    (b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \\"x\\" not found",'
     b'"reason":"NotFound","code":404}', True),
    (b'{"message":"no route","reason":"NotFound"}', False),  # JSON, but not a Status
    (b"404 page not found\n", False),  # a bare Go server's (a server URL missing a proxy's path)
])
async def test_only_the_apiservers_404_says_an_object_is_missing(not_an_apiserver: dict, body: bytes,
                                                                  not_found: bool) -> None:
    not_an_apiserver["raw"] = (b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                               % (len(body), body))
    err = await error_of(not_an_apiserver["url"])
    assert (err.status, err.not_found) == (404, not_found)


async def test_an_error_page_is_one_line(not_an_apiserver: dict) -> None:
    page = b"<html>\r\n<body>\n<h1>502 Bad Gateway</h1>\n" + b"x" * 1000 + b"\n</body>\n</html>\n"
    not_an_apiserver["raw"] = (b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
                               b"Connection: close\r\n\r\n%s" % (len(page), page))
    err = await error_of(not_an_apiserver["url"])
    assert err.status == 502 and err.message.startswith("<html> <body> <h1>502 Bad Gateway</h1> xxx")
    assert err.message.endswith("...") and len(err.message) == 303


async def test_a_server_that_closes_without_answering(not_an_apiserver: dict) -> None:
    err = await error_of(not_an_apiserver["url"])  # raw b"": closed after the request
    assert err.status == 0 and err.message == "GET /version: the server closed the connection"


NOT_FOUND = (b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"not found","reason":"NotFound",'
             b'"code":404}')


@pytest.mark.parametrize("namespace, name", [("builds", ".."), ("..", "x"), ("builds", "a/b"), ("a/b", "x"),
                                             ("builds", "50%"), ("builds", ""), ("", "x"), ("builds", ".")])
async def test_a_name_that_would_name_another_path_is_refused_unsent(not_an_apiserver: dict, namespace: str,
                                                                     name: str) -> None:
    async with KubeApi.for_host(not_an_apiserver["url"]) as api:
        for call in (api.get_pod, api.delete_pod, api.get_secret, api.get_lease):
            with pytest.raises(KubeError) as err:
                await call(namespace, name)
            assert (err.value.status, err.value.reason) == (400, "Invalid")
            assert "is not a name the API takes in a request path" in err.value.message
    assert not_an_apiserver["requests"] == []


async def test_a_name_is_one_path_segment(not_an_apiserver: dict) -> None:
    """What a name holds besides the path's own separators stays in its segment: a `?` does
    not start a query, a `#` no fragment, `..` inside a name is no parent."""
    not_an_apiserver["raw"] = (b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                               b"Connection: close\r\n\r\n%s" % (len(NOT_FOUND), NOT_FOUND))
    async with KubeApi.for_host(not_an_apiserver["url"]) as api:
        assert await api.get_secret("builds", "a?b") is None
        assert await api.get_namespace("x#y") is None
        assert await api.get_service_account("a..b", "c d") is None
    assert not_an_apiserver["requests"] == [
        "GET /api/v1/namespaces/builds/secrets/a%3Fb HTTP/1.1",
        "GET /api/v1/namespaces/x%23y HTTP/1.1",
        "GET /api/v1/namespaces/a..b/serviceaccounts/c%20d HTTP/1.1",
    ]
