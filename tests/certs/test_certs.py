"""Certificates: generation, the rotation plan, `initshift certs`, and self-management
against the in-process API double."""

from __future__ import annotations

import asyncio
import contextlib
import base64
import datetime as dt
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path
from typing import AsyncIterator

import pytest
import yaml

from webhook.cli import _certs as cli
from webhook.kube import _certs as kube
from webhook.admission import _certs as manage
from certs import pki, rotation, store
from tests.support.kubedouble import SYSTEM_NAMESPACES, KubeDouble
from webhook.settings import ServerSettings, Settings

DAY = dt.timedelta(days=1)
NAMES = tuple(pki.service_dns_names("initshift", "initshift-system"))
INSTALLED = (*SYSTEM_NAMESPACES, "initshift-system")  # a cluster's namespaces, initshift's made by the install
WANT = rotation.Wanted(NAMES, ("10.0.0.7",))


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def test_serving_certificate_has_the_service_names_and_ips():
    ca = pki.create_ca()
    serving = pki.create_serving(ca, list(NAMES), ["10.0.0.7", "fd00::1"])
    dns, ips = pki.names(serving.cert)
    assert dns == {"initshift", "initshift.initshift-system", "initshift.initshift-system.svc",
                   "initshift.initshift-system.svc.cluster.local"}
    assert ips == {"10.0.0.7", "fd00::1"}
    assert pki.signed_by(serving.cert, ca.cert) and not pki.signed_by(serving.cert, pki.create_ca().cert)
    assert pki.matches_key(serving) and not pki.matches_key(pki.KeyPair(serving.cert_pem, ca.key_pem))
    with pytest.raises(pki.PKIError):
        pki.create_serving(ca, ["x"], ["not-an-ip"])


def test_ssl_accepts_the_pair(tmp_path):
    ca = pki.create_ca()
    store.write_dir(tmp_path, ca, pki.create_serving(ca, list(NAMES)))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    assert stat.S_IMODE((tmp_path / "tls.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600


# --- the plan ------------------------------------------------------------------------------
def test_plan_creates_then_keeps():
    first = rotation.plan(rotation.Material(), [], WANT)
    assert first.action == "created" and first.serving_changed and first.bundle == [first.ca.cert]
    again = rotation.plan(rotation.Material(first.ca, first.serving), first.bundle, WANT)
    assert again.action == "unchanged" and not again.serving_changed and again.serving == first.serving


def test_plan_renews_the_serving_certificate_inside_the_margin():
    first = rotation.plan(rotation.Material(), [], WANT)
    expiry = first.serving.cert.not_valid_after_utc
    have = rotation.Material(first.ca, first.serving)
    assert rotation.plan(have, first.bundle, WANT, expiry - WANT.margin - DAY).action == "unchanged"
    renewed = rotation.plan(have, first.bundle, WANT, expiry - WANT.margin + DAY)
    assert renewed.action == "renewed" and renewed.ca == first.ca and renewed.serving != first.serving
    assert renewed.bundle == [first.ca.cert]


def test_plan_renews_when_the_names_change():
    first = rotation.plan(rotation.Material(), [], WANT)
    other = rotation.Wanted(NAMES, ("10.0.0.8",))
    assert rotation.plan(rotation.Material(first.ca, first.serving), first.bundle, other).action == "renewed"


def test_ca_rotation_keeps_the_old_ca_until_the_new_one_is_in_use():
    first = rotation.plan(rotation.Material(), [], WANT)
    when = first.ca.cert.not_valid_after_utc - WANT.margin + DAY
    rotated = rotation.plan(rotation.Material(first.ca, first.serving), first.bundle, WANT, when)
    assert rotated.action == "ca-rotated" and rotated.ca != first.ca
    assert rotated.bundle == [rotated.ca.cert, first.ca.cert]  # both trusted while the switch happens
    assert pki.signed_by(rotated.serving.cert, rotated.ca.cert)
    # Another replica starting right after the rotation finds the new pair stored, but the
    # others may still serve the old one until their next check: the old CA stays.
    have = rotation.Material(rotated.ca, rotated.serving)
    soon = rotation.plan(have, rotated.bundle, WANT, when + dt.timedelta(minutes=1))
    assert soon.bundle == [rotated.ca.cert, first.ca.cert] and not soon.serving_changed
    # Once every replica has had time to load the new pair, the old CA leaves the bundle.
    after = rotation.plan(have, rotated.bundle, WANT, when + WANT.prune_after)
    assert after.action == "pruned" and after.bundle == [rotated.ca.cert] and not after.serving_changed


def test_plan_replaces_broken_material_and_drops_expired_cas():
    expired = pki.create_ca(days=1, now=now() - 10 * DAY)
    broken = rotation.Material(pki.KeyPair(b"junk", b"junk"), pki.KeyPair(b"junk", b"junk"))
    plan = rotation.plan(broken, [expired.cert], WANT)
    assert plan.action == "ca-rotated" and plan.bundle == [plan.ca.cert]


def test_secret_round_trip():
    plan = rotation.plan(rotation.Material(), [], WANT)
    data = store.secret_data(plan.serving, plan.ca.cert_pem + pki.create_ca().cert_pem, plan.ca.key_pem)
    back = store.material_from_secret(data)
    assert back.ca == plan.ca and back.serving == plan.serving  # the managed CA is the bundle's first
    assert store.material_from_secret({"tls.crt": "%%%"}) == rotation.Material()


# --- CLI ---------------------------------------------------------------------------------
def test_certs_create_writes_files(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["create", "--out", str(out), "--name", "hook", "--namespace", "ns", "--ip", "10.1.2.3",
                     "--dns", "hook.example.com"]) == 0
    serving = pki.KeyPair((out / "tls.crt").read_bytes(), (out / "tls.key").read_bytes())
    ca = pki.KeyPair((out / "ca.crt").read_bytes(), (out / "ca.key").read_bytes())
    dns, ips = pki.names(serving.cert)
    assert {"hook.ns.svc", "hook.ns.svc.cluster.local", "hook.example.com"} <= dns and ips == {"10.1.2.3"}
    assert pki.signed_by(serving.cert, ca.cert)
    # a second certificate from the same CA: its key stays where it is
    again = tmp_path / "again"
    assert cli.main(["create", "--out", str(again), "--ca-cert", str(out / "ca.crt"),
                     "--ca-key", str(out / "ca.key")]) == 0
    assert pki.signed_by(pki.load_cert((again / "tls.crt").read_bytes()), ca.cert)
    assert not (again / "ca.key").exists()


@pytest.mark.parametrize("argv,code", [
    (["create", "--ca-cert", "x.crt"], 2),  # usage (the shared convention: 2 usage or bad input, 1 run time)
    (["create", "--ca-cert", "missing.crt", "--ca-key", "missing.key"], 2),
    (["create", "--ip", "999.1.1.1"], 2),
    (["create", "--dns", "café.example"], 2),
    (["create", "--namespace", "Builds_1"], 2),
    (["create", "--name", "1svc"], 2),  # a Service's name starts with a letter (RFC 1035), as INITSHIFT_SERVICE_NAME's
    (["create", "--days", "0"], 2),
    (["inject", "--ca-file", "missing.pem"], 2),
])
def test_certs_errors_are_one_line(tmp_path, capsys, argv, code):
    try:
        got = cli.main([*argv, *(["--out", str(tmp_path)] if argv[0] == "create" else [])])
    except SystemExit as e:  # argparse's usage error (one line, see webhook/cli/_common.py)
        got = e.code
    assert got == code
    err = capsys.readouterr().err
    assert err.startswith("initshift certs") and err.count("\n") == 1


# --- certs create and an existing CA: what it signs with, what openssl verify says ------------
def openssl(*args: str, cwd) -> str:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout


def openssl_ca(d, name: str, key: list[str], *ext: str, issuer: str | None = None) -> tuple[str, str]:
    """A CA certificate and key made by OpenSSL itself (self-signed, or by `issuer`)."""
    signer = ["-CA", f"{issuer}.crt", "-CAkey", f"{issuer}.key"] if issuer else []
    openssl("req", "-x509", "-nodes", *key, "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "30",
            "-subj", f"/CN={name}", *signer, *(a for e in ext for a in ("-addext", e)), cwd=d)
    return str(d / f"{name}.crt"), str(d / f"{name}.key")


CA_EXT = ("basicConstraints=critical,CA:TRUE", "keyUsage=critical,keyCertSign,cRLSign")
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]


def verify(out, *flags: str) -> None:
    """`openssl verify` of tls.crt against ca.crt, as a TLS server certificate for the Service."""
    openssl("verify", *flags, "-CAfile", "ca.crt", "-purpose", "sslserver",
            "-verify_hostname", "initshift.initshift-system.svc", "tls.crt", cwd=out)


def create(*argv: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "webhook.cli", "certs", "create", *argv], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
                          env={k: v for k, v in os.environ.items() if not k.startswith("INITSHIFT_")})
    return proc.returncode, proc.stdout, proc.stderr


def test_every_chain_certs_create_writes_verifies_with_openssl(tmp_path):
    """Its own CA, and CAs OpenSSL made: RSA with a subject key identifier that is not the
    key's hash (the serving certificate must name that one), Ed25519, an intermediate
    followed by its root in --ca-cert, and an intermediate alone."""
    assert create("--out", str(tmp_path / "own"))[0] == 0
    verify(tmp_path / "own")
    rsa = openssl_ca(tmp_path, "rsa-root", ["-newkey", "rsa:2048"], *CA_EXT,
                     "subjectKeyIdentifier=0102030405060708", "authorityKeyIdentifier=none")
    ed = openssl_ca(tmp_path, "ed-root", ["-newkey", "ed25519"], *CA_EXT)
    inter = openssl_ca(tmp_path, "intermediate", EC, "basicConstraints=critical,CA:TRUE,pathlen:0",
                       "keyUsage=critical,keyCertSign", issuer="rsa-root")
    chain = tmp_path / "chain.crt"
    chain.write_bytes(Path(inter[0]).read_bytes() + Path(rsa[0]).read_bytes())
    for name, (crt, key) in {"rsa": rsa, "ed25519": ed, "chain": (str(chain), inter[1])}.items():
        code, out, err = create("--out", str(tmp_path / name), "--ca-cert", crt, "--ca-key", key)
        assert code == 0 and err == "", err
        verify(tmp_path / name)
        assert not (tmp_path / name / "ca.key").exists()  # a given CA's key stays where it is
    assert (tmp_path / "chain" / "ca.crt").read_bytes() == chain.read_bytes()  # the whole chain is the caBundle
    # An intermediate alone: the apiserver trusts any certificate of its caBundle as an
    # anchor (Go's verifier), as `openssl verify -partial_chain` does.
    assert create("--out", str(tmp_path / "alone"), "--ca-cert", inter[0], "--ca-key", inter[1])[0] == 0
    verify(tmp_path / "alone", "-partial_chain")


def test_certs_create_refuses_a_ca_that_cannot_sign(tmp_path):
    """A leaf, a CA whose key usage forbids signing, one without basicConstraints, an
    expired one, a key that is not the certificate's: one line, exit 2, nothing written."""
    assert create("--out", str(tmp_path / "own"))[0] == 0
    own = tmp_path / "own"
    no_sign = openssl_ca(tmp_path, "no-sign", EC, "basicConstraints=critical,CA:TRUE",
                         "keyUsage=critical,digitalSignature")
    no_bc = openssl_ca(tmp_path, "no-bc", EC, "basicConstraints=critical,CA:FALSE")
    expired = pki.create_ca("expired", days=1, now=now() - 10 * DAY)
    (tmp_path / "expired.crt").write_bytes(expired.cert_pem)
    (tmp_path / "expired.key").write_bytes(expired.key_pem)
    cases = {
        "leaf": ((own / "tls.crt", own / "tls.key"), "CN=initshift is not a CA certificate (basicConstraints CA:FALSE)"),
        "no keyCertSign": (no_sign, "CN=no-sign may not sign certificates (its keyUsage lacks keyCertSign)"),
        "CA:FALSE": (no_bc, "CN=no-bc is not a CA certificate"),
        "expired": ((tmp_path / "expired.crt", tmp_path / "expired.key"), "CN=expired expired on"),
        "another key": ((own / "ca.crt", own / "tls.key"), "the key does not belong to the certificate CN=initshift-ca"),
        "not PEM": ((own / "ca.key", own / "ca.key"), "not a PEM certificate bundle: no -----BEGIN CERTIFICATE----- block"),
        "a certificate as the key": ((own / "ca.crt", own / "ca.crt"),
                                     "not an unencrypted PEM private key: it holds a certificate, not a private key"),
    }
    for name, ((crt, key), words) in cases.items():
        code, out, err = create("--out", str(tmp_path / name), "--ca-cert", str(crt), "--ca-key", str(key))
        assert code == 2 and out == "" and err.count("\n") == 1, (name, code, err)
        assert err.startswith(f"initshift certs create: --ca-cert {crt} --ca-key {key}: ") and words in err, err
        assert not (tmp_path / name).exists()


@pytest.mark.parametrize("pem, why", [
    (b"", "the file is empty"),
    (b"junk\n", "no -----BEGIN ... PRIVATE KEY----- block"),
    (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
     "a PRIVATE KEY block that holds no key this machine's OpenSSL can read"),
])
def test_a_key_problem_is_said_in_words(pem: bytes, why: str) -> None:
    assert pki.key_problem(pem) == why
    with pytest.raises(pki.PKIError) as e:
        pki.check_ca(pki.KeyPair(pki.create_ca("ca").cert_pem, pem))
    assert str(e.value) == f"not an unencrypted PEM private key: {why}", "no web page, no parser's internals"


def test_an_encrypted_key_is_said_to_be(tmp_path) -> None:
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-aes256", "-pass", "pass:secret",
            "-out", "enc.key", cwd=tmp_path)
    assert pki.key_problem((tmp_path / "enc.key").read_bytes()) == \
        "a private key encrypted with a passphrase (initshift needs it unencrypted)"
    assert pki.key_problem(pki.create_ca("ca").key_pem) is None


def test_certs_create_again_keeps_the_ca_and_replaces_it_only_with_force(tmp_path):
    out = tmp_path / "out"
    code, text, _ = create("--out", str(out))
    assert code == 0 and text.splitlines()[0].startswith(f"wrote a new CA to {out}: {out}/ca.crt, {out}/ca.key")
    assert f"wrote {out}/tls.crt, {out}/tls.key (valid until " in text.splitlines()[1]
    ca_key, ca_crt, first = ((out / n).read_bytes() for n in ("ca.key", "ca.crt", "tls.crt"))
    # again: the same CA signs a new serving certificate (the caBundle stays valid)
    code, text, _ = create("--out", str(out), "--dns", "hook.example.com")
    assert code == 0 and text.startswith(f"kept the CA in {out} (ca.crt, ca.key; valid until ")
    assert (out / "ca.key").read_bytes() == ca_key and (out / "ca.crt").read_bytes() == ca_crt
    assert (out / "tls.crt").read_bytes() != first and "hook.example.com" in pki.names(pki.load_cert(
        (out / "tls.crt").read_bytes()))[0]
    verify(out)
    # a CA key that cannot be kept is never overwritten without --force
    (out / "ca.crt").unlink()
    code, text, err = create("--out", str(out))
    assert (code, text) == (2, "") and "holds a CA key that cannot be kept (ca.crt is missing): --force" in err
    assert (out / "ca.key").read_bytes() == ca_key
    code, text, _ = create("--out", str(out), "--force")
    assert code == 0 and text.startswith(f"replaced the CA in {out}")
    assert "initshift certs inject --ca-file" in text and (out / "ca.key").read_bytes() != ca_key
    verify(out)
    # signing with another CA into a directory that holds a CA key: refused, then --force
    other = tmp_path / "other"
    assert create("--out", str(other))[0] == 0
    argv = ["--out", str(out), "--ca-cert", str(other / "ca.crt"), "--ca-key", str(other / "ca.key")]
    code, _, err = create(*argv)
    assert code == 2 and f"{out}/ca.key is the key of another CA: choose another --out, or --force" in err
    code, text, _ = create(*argv, "--force")
    assert code == 0 and f"removed {out}/ca.key" in text and not (out / "ca.key").exists()
    verify(out)
    # a CA certificate without its key (what --ca-cert wrote): signed with again only as asked
    code, _, err = create("--out", str(out))
    assert code == 2 and f"{out}/ca.crt is a CA whose key is not in {out}: sign with it again with --ca-cert" in err
    code, text, _ = create("--out", str(out), "--ca-cert", str(out / "ca.crt"), "--ca-key", str(other / "ca.key"))
    assert code == 0 and "caBundle" not in text  # the same CA: nothing to inject
    verify(out)


# --- against the API double ---------------------------------------------------------------
def webhook_config(name: str = "initshift-webhook", hooks: int = 2) -> dict:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{"name": f"h{i}.initshift.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "clientConfig": {"service": {"name": "initshift", "namespace": "initshift-system",
                                                       "path": "/mutate"}}} for i in range(hooks)]}


def bundle_in(double: KubeDouble, name: str = "initshift-webhook") -> list:
    mwc = double.get("mutatingwebhookconfigurations", None, name)
    bundles = {wh["clientConfig"].get("caBundle") for wh in mwc["webhooks"]}
    assert len(bundles) == 1  # every webhook of the configuration trusts the same CAs
    return pki.load_certs(base64.b64decode(bundles.pop()))


def kubeconfig(double: KubeDouble, path) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "double",
        "clusters": [{"name": "double", "cluster": {"server": double.url}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return str(path)


def test_certs_create_says_when_the_ca_ends_the_serving_certificate(tmp_path, capsys):
    assert cli.main(["create", "--out", str(tmp_path), "--ca-days", "10"]) == 0
    serving = capsys.readouterr().out.splitlines()[1]
    assert "valid until" in serving and "the CA's end: --force or another --ca-cert for longer" in serving
    assert cli.main(["create", "--out", str(tmp_path / "long")]) == 0
    assert "the CA's end" not in capsys.readouterr().out


def test_certs_create_writes_nothing_when_the_secret_has_no_cluster_to_go_to(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert cli.main(["create", "--out", str(tmp_path / "out"), "--secret", "initshift-tls"]) == 1
    assert not (tmp_path / "out").exists()


async def test_inject_warns_about_a_certificate_that_is_not_a_ca(tmp_path, capsys):
    """tls.crt given for ca.crt: injected (a pinned self-signed leaf is legitimate), with a warning."""
    async with KubeDouble(namespaces=INSTALLED) as double:
        double.put("mutatingwebhookconfigurations", webhook_config())
        cfg = kubeconfig(double, tmp_path / "kubeconfig")
        assert await asyncio.to_thread(cli.main, ["create", "--out", str(tmp_path)]) == 0
        capsys.readouterr()
        assert await asyncio.to_thread(cli.main, ["inject", "--ca-file", str(tmp_path / "tls.crt"),
                                                  "--kubeconfig", cfg]) == 0
        err = capsys.readouterr().err
        assert err == (f"warning: {tmp_path / 'tls.crt'}: the certificate CN=initshift is not a CA: the apiserver "
                       "will trust that exact certificate alone, and the webhook fails once it is renewed\n")
        assert bundle_in(double) == [pki.load_cert((tmp_path / "tls.crt").read_bytes())]
        assert await asyncio.to_thread(cli.main, ["inject", "--ca-file", str(tmp_path / "ca.crt"),
                                                  "--kubeconfig", cfg]) == 0
        assert capsys.readouterr().err == ""


async def test_cli_create_secret_and_inject(tmp_path):
    async with KubeDouble(namespaces=INSTALLED) as double:
        double.put("mutatingwebhookconfigurations", webhook_config())
        cfg = kubeconfig(double, tmp_path / "kubeconfig")
        out = tmp_path / "out"
        rc = await asyncio.to_thread(cli.main, ["create", "--out", str(out), "--secret", "initshift-tls",
                                                "--kubeconfig", cfg])
        assert rc == 0
        secret = double.get("secrets", "initshift-system", "initshift-tls")
        assert secret["type"] == "kubernetes.io/tls"
        assert base64.b64decode(secret["data"]["tls.crt"]) == (out / "tls.crt").read_bytes()
        assert "ca.key" not in secret["data"]  # the CA key stays with whoever ran the command
        old = pki.create_ca("old")
        (tmp_path / "old.crt").write_bytes(old.cert_pem)
        assert await asyncio.to_thread(cli.main, ["inject", "--ca-file", str(tmp_path / "old.crt"),
                                                  "--kubeconfig", cfg]) == 0
        assert await asyncio.to_thread(cli.main, ["inject", "--ca-file", str(out / "ca.crt"), "--keep-old",
                                                  "--kubeconfig", cfg]) == 0
        ca = pki.load_cert((out / "ca.crt").read_bytes())
        assert bundle_in(double) == [ca, old.cert]
        assert await asyncio.to_thread(cli.main, ["inject", "--ca-file", str(out / "ca.crt"),
                                                  "--kubeconfig", cfg]) == 0
        assert bundle_in(double) == [ca]
        # a configuration that does not exist: one line, exit 1
        assert await asyncio.to_thread(cli.main, ["inject", "--ca-file", str(out / "ca.crt"),
                                                  "--webhook-config", "nope", "--kubeconfig", cfg]) == 1


async def test_cli_create_secret_replaces_a_self_managed_secret_whole(tmp_path, capsys):
    """`certs create --secret` over the Secret a self-managed server made: what it writes
    replaces the data, so the server's ca.key is not left beside another CA's ca.crt (the
    server would find its CA unusable and make a new one, which the injected bundle lacks)."""
    name = ("initshift-system", "initshift-tls")
    async with self_managed(tmp_path) as double:
        assert "ca.key" in double.get("secrets", *name)["data"]
        out = tmp_path / "out"
        assert await asyncio.to_thread(cli.main, ["create", "--out", str(out), "--secret", name[1],
                                                  "--kubeconfig", kubeconfig(double, tmp_path / "kubeconfig")]) == 0
        assert capsys.readouterr().err == (
            "warning: Secret initshift-system/initshift-tls holds a ca.key: a self-managed server "
            "(INITSHIFT_SELF_MANAGED_CERTS) keeps its own CA there and makes a new one at its next start; to start "
            "a self-managed install's certificates over, delete the Secret and restart the server\n")
        data = double.get("secrets", *name)["data"]
        assert sorted(data) == ["ca.crt", "tls.crt", "tls.key"]
        assert base64.b64decode(data["ca.crt"]) == (out / "ca.crt").read_bytes()


@contextlib.asynccontextmanager
async def self_managed(tmp_path) -> AsyncIterator[KubeDouble]:
    """The API double after a self-managed server made its Secret and injected its CA."""
    async with KubeDouble(namespaces=INSTALLED) as double:
        double.put("mutatingwebhookconfigurations", webhook_config())
        async with double.kube_api() as api:
            await manage.ensure_certificates(managed_settings(tmp_path), api)
        yield double


def managed_settings(tmp_path) -> Settings:
    return Settings(server=ServerSettings(self_managed_certs=True, tls_cert=str(tmp_path / "tls" / "tls.crt"),
                                          tls_key=str(tmp_path / "tls" / "tls.key")))


async def test_self_management_creates_renews_rotates_and_prunes(tmp_path):
    settings = managed_settings(tmp_path)
    async with KubeDouble(namespaces=INSTALLED) as double:
        double.put("mutatingwebhookconfigurations", webhook_config())
        api = double.kube_api()
        async with api:
            first = await manage.ensure_certificates(settings, api)
            assert first.action == "created"
            secret = double.get("secrets", "initshift-system", "initshift-tls")["data"]
            assert store.material_from_secret(secret) == rotation.Material(first.ca, first.serving)
            assert (tmp_path / "tls" / "tls.crt").read_bytes() == first.serving.cert_pem
            assert bundle_in(double) == [first.ca.cert]
            assert set(pki.names(first.serving.cert)[0]) == set(NAMES)

            assert (await manage.ensure_certificates(settings, api)).action == "unchanged"

            soon = first.serving.cert.not_valid_after_utc - 5 * DAY
            renewed = await manage.ensure_certificates(settings, api, now=soon)
            assert renewed.action == "renewed" and renewed.ca == first.ca
            assert (tmp_path / "tls" / "tls.crt").read_bytes() == renewed.serving.cert_pem

            late = first.ca.cert.not_valid_after_utc - 5 * DAY
            rotated = await manage.ensure_certificates(settings, api, now=late)
            assert rotated.action == "ca-rotated"
            assert bundle_in(double) == [rotated.ca.cert, first.ca.cert]
            stored = store.material_from_secret(double.get("secrets", "initshift-system", "initshift-tls")["data"])
            assert stored.serving == rotated.serving

            kept = await manage.ensure_certificates(settings, api, now=late)  # e.g. another replica starting
            assert kept.action == "unchanged" and bundle_in(double) == [rotated.ca.cert, first.ca.cert]

            later = late + manage.wanted(settings).prune_after
            pruned = await manage.ensure_certificates(settings, api, now=later)
            assert pruned.action == "pruned" and bundle_in(double) == [rotated.ca.cert]


async def test_trust_is_injected_before_the_new_certificate_is_stored(tmp_path):
    settings = managed_settings(tmp_path)
    async with KubeDouble(namespaces=INSTALLED) as double:
        double.put("mutatingwebhookconfigurations", webhook_config())
        async with double.kube_api() as api:
            await manage.ensure_certificates(settings, api)
        writes = [(r.method, "secrets" if "/secrets" in r.path else "webhook")
                  for r in double.requests if r.method in ("POST", "PUT", "PATCH")]
        assert writes == [("PUT", "webhook"), ("POST", "secrets")]


async def test_a_secret_created_by_another_replica_is_adopted(tmp_path):
    settings = managed_settings(tmp_path)
    async with KubeDouble(namespaces=INSTALLED) as double:
        double.put("mutatingwebhookconfigurations", webhook_config())
        theirs = rotation.plan(rotation.Material(), [], manage.wanted(settings))
        double.fail_next("/api/v1/namespaces/initshift-system/secrets/initshift-tls", 404, method="GET")
        double.put("secrets", {"metadata": {"name": "initshift-tls", "namespace": "initshift-system"},
                               "type": "kubernetes.io/tls",
                               "data": store.secret_data(theirs.serving, theirs.ca.cert_pem, theirs.ca.key_pem)})
        async with double.kube_api() as api:
            ours = await manage.ensure_certificates(settings, api)
        assert ours.serving == theirs.serving and ours.ca == theirs.ca
        # Only their CA: ours, made for the Secret they wrote first, was trusted a moment and
        # its key is gone (it stayed in the bundle until the next prune, two hours on).
        assert bundle_in(double) == [theirs.ca.cert]


async def test_a_secret_rewritten_by_another_replica_is_not_overwritten(tmp_path):
    settings = managed_settings(tmp_path)
    name = ("initshift-system", "initshift-tls")
    async with self_managed(tmp_path) as double:
        async with double.kube_api() as api:
            _, version = await kube.read_secret_versioned(api, *name)
            # Another replica renews after our read; our write is conditional on what we read.
            theirs = rotation.plan(rotation.Material(), [], manage.wanted(settings))
            their_data = store.secret_data(theirs.serving, theirs.ca.cert_pem, theirs.ca.key_pem)
            assert await kube.write_secret(api, *name, their_data)
            ours = rotation.plan(rotation.Material(), [], manage.wanted(settings))
            our_data = store.secret_data(ours.serving, ours.ca.cert_pem, ours.ca.key_pem)
            assert not await kube.write_secret(api, *name, our_data, resource_version=version)
        assert double.get("secrets", *name)["data"] == their_data


async def test_serve_self_managed_starts_with_certificates_it_made(tmp_path):
    """`initshift serve` with INITSHIFT_SELF_MANAGED_CERTS: creates the Secret, injects the
    caBundle, and serves a certificate the injected bundle verifies."""
    import os
    import sys

    import httpx

    from tests.support import https_helpers as h
    from webhook.admission._https import bind

    sock, metrics_sock = bind(), bind()
    port, metrics_port = sock.getsockname()[1], metrics_sock.getsockname()[1]
    sock.close()
    metrics_sock.close()
    async with KubeDouble(namespaces=INSTALLED) as double:
        double.put("mutatingwebhookconfigurations", webhook_config())
        env = {k: v for k, v in os.environ.items() if not k.startswith("INITSHIFT_")}
        env.update(KUBECONFIG=kubeconfig(double, tmp_path / "kubeconfig"), INITSHIFT_SELF_MANAGED_CERTS="true",
                   INITSHIFT_HOST="127.0.0.1", INITSHIFT_PORT=str(port), KUBERNETES_SERVICE_HOST="",
                   INITSHIFT_METRICS_PORT=str(metrics_port),
                   INITSHIFT_TLS_CERT=str(tmp_path / "tls/tls.crt"), INITSHIFT_TLS_KEY=str(tmp_path / "tls/tls.key"))
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "webhook.cli", "serve", env=env,
                                                    stderr=asyncio.subprocess.DEVNULL)
        try:
            for _ in range(300):
                if proc.returncode is not None:
                    break
                secret = double.get("secrets", "initshift-system", "initshift-tls")
                if secret and (tmp_path / "tls/tls.crt").exists():
                    (tmp_path / "bundle.crt").write_bytes(pki.bundle(bundle_in(double)))
                    try:
                        async with httpx.AsyncClient(verify=h.client_context(tmp_path / "bundle.crt")) as c:
                            # verified as the apiserver would: against the Service's DNS name
                            r = await c.get(f"https://127.0.0.1:{port}/readyz",
                                            extensions={"sni_hostname": "initshift.initshift-system.svc"})
                        break
                    except httpx.TransportError:
                        pass
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the server never became reachable")
            assert proc.returncode is None, "the server exited"
            assert r.status_code == 200
            # the plain-HTTP metrics port: both certificates' expiry and the rotation that made them
            async with httpx.AsyncClient() as c:
                text = (await c.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                      if line and not line.startswith("#")}
            serving = pki.load_certs((tmp_path / "tls/tls.crt").read_bytes())[0]
            assert values['initshift_certificate_expiration_timestamp_seconds{certificate="serving"}'] == \
                serving.not_valid_after_utc.timestamp()
            ca = bundle_in(double)[0]
            assert values['initshift_certificate_expiration_timestamp_seconds{certificate="ca"}'] == \
                ca.not_valid_after_utc.timestamp()
            assert values['initshift_certificate_rotations_total{certificate="serving"}'] == 1
            assert values['initshift_certificate_rotations_total{certificate="ca"}'] == 1
        finally:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
