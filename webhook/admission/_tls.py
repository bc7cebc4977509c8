"""The server's SSLContext, rebuilt when the certificate files change.

Each connection's TLS starts from `CertReloader.ctx` as it is when the connection comes
(_guards.py). A reload builds a whole new context and only then puts it there: new
handshakes get the new certificate, open connections keep theirs, and a pair that does not
load (a new certificate with the old key, half-written) never replaces one that does.
Kubernetes updates a Secret volume by swapping a `..data` symlink, so the reloader
compares each file's resolved path, inode, size and mtime.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certs import pki

from .. import metrics
from ..errors import InitshiftError, os_reason

log = logging.getLogger("initshift.tls")


class TLSError(InitshiftError, RuntimeError):
    """The certificate files cannot be used; the message is one line."""


# TLS 1.2 suites: forward-secret key exchange (ECDHE) with an AEAD cipher only, as in
# Mozilla's "intermediate" profile; no SHA-1, no CBC, no static RSA. TLS 1.3's suites are
# all AEAD and are left at OpenSSL's defaults. Go's TLS client (the apiserver) offers these.
_TLS12_CIPHERS = ":".join((
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
))


def make_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """A server context: TLS 1.2 or newer with ECDHE AEAD suites only, optional
    client-certificate verification."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(_TLS12_CIPHERS)
    # No compression (CRIME), no renegotiation (a client could make the server redo
    # handshakes on one connection for free).
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    for path, what, setting in ((cert, "certificate", "INITSHIFT_TLS_CERT"), (key, "key", "INITSHIFT_TLS_KEY")):
        problem = _file_problem(path)
        if problem:
            raise TLSError(f"TLS {what} {path} ({setting}): {problem}")
    try:
        # Without a password callback OpenSSL asks for an encrypted key's passphrase on the
        # terminal: refuse such a key instead (_why says so).
        ctx.load_cert_chain(certfile=cert, keyfile=key, password=_no_passphrase)
    except (OSError, _Encrypted) as e:  # ssl.SSLError is an OSError
        raise TLSError(f"cannot load TLS certificate {cert} with key {key} (INITSHIFT_TLS_CERT, INITSHIFT_TLS_KEY): "
                       f"{_why(e, cert, key)}") from None
    if client_ca:
        where = f"client CA {client_ca} (INITSHIFT_CLIENT_CA)"
        problem = _file_problem(client_ca)
        if problem:
            raise TLSError(f"{where}: {problem}")
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except ssl.SSLError as e:
            raise TLSError(f"{where}: {_ca_why(e, client_ca)}") from None
        except OSError as e:  # replaced between the check and the load
            raise TLSError(f"{where}: {os_reason(e)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class _Encrypted(TLSError):
    """The key file asked for a passphrase (_why words it)."""


def _no_passphrase() -> bytes:
    raise _Encrypted


def _file_problem(path: str) -> str | None:
    """What keeps `path` from being a PEM file, in words (None: it is a readable file)."""
    try:
        with open(path, "rb") as f:
            empty = not f.read(1)
    except FileNotFoundError:
        return "no such file"
    except IsADirectoryError:
        return "is a directory, not a PEM file"
    except OSError as e:
        return os_reason(e)
    return "the file is empty" if empty else None


def _why(error: Exception, cert: str, key: str) -> str:
    """Why OpenSSL refused the pair, said about the file it concerns. OpenSSL's own reason
    depends on the kinds of key (an RSA key for an EC certificate is NO_CERTIFICATE_ASSIGNED,
    not KEY_VALUES_MISMATCH), so the files are read again with cryptography to tell."""
    try:
        with open(cert, "rb") as f:
            leaf = x509.load_pem_x509_certificate(f.read())
    except ValueError:
        return f"{cert} holds no PEM certificate"
    except OSError as e:  # replaced since OpenSSL read it
        return f"{cert}: {os_reason(e)}"
    try:
        with open(key, "rb") as f:
            pem = f.read()
    except OSError as e:
        return f"{key}: {os_reason(e)}"
    problem = pki.key_problem(pem)  # an encrypted key's among them (_Encrypted)
    if problem:
        return f"{key}: {problem}"
    if leaf.public_key() != serialization.load_pem_private_key(pem, password=None).public_key():
        return "the key does not belong to the certificate"
    # The pair matches and OpenSSL still refuses it: its security level (a small RSA key, a
    # weak signature digest), in words rather than its `[SSL: ...] (_ssl.c:N)` text.
    reason = getattr(error, "reason", None) or "UNKNOWN_REASON"
    return {"EE_KEY_TOO_SMALL": "the certificate's key is too small (RSA needs 2048 bits or more)",
            "CA_MD_TOO_WEAK": "the certificate is signed with a weak digest (MD5 or SHA-1)"}.get(
        reason, f"OpenSSL refuses the pair ({_words(reason)})")


def _ca_why(error: ssl.SSLError, path: str) -> str:
    """Why OpenSSL found no CA in `path`, in words."""
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as e:
        return os_reason(e)
    return pki.cert_problem(pem) or f"OpenSSL refuses it ({_words(error.reason or 'UNKNOWN_REASON')})"


def _words(reason: str) -> str:
    """OpenSSL's reason code (`EE_KEY_TOO_SMALL`) as words."""
    return reason.lower().replace("_", " ")


def _signature(path: str) -> tuple:
    """What changes when a file (or the symlink chain leading to it) is replaced."""
    try:
        st = os.stat(path)
    except OSError:
        return (path, None)
    return (os.path.realpath(path), st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


def not_after(cert_path: str) -> dt.datetime | None:
    try:
        with open(cert_path, "rb") as f:
            return x509.load_pem_x509_certificate(f.read()).not_valid_after_utc
    except (OSError, ValueError):
        return None


class CertReloader:
    """Keeps `ctx` what the certificate files hold now."""

    def __init__(self, cert: str, key: str, client_ca: str = "", interval: float = 1.0) -> None:
        self.cert, self.key, self.client_ca, self.interval = cert, key, client_ca, interval
        self._seen = self._current()
        self.ctx = make_context(cert, key, client_ca)
        self.expires = not_after(cert)
        metrics.set_expiry("serving", self.expires)
        self.reloads = 0

    def _current(self) -> tuple:
        return tuple(_signature(p) for p in (self.cert, self.key, self.client_ca) if p)

    def check(self) -> bool:
        """Reload if the files changed; True when a new certificate was loaded.

        A half-written update (new certificate, old key) fails to load: keep serving the
        old pair and try again on the next check, when the writer has finished.
        """
        now = self._current()
        if now == self._seen:
            return False
        try:
            self.ctx = make_context(self.cert, self.key, self.client_ca)
        except TLSError as e:
            metrics.CERT_RELOADS.labels("error").inc()
            log.warning("certificate reload failed, keeping the previous one", extra={"error": str(e)})
            return False
        self._seen = now
        self.expires = not_after(self.cert)
        metrics.set_expiry("serving", self.expires)
        self.reloads += 1
        metrics.CERT_RELOADS.labels("ok").inc()
        log.info("certificate reloaded", extra={"cert": self.cert, "not_after": str(self.expires)})
        return True

    def valid(self) -> bool:
        """A certificate is loaded and has not expired (the readiness condition)."""
        return self.expires is not None and self.expires > dt.datetime.now(dt.timezone.utc)

    async def watch(self, stop: asyncio.Event | None = None) -> None:
        """Poll in the event loop's own thread, so a reload never races a handshake."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
            except asyncio.TimeoutError:
                self.check()
