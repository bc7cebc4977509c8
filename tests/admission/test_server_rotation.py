"""Certificate rotation under load: the files change the way a Secret volume changes
(a `..data` symlink swapped atomically) while clients keep sending reviews; no request
fails, and new connections get the new certificate without a restart."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from pathlib import Path

import httpx

from certs import pki, store
from tests.support import https_helpers as h
from webhook.admission import _tls as tls

REVIEW = h.review(h.kpack_istio(), namespace="builds")


def secret_volume(root: Path, version: str, pair: pki.KeyPair) -> None:
    """Write `pair` as kubelet does: a new timestamped dir, then swap `..data` to it."""
    target = root / f"..{version}"
    target.mkdir()
    (target / store.TLS_CERT).write_bytes(pair.cert_pem)
    (target / store.TLS_KEY).write_bytes(pair.key_pem)
    tmp = root / "..data_tmp"
    os.symlink(target.name, tmp)
    os.replace(tmp, root / "..data")
    for name in (store.TLS_CERT, store.TLS_KEY):
        if not (root / name).is_symlink():
            os.symlink(f"..data/{name}", root / name)


def served_cert(port: int, ctx: ssl.SSLContext) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as s:
        return s.getpeercert(binary_form=True)


def der(pair: pki.KeyPair) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return pair.cert.public_bytes(Encoding.DER)


def test_rotation_while_clients_send_requests(tmp_path):
    names = list(h.LOOPBACK.dns_names)
    old_ca, new_ca = pki.create_ca("old-ca"), pki.create_ca("new-ca")
    old = pki.create_serving(old_ca, names, h.LOOPBACK.ips)
    new = pki.create_serving(new_ca, names, h.LOOPBACK.ips)
    bundle = tmp_path / "bundle.crt"  # the caBundle during a rotation: old and new CA
    bundle.write_bytes(old_ca.cert_pem + new_ca.cert_pem)
    vol = tmp_path / "tls"
    vol.mkdir()
    secret_volume(vol, "v1", old)

    results = {"ok": 0, "failed": [], "ok_after_switch": 0}
    switched = threading.Event()
    stop = threading.Event()
    ctx = h.client_context(bundle)

    def client_loop(keepalive: bool) -> None:
        limits = httpx.Limits(max_keepalive_connections=None if keepalive else 0)
        with httpx.Client(verify=ctx, limits=limits, timeout=30) as c:
            while not stop.is_set():
                try:
                    r = c.post(f"{url}/mutate", json=REVIEW)
                    assert r.status_code == 200 and r.json()["response"]["patch"]
                    results["ok"] += 1
                    if switched.is_set():
                        results["ok_after_switch"] += 1
                except Exception as e:  # noqa: BLE001 - every failure is recorded and fails the test
                    results["failed"].append(repr(e))

    with h.running(h.settings_for(vol)) as server:
        url = h.base_url(server)
        threads = [threading.Thread(target=client_loop, args=(ka,)) for ka in (True, False, False)]
        for t in threads:
            t.start()
        while results["ok"] < 20 and not results["failed"]:
            time.sleep(0.05)
        assert served_cert(server.port, ctx) == der(old)
        secret_volume(vol, "v2", new)
        deadline = time.monotonic() + 30
        while served_cert(server.port, ctx) != der(new):
            assert time.monotonic() < deadline, "the new certificate was never served"
            time.sleep(0.05)
        switched.set()
        while results["ok_after_switch"] < 20 and not results["failed"]:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(30)
        assert server.reloader.reloads == 1
        # ...and a client that trusts only the new CA is now served too
        (tmp_path / "new.crt").write_bytes(new_ca.cert_pem)
        assert served_cert(server.port, h.client_context(tmp_path / "new.crt")) == der(new)
    assert results["failed"] == []
    assert results["ok_after_switch"] >= 20


def test_a_half_written_pair_keeps_the_old_certificate(tmp_path):
    names = list(h.LOOPBACK.dns_names)
    ca = pki.create_ca()
    first, second = (pki.create_serving(ca, names, h.LOOPBACK.ips) for _ in range(2))
    store.write_dir(tmp_path, ca, first)
    reloader = tls.CertReloader(str(tmp_path / store.TLS_CERT), str(tmp_path / store.TLS_KEY))
    store.write_file(tmp_path / store.TLS_CERT, second.cert_pem)  # new certificate, old key
    assert reloader.check() is False and reloader.reloads == 0
    # ...and the context still serves the old pair (a failed load must not leave it without a key)
    assert handshake_cert(reloader.ctx, ca) == der(first)
    store.write_file(tmp_path / store.TLS_KEY, second.key_pem)  # the writer finishes
    assert reloader.check() is True and reloader.reloads == 1
    assert reloader.check() is False  # nothing changed since
    assert reloader.valid()
    assert handshake_cert(reloader.ctx, ca) == der(second)


def handshake_cert(server_ctx: ssl.SSLContext, ca: pki.KeyPair) -> bytes:
    """The certificate `server_ctx` presents in a real handshake over a socket pair."""
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    a, b = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            server_ctx.wrap_socket(a, server_side=True).close()
        except (OSError, ssl.SSLError) as e:
            errors.append(e)

    t = threading.Thread(target=serve)
    t.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname="localhost") as s:
            return s.getpeercert(binary_form=True)
    finally:
        t.join(10)
        a.close()
        b.close()
