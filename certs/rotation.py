"""Decide what the certificates should be now: create, renew, rotate the CA, or keep.

Pure: it takes what exists (the CA and serving pair, the caBundle the apiserver trusts)
and returns what should exist. The order of writes is the caller's (webhook/admission/_certs.py):
a bundle that gains a CA is injected before the new serving certificate is used; a
bundle that loses one is injected after.

CA rotation keeps the old CA in the bundle while a serving certificate it signed may still
be served. Every replica serves its own copy of the pair and picks up a new one only at its
next periodic check, so the bundle is pruned to the current CA only once the stored serving
certificate (signed by it) has been out for `prune_after`, longer than that period.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from . import pki


@dataclass(frozen=True)
class Material:
    """What is stored today (either may be missing or broken)."""

    ca: pki.KeyPair | None = None
    serving: pki.KeyPair | None = None


@dataclass(frozen=True)
class Wanted:
    dns_names: tuple[str, ...]
    ips: tuple[str, ...] = ()
    margin: dt.timedelta = dt.timedelta(days=30)
    ca_days: int = pki.CA_DAYS
    cert_days: int = pki.CERT_DAYS
    # How long after the serving certificate was issued older CAs are still trusted: longer
    # than the replicas' check period (webhook/admission/_certs.py sets it from that period).
    prune_after: dt.timedelta = dt.timedelta(hours=2)


@dataclass(frozen=True)
class Plan:
    ca: pki.KeyPair
    serving: pki.KeyPair
    bundle: list[x509.Certificate] = field(repr=False)  # current CA first
    action: str  # created, renewed, ca-rotated, pruned, unchanged
    serving_changed: bool

    @property
    def bundle_pem(self) -> bytes:
        return pki.bundle(self.bundle)


def fingerprint(cert: x509.Certificate) -> bytes:
    return cert.fingerprint(hashes.SHA256())


def _usable_ca(ca: pki.KeyPair | None, want: Wanted, now: dt.datetime) -> bool:
    if ca is None or not pki.matches_key(ca):
        return False
    cert = ca.cert
    return pki.is_ca(cert) and not pki.expires_within(cert, want.margin, now)


def _usable_serving(serving: pki.KeyPair | None, ca: pki.KeyPair, want: Wanted, now: dt.datetime) -> bool:
    if serving is None or not pki.matches_key(serving):
        return False
    cert = serving.cert
    dns, ips = pki.names(cert)
    wanted_ips = {str(ip) for ip in pki.parse_ips(want.ips)}
    return (pki.signed_by(cert, ca.cert) and not pki.expires_within(cert, want.margin, now)
            and dns == set(want.dns_names) and ips == wanted_ips)


def merge_bundle(first: x509.Certificate, others: list[x509.Certificate], now: dt.datetime) -> list[x509.Certificate]:
    """`first`, then the still-valid others, without duplicates."""
    out, seen = [first], {fingerprint(first)}
    for c in others:
        fp = fingerprint(c)
        if fp not in seen and c.not_valid_after_utc > now:
            out.append(c)
            seen.add(fp)
    return out


def plan(have: Material, trusted: list[x509.Certificate], want: Wanted, now: dt.datetime | None = None) -> Plan:
    """What the CA, serving pair and caBundle should be. `trusted` is today's caBundle."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if not _usable_ca(have.ca, want, now):
        ca = pki.create_ca(days=want.ca_days, now=now)
        serving = pki.create_serving(ca, list(want.dns_names), want.ips, want.cert_days, now)
        # Keep trusting whatever may still be served until the new pair is in use.
        old = [*trusted, *([have.ca.cert] if have.ca is not None and _parses(have.ca) else [])]
        action = "ca-rotated" if (have.ca is not None or trusted) else "created"
        return Plan(ca, serving, merge_bundle(ca.cert, old, now), action, True)
    ca = have.ca
    assert ca is not None
    if not _usable_serving(have.serving, ca, want, now):
        serving = pki.create_serving(ca, list(want.dns_names), want.ips, want.cert_days, now)
        # The serving pair replaced may have been signed by an older CA still in the bundle.
        return Plan(ca, serving, merge_bundle(ca.cert, trusted, now), "renewed", True)
    assert have.serving is not None
    issued = have.serving.cert.not_valid_before_utc + pki.BACKDATE
    if now - issued < want.prune_after:
        # Other replicas may still serve the pair this one replaced: keep what they need.
        return Plan(ca, have.serving, merge_bundle(ca.cert, trusted, now), "unchanged", False)
    # The stored serving certificate is signed by the current CA and every replica has had
    # time to load it: older CAs go.
    pruned = any(fingerprint(c) != fingerprint(ca.cert) for c in trusted)
    return Plan(ca, have.serving, [ca.cert], "pruned" if pruned else "unchanged", False)


def _parses(pair: pki.KeyPair) -> bool:
    try:
        pair.cert
    except pki.PKIError:
        return False
    return True
