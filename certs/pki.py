"""A CA and the webhook's serving certificate, as PEM bytes (cryptography, ECDSA P-256).

The apiserver reaches the webhook as `NAME.NAMESPACE.svc`; the certificate also carries
`NAME`, `NAME.NAMESPACE` and `NAME.NAMESPACE.svc.cluster.local`, plus any extra DNS
names and IP SANs asked for.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
CERT_DAYS = 365
# Clocks of the apiserver and the webhook are rarely exactly in step.
BACKDATE = dt.timedelta(minutes=5)


class PKIError(ValueError):
    """PEM data that cannot be used; the message is one line."""


# The private keys a CA may sign with.
_SigningKey = (rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey
               | dsa.DSAPrivateKey)


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return load_cert(self.cert_pem)


def service_dns_names(name: str, namespace: str) -> list[str]:
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def create_ca(common_name: str = "initshift-ca", days: int = CA_DAYS, now: dt.datetime | None = None) -> KeyPair:
    now = now or utcnow()
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


# RFC 1123 host names, as Kubernetes checks them, with the wildcard a SAN may carry first.
_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"(\*\.)?{_LABEL}(\.{_LABEL})*")


def check_dns_name(name: str) -> str:
    """`name` in lower case (names compare case-insensitively) when it is a DNS name a
    certificate can carry (`*.` first allowed); else PKIError saying why."""
    if not name.isascii():
        raise PKIError(f"not a DNS name: {name!r} (write an internationalised name in its xn-- form)")
    if len(name) > 253 or not _DNS_NAME.fullmatch(name.lower()):
        raise PKIError(f"not a DNS name: {name!r} (letters, digits, '-' and '.'; labels of 1-63 characters)")
    return name.lower()


def parse_ips(values: list[str] | tuple[str, ...]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    out = []
    for v in values:
        try:
            out.append(ipaddress.ip_address(v.strip()))
        except ValueError:
            raise PKIError(f"not an IP address: {v!r}") from None
    return out


def create_serving(ca: KeyPair, dns_names: list[str], ips: list[str] | tuple[str, ...] = (),
                   days: int = CERT_DAYS, now: dt.datetime | None = None, *, client: bool = False) -> KeyPair:
    """A serving certificate for `dns_names` (the first is the subject CN) signed by `ca`;
    `client=True` makes a client certificate instead (for mutual TLS)."""
    if not dns_names:
        raise PKIError("a serving certificate needs at least one DNS name")
    now = now or utcnow()
    ca_cert, ca_key = load_cert(ca.cert_pem), _load_key(ca.key_pem)
    key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(check_dns_name(n)) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in parse_ips(ips)]
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                     crl_sign=False, content_commitment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(_authority_key_id(ca_cert, ca_key), critical=False)
        .sign(ca_key, _signature_hash(ca_key))
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _authority_key_id(ca_cert: x509.Certificate, ca_key: _SigningKey) -> x509.AuthorityKeyIdentifier:
    """The CA's own subject key identifier, whichever way its maker derived it: OpenSSL
    builds a chain only when the two are equal."""
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _signature_hash(key: _SigningKey) -> hashes.HashAlgorithm | None:
    """Ed25519 and Ed448 sign without a separate hash; the others with SHA-256."""
    return None if isinstance(key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)) else hashes.SHA256()


def _basic_constraints(cert: x509.Certificate) -> x509.BasicConstraints | None:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return None


def is_ca(cert: x509.Certificate) -> bool:
    """basicConstraints CA:TRUE."""
    basic = _basic_constraints(cert)
    return basic is not None and basic.ca


def check_ca(ca: KeyPair, now: dt.datetime | None = None) -> x509.Certificate:
    """The CA certificate of `ca` (its PEM's first) when it can sign serving certificates
    that verify: a CA (basicConstraints CA:TRUE, and keyCertSign if it restricts its key
    usage), valid now, and `ca.key_pem` its key. Else PKIError saying which."""
    now = now or utcnow()
    cert = load_cert(ca.cert_pem)
    basic = _basic_constraints(cert)
    if basic is None or not basic.ca:
        raise PKIError(f"{subject_of(cert)} is not a CA certificate (basicConstraints "
                       f"{'CA:FALSE' if basic else 'missing'}): it cannot sign another certificate")
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        usage = None
    if usage is not None and not usage.key_cert_sign:
        raise PKIError(f"{subject_of(cert)} may not sign certificates (its keyUsage lacks keyCertSign)")
    if cert.not_valid_after_utc <= now:
        raise PKIError(f"{subject_of(cert)} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    if cert.not_valid_before_utc > now:
        raise PKIError(f"{subject_of(cert)} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    key = _load_key(ca.key_pem)
    if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey,
                            ed448.Ed448PrivateKey, dsa.DSAPrivateKey)):
        raise PKIError(f"a {type(key).__name__} cannot sign certificates")
    if cert.public_key() != key.public_key():
        raise PKIError(f"the key does not belong to {subject_of(cert)}")
    return cert


def subject_of(cert: x509.Certificate) -> str:
    """`the certificate CN=...`, for a message."""
    return f"the certificate {cert.subject.rfc4514_string() or '(no subject)'}"


def load_cert(pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise PKIError(f"not a PEM certificate: {cert_problem(pem)}") from None


def load_certs(pem: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle (a caBundle may hold several CAs)."""
    try:
        return x509.load_pem_x509_certificates(pem) if pem.strip() else []
    except ValueError:
        raise PKIError(f"not a PEM certificate bundle: {cert_problem(pem)}") from None


def cert_problem(pem: bytes) -> str | None:
    """Why `pem` holds no certificate, in words (the library's message names a web page, or
    its parser's internals, and OpenSSL's its source file); None when it holds one."""
    if not pem.strip():
        return "the file is empty"
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        return "no -----BEGIN CERTIFICATE----- block"
    try:
        x509.load_pem_x509_certificates(pem)
    except ValueError:
        return "a CERTIFICATE block that does not hold an X.509 certificate"
    return None


def key_problem(pem: bytes) -> str | None:
    """Why `pem` holds no unencrypted private key, in words (the library's message names a
    web page and its parser's internals); None when it holds one."""
    if not pem.strip():
        return "the file is empty"
    if b"PRIVATE KEY-----" not in pem:
        if b"-----BEGIN CERTIFICATE-----" in pem:
            return "it holds a certificate, not a private key"
        return "no -----BEGIN ... PRIVATE KEY----- block"
    try:
        serialization.load_pem_private_key(pem, password=None)
    except TypeError:  # the library's word for a key that needs a passphrase
        return "a private key encrypted with a passphrase (initshift needs it unencrypted)"
    except (ValueError, UnsupportedAlgorithm):
        return "a PRIVATE KEY block that holds no key this machine's OpenSSL can read"
    return None


def _load_key(pem: bytes) -> _SigningKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise PKIError(f"not an unencrypted PEM private key: {key_problem(pem)}") from None
    return key  # type: ignore[return-value]


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def bundle(certs: list[x509.Certificate]) -> bytes:
    return b"".join(cert_pem(c) for c in certs)


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception):  # noqa: BLE001 - InvalidSignature and friends
        return False
    return True


def names(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    """(DNS names, IP addresses) of a certificate's SAN extension."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return set(san.get_values_for_type(x509.DNSName)), {str(i) for i in san.get_values_for_type(x509.IPAddress)}


def matches_key(pair: KeyPair) -> bool:
    try:
        return pair.cert.public_key() == _load_key(pair.key_pem).public_key()
    except PKIError:
        return False


def expires_within(cert: x509.Certificate, margin: dt.timedelta, now: dt.datetime | None = None) -> bool:
    return cert.not_valid_after_utc - (now or utcnow()) <= margin
