"""The cluster's certificates (cryptography, ECDSA P-256): one CA signs the apiserver's
serving certificate and every client certificate (admin, the apiserver's kubelet client,
the node); the service-account signing key is a separate key pair."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAYS = 7  # throwaway clusters


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes

    def write(self, folder: Path, stem: str) -> tuple[Path, Path]:
        crt, key = folder / f"{stem}.crt", folder / f"{stem}.key"
        crt.write_bytes(self.cert)
        key.write_bytes(self.key)
        key.chmod(0o600)
        return crt, key


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)


class Authority:
    """A CA that issues serving and client certificates."""

    def __init__(self, common_name: str = "initshift-e2e-ca") -> None:
        self._key = _key()
        now = _now()
        self._name = _name(common_name)
        self.cert = (
            x509.CertificateBuilder().subject_name(self._name).issuer_name(self._name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def pem(self) -> Pem:
        return Pem(self.cert.public_bytes(serialization.Encoding.PEM), _key_pem(self._key))

    def _issue(self, subject: x509.Name, usage: x509.ObjectIdentifier,
               san: list[x509.GeneralName] | None = None) -> Pem:
        key = _key()
        now = _now()
        builder = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(self._name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def serving(self, cn: str, dns: list[str], ips: list[str]) -> Pem:
        san: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        san += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        return self._issue(_name(cn), ExtendedKeyUsageOID.SERVER_AUTH, san)

    def client(self, user: str, groups: tuple[str, ...] = ()) -> Pem:
        """A client certificate: the apiserver reads the user from CN, the groups from O."""
        return self._issue(_name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH)


def signing_key() -> Pem:
    """The service-account token signing key: (public key PEM, private key PEM)."""
    key = _key()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return Pem(public, _key_pem(key))
