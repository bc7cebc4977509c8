"""`ensure_local_certificates` (dev-server's `--dir`) keeps the CA someone may trust: CA
files that exist but cannot be used are refused, naming them, never silently replaced by a
new CA. Real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certs import pki, store
from tests.support import https_helpers as h
from webhook.admission import ensure_local_certificates

ROOT = Path(__file__).resolve().parents[2]


def _other_key() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@pytest.fixture
def made(tmp_path) -> Path:
    h.make_certs(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name,spoil,words", [
    ("junk ca.crt", lambda d: (d / store.CA_CERT).write_bytes(b"junk\n"),
     "not a PEM certificate: no -----BEGIN CERTIFICATE----- block"),
    ("junk ca.key", lambda d: (d / store.CA_KEY).write_bytes(b"junk\n"), "not an unencrypted PEM private key"),
    ("another key", lambda d: (d / store.CA_KEY).write_bytes(_other_key()),
     "the key does not belong to the certificate CN=initshift-ca"),
    ("not a CA", lambda d: (d / store.CA_CERT).write_bytes((d / store.TLS_CERT).read_bytes()),
     "is not a CA certificate"),
])
def test_ca_files_that_cannot_be_used_are_refused_and_kept(made, name, spoil, words):
    spoil(made)
    before = {p.name: p.read_bytes() for p in made.iterdir()}
    with pytest.raises(pki.PKIError) as e:
        ensure_local_certificates(made, h.LOOPBACK)
    cert, key = made / store.CA_CERT, made / store.CA_KEY
    assert str(e.value).startswith(f"{cert} and {key} are not a CA that can be kept (") and words in str(e.value)
    assert str(e.value).endswith(f"): remove {cert} and {key} to have a new CA made (then trust the new ca.crt)")
    assert {p.name: p.read_bytes() for p in made.iterdir()} == before  # nothing replaced


@pytest.mark.parametrize("left", [store.CA_CERT, store.CA_KEY])
def test_one_ca_file_without_the_other_is_refused(made, left):
    gone = store.CA_KEY if left == store.CA_CERT else store.CA_CERT
    (made / gone).unlink()
    with pytest.raises(pki.PKIError) as e:
        ensure_local_certificates(made, h.LOOPBACK)
    assert str(e.value) == f"{made / left} is there but {made / gone} is not: put it back, or remove {made / left} " \
                           "to have a new CA made (then trust the new ca.crt)"
    assert not (made / gone).exists()


def test_a_usable_ca_is_kept_and_an_empty_directory_gets_one(made, tmp_path_factory):
    ca = (made / store.CA_CERT).read_bytes()
    (made / store.TLS_CERT).unlink()
    ensure_local_certificates(made, h.LOOPBACK)
    assert (made / store.CA_CERT).read_bytes() == ca and (made / store.TLS_CERT).exists()
    fresh = tmp_path_factory.mktemp("fresh") / "run"
    assert ensure_local_certificates(fresh, h.LOOPBACK).action == "created"


def test_dev_server_refuses_in_one_line(made, tmp_path):
    """The command exits 1 with one JSON `error` line, before it listens."""
    (made / store.CA_KEY).write_bytes(_other_key())
    env = {**os.environ, "HOME": str(tmp_path), "INITSHIFT_PORT": "0", "INITSHIFT_METRICS_PORT": "0"}
    out = subprocess.run([sys.executable, "-m", "webhook.cli", "dev-server", "--dir", str(made)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1, out.stderr
    errors = [r["msg"] for r in map(json.loads, out.stderr.splitlines()) if r["level"] == "error"]
    assert len(out.stderr.splitlines()) == 1 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert errors[0].startswith(f"initshift dev-server: certificates in {made}: {made / 'ca.crt'} and "
                                f"{made / 'ca.key'} are not a CA that can be kept (the key does not belong")
