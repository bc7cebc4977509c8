"""The serving certificate, key and client CA that cannot be used: one line in words naming
the file (and INITSHIFT_CLIENT_CA), never OpenSSL's `[X509: ...] (_ssl.c:N)` text. Real
files, real ssl contexts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.support import https_helpers as h
from webhook.admission._tls import TLSError, make_context


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    h.make_certs(d)  # an EC certificate and key
    return d


def _pem(key, password: bytes | None = None) -> bytes:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _refused(cert: Path | str, key: Path | str, client_ca: Path | str = "") -> str:
    with pytest.raises(TLSError) as e:
        make_context(str(cert), str(key), str(client_ca))
    message = str(e.value)
    assert "\n" not in message and not re.search(r"_ssl\.c|\[Errno|\[X509|\[SSL|PEM lib", message), message
    return message


@pytest.mark.parametrize("kind", ["rsa", "ec"])
def test_a_key_of_another_certificate_does_not_belong_to_it(pki, tmp_path, kind):
    # An RSA key for the EC certificate: OpenSSL says NO_CERTIFICATE_ASSIGNED, not
    # KEY_VALUES_MISMATCH, and the key was said to be no key at all.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if kind == "rsa" else \
        ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "other.key").write_bytes(_pem(key))
    assert _refused(pki / "tls.crt", tmp_path / "other.key") == \
        f"cannot load TLS certificate {pki / 'tls.crt'} with key {tmp_path / 'other.key'} (INITSHIFT_TLS_CERT, INITSHIFT_TLS_KEY): the key does not belong " \
        "to the certificate"


def test_an_encrypted_key_is_said_to_be_encrypted_and_never_asks_for_a_passphrase(pki, tmp_path):
    key = serialization.load_pem_private_key((pki / "tls.key").read_bytes(), None)
    (tmp_path / "enc.key").write_bytes(_pem(key, b"secret"))
    # OpenSSL prompts on the terminal without a password callback; stdin is pytest's, so a
    # prompt would hang or fail rather than refuse.
    assert _refused(pki / "tls.crt", tmp_path / "enc.key").endswith(
        f"{tmp_path / 'enc.key'}: a private key encrypted with a passphrase (initshift needs it unencrypted)")


@pytest.mark.parametrize("content, why", [
    (b"not a key\n", "no -----BEGIN ... PRIVATE KEY----- block"),
    (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
     "a PRIVATE KEY block that holds no key this machine's OpenSSL can read"),
])
def test_a_file_holding_no_key_is_said_to(pki, tmp_path, content, why):
    (tmp_path / "junk.key").write_bytes(content)
    assert _refused(pki / "tls.crt", tmp_path / "junk.key").endswith(f"{tmp_path / 'junk.key'}: {why}")


def test_the_certificate_given_as_the_key_holds_no_key(pki):
    assert _refused(pki / "tls.crt", pki / "tls.crt").endswith(
        f"{pki / 'tls.crt'}: it holds a certificate, not a private key")


def test_the_key_given_as_the_certificate_holds_no_certificate(pki):
    assert _refused(pki / "tls.key", pki / "tls.key").endswith(f"{pki / 'tls.key'} holds no PEM certificate")


def test_a_matching_pair_still_works(pki):
    assert make_context(str(pki / "tls.crt"), str(pki / "tls.key")) is not None


@pytest.fixture
def bad_ca(tmp_path) -> dict[str, Path]:
    (tmp_path / "dir").mkdir()
    (tmp_path / "empty.crt").write_bytes(b"")
    (tmp_path / "garbage.crt").write_bytes(b"garbage\n")
    (tmp_path / "block.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    return {"missing": tmp_path / "nope" / "ca.crt", "dir": tmp_path / "dir", "empty": tmp_path / "empty.crt",
            "garbage": tmp_path / "garbage.crt", "block": tmp_path / "block.crt"}


@pytest.mark.parametrize("case,words", [
    ("missing", "no such file"),
    ("dir", "is a directory, not a PEM file"),
    ("empty", "the file is empty"),
    ("garbage", "no -----BEGIN CERTIFICATE----- block"),
    ("block", "a CERTIFICATE block that does not hold an X.509 certificate"),
])
def test_a_client_ca_that_cannot_be_used_names_the_setting(pki, bad_ca, case, words):
    path = bad_ca[case]
    assert _refused(pki / "tls.crt", pki / "tls.key", path) == f"client CA {path} (INITSHIFT_CLIENT_CA): {words}"


def test_a_client_ca_that_holds_a_ca_is_used(pki):
    import ssl

    ctx = make_context(str(pki / "tls.crt"), str(pki / "tls.key"), str(pki / "ca.crt"))
    assert ctx.verify_mode == ssl.CERT_REQUIRED and len(ctx.get_ca_certs()) == 1
