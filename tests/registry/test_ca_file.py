"""INITSHIFT_REGISTRY_CA_FILE that holds no CA certificate: one line in words naming the
setting, never OpenSSL's `[X509: ...] (_ssl.c:N)` text. Real files, a real ssl context."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import pytest

from tests.support import https_helpers as h
from webhook.registry import _client as oci

BLOCK = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize("content,words", [
    (b"garbage\n", "no -----BEGIN CERTIFICATE----- block"),
    (b"", "the file is empty"),
    (b"\n\n", "the file is empty"),
    (BLOCK, "a CERTIFICATE block that does not hold an X.509 certificate"),
])
def test_a_file_without_a_ca_is_said_in_words(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "ca.pem"
    path.write_bytes(content)
    with pytest.raises(OSError) as e:
        oci.RegistryClient(ca_file=str(path))
    assert str(e.value) == f"INITSHIFT_REGISTRY_CA_FILE {str(path)!r}: {words}"
    assert not isinstance(e.value, ssl.SSLError) and not re.search(r"_ssl\.c|\[X509|PEM lib", str(e.value))


async def test_a_file_with_a_ca_is_trusted(tmp_path: Path) -> None:
    ca = h.make_certs(tmp_path)
    client = oci.RegistryClient(ca_file=str(ca))
    await client.aclose()
