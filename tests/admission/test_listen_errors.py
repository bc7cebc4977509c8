"""A socket the server cannot listen on is blamed on the setting at fault: the host
(INITSHIFT_HOST or serve's --host, INITSHIFT_METRICS_HOST) when the address does not resolve
or is not this machine's, the port when it is taken; the metrics port set to the HTTPS
port is said to be that. Real sockets."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import https_helpers as h
from webhook.admission._https import HttpsServer, ListenError, bind


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    h.make_certs(d)
    return d


def _listen_error(pki: Path, **server) -> str:
    srv = HttpsServer(h.settings_for(pki, **server), graceful_seconds=1)
    try:
        with pytest.raises(ListenError) as e:
            srv.listen()
    finally:
        for s in (srv.sock, srv.metrics_sock):
            if s is not None:
                s.close()
    return str(e.value)


@pytest.mark.parametrize("host", ["999.1.1.1", "no-such-host.invalid"])
def test_a_host_that_does_not_resolve_is_the_hosts_fault(pki, host):
    # the resolver's own words follow in parentheses (no DNS here, or NXDOMAIN)
    assert _listen_error(pki, host=host, port=8443).startswith(
        f"cannot listen on {host}:8443 (INITSHIFT_HOST or --host): not an IP address, nor a name that resolves (")


def test_an_address_of_no_interface_here_is_the_hosts_fault(pki):
    # 192.0.2.0/24 is TEST-NET-1: documentation only, on no interface.
    assert _listen_error(pki, host="192.0.2.1", port=8443) == \
        "cannot listen on 192.0.2.1:8443 (INITSHIFT_HOST or --host): no interface of this machine has that address"


def test_the_metrics_host_is_named_for_its_own_address(pki):
    assert _listen_error(pki, metrics_host="192.0.2.1", metrics_port=9090) == \
        "cannot listen on 192.0.2.1:9090 (INITSHIFT_METRICS_HOST): no interface of this machine has that address"


def test_a_port_in_use_is_the_ports_fault(pki):
    busy = bind()
    port = busy.getsockname()[1]
    try:
        assert _listen_error(pki, port=port) == \
            f"cannot listen on 127.0.0.1:{port} (INITSHIFT_PORT or --port): address already in use"
    finally:
        busy.close()


@pytest.mark.skipif(not h.ipv6_loopback(), reason="no IPv6 loopback here")
def test_a_bracketed_ipv6_host_is_the_address_in_it(pki):
    """`[::1]`, as an IPv6 address is written beside a port or in a URL, listens on ::1."""
    srv = HttpsServer(h.settings_for(pki, host="[::1]", port=0), graceful_seconds=1)
    srv.listen()
    try:
        assert srv.sock.family == socket.AF_INET6 and srv.sock.getsockname()[0] == "::1"
    finally:
        srv.sock.close()
    busy = bind("::1")
    port = busy.getsockname()[1]
    try:
        assert _listen_error(pki, host="[::1]", port=port) == \
            f"cannot listen on [::1]:{port} (INITSHIFT_PORT or --port): address already in use"
    finally:
        busy.close()


@pytest.mark.parametrize("host,metrics_host", [("127.0.0.1", ""), ("", ""), ("127.0.0.1", "0.0.0.0")])
def test_the_metrics_port_set_to_the_https_port_is_said_to_be_that(pki, host, metrics_host):
    free = bind()
    port = free.getsockname()[1]
    free.close()
    assert _listen_error(pki, host=host, metrics_host=metrics_host, port=port, metrics_port=port) == \
        f"cannot listen on port {port} for metrics (INITSHIFT_METRICS_PORT): it is the HTTPS server's port " \
        "(INITSHIFT_PORT or --port) too; give the metrics another port, or 0 to turn them off"


def test_one_port_on_two_addresses_that_do_not_overlap_is_fine(pki):
    free = bind()
    port = free.getsockname()[1]
    free.close()
    srv = HttpsServer(h.settings_for(pki, host="127.0.0.1", metrics_host="127.0.0.2", port=port, metrics_port=port),
                      graceful_seconds=1)
    srv.listen()
    try:
        assert srv.port == srv.metrics_port == port
    finally:
        srv.sock.close()
        srv.metrics_sock.close()
