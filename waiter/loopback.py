"""Minimal HTTP(S)/TCP client for loopback probes and quit endpoints.

Hand-rolled on sockets: http.client would pull the email package into the frozen bundle
and its import time into every step's cold start. Like the kubelet, https is not verified.
`socket` and `urllib.parse` are imported when first needed: only the steps given a probe or
a quit endpoint pay for them (~3 ms of cold start), not every step in between.
"""

from __future__ import annotations

from collections import namedtuple

SCHEMES = ("http", "https", "tcp")


# Plain tuples, not dataclasses: `dataclasses` imports `inspect`, ~10 ms of every step's cold start.
class Endpoint(namedtuple("Endpoint", "scheme host port path url")):
    """scheme: str, host: str, port: int, path: str, url: str."""

    __slots__ = ()

    @classmethod
    def parse(cls, url: str) -> "Endpoint":
        """Raises ValueError with a one-line reason."""
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise ValueError(f"{url!r}: scheme must be one of {', '.join(SCHEMES)}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{url!r}: bad port") from None
        if not parts.hostname or port is None:
            raise ValueError(f"{url!r}: needs a host and a port")
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.scheme, parts.hostname, port, path, url)

    def _connect(self, timeout: float) -> "socket.socket":
        import socket

        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        if self.scheme == "https":
            import ssl  # only https probes pay for it

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            sock = ctx.wrap_socket(sock, server_hostname=self.host)
        return sock

    def request(self, method: str, timeout: float) -> int:
        """HTTP status code (0 for a successful tcp connect); raises OSError on failure."""
        with self._connect(timeout) as sock:
            if self.scheme == "tcp":
                return 0
            host = f"[{self.host}]" if ":" in self.host else self.host
            head = (f"{method} {self.path} HTTP/1.1\r\nHost: {host}:{self.port}\r\n"
                    "User-Agent: initshift-waiter\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            sock.sendall(head.encode("latin-1"))
            line = b""
            while b"\r\n" not in line and len(line) < 1024:
                chunk = sock.recv(1024)
                if not chunk:
                    break
                line += chunk
            fields = line.split(b"\r\n", 1)[0].split(None, 2)
            if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
                raise OSError(f"not an HTTP response from {self.url}")
            return int(fields[1])

    def healthy(self, timeout: float) -> bool:
        """A kubelet-style probe: tcp connect, or HTTP status 200-399."""
        try:
            status = self.request("GET", timeout)
        except (OSError, ValueError):
            return False
        return self.scheme == "tcp" or 200 <= status < 400
