"""Where certificate material lives: a directory of PEM files, or a `kubernetes.io/tls`
Secret (`tls.crt`, `tls.key`, `ca.crt`, and `ca.key` when the CA is managed here).

Files are replaced atomically (temp file + rename), keys readable by the owner only.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path

from . import pki
from .rotation import Material

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
SECRET_TYPE = "kubernetes.io/tls"


def write_file(path: str | Path, data: bytes, mode: int = 0o644) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _pair(cert: bytes | None, key: bytes | None) -> pki.KeyPair | None:
    return pki.KeyPair(cert, key) if cert and key else None


def read_dir(directory: str | Path) -> Material:
    d = Path(directory)
    return Material(_pair(_read(d / CA_CERT), _read(d / CA_KEY)), _pair(_read(d / TLS_CERT), _read(d / TLS_KEY)))


def write_serving(cert_path: str | Path, key_path: str | Path, serving: pki.KeyPair) -> None:
    # Key first: a reader that sees the new certificate then finds its key (the server's
    # reloader also retries a mismatched pair).
    write_file(key_path, serving.key_pem, 0o600)
    write_file(cert_path, serving.cert_pem)


def write_dir(directory: str | Path, ca: pki.KeyPair | None, serving: pki.KeyPair, *, ca_key: bool = True) -> None:
    d = Path(directory)
    if ca is not None:
        if ca_key:
            write_file(d / CA_KEY, ca.key_pem, 0o600)
        write_file(d / CA_CERT, ca.cert_pem)
    write_serving(d / TLS_CERT, d / TLS_KEY, serving)


def secret_data(serving: pki.KeyPair, ca_bundle: bytes, ca_key: bytes | None = None) -> dict[str, str]:
    """The Secret's `data` (base64 values)."""
    raw = {TLS_CERT: serving.cert_pem, TLS_KEY: serving.key_pem, CA_CERT: ca_bundle}
    if ca_key:
        raw[CA_KEY] = ca_key
    return {k: base64.b64encode(v).decode() for k, v in raw.items()}


def material_from_secret(data: dict[str, str] | None) -> Material:
    if not data:
        return Material()
    try:
        raw = {k: base64.b64decode(v) for k, v in data.items() if isinstance(v, str)}
    except ValueError:
        return Material()
    ca_cert = raw.get(CA_CERT)
    if ca_cert:
        # ca.crt may be a bundle; the managed CA is its first certificate.
        try:
            first = pki.load_certs(ca_cert)[:1]
        except pki.PKIError:
            first = []
        ca_cert = pki.cert_pem(first[0]) if first else None
    return Material(_pair(ca_cert, raw.get(CA_KEY)), _pair(raw.get(TLS_CERT), raw.get(TLS_KEY)))
