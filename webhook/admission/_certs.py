"""Self-managed certificates: the server creates or renews its serving certificate and
keeps the webhook's caBundle in step, at start-up and periodically while it runs.

The Secret is the shared truth between replicas; each replica writes the serving pair
to its own files (INITSHIFT_TLS_CERT / INITSHIFT_TLS_KEY, an emptyDir in self-managed
mode), which the server's reloader picks up.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..settings import Settings

from .. import kube, metrics
from ..errors import os_reason
from certs import pki, rotation, store

if TYPE_CHECKING:
    from cryptography import x509

log = logging.getLogger("initshift.certs")
_RENEW_CHECK_SECONDS = 3600.0


def wanted(settings: Settings, ips: tuple[str, ...] = (), extra_dns: tuple[str, ...] = ()) -> rotation.Wanted:
    srv = settings.server
    dns = (*pki.service_dns_names(srv.service_name, srv.namespace), *extra_dns)
    # Every replica loads a new pair from the Secret within one check period: only after
    # two of them is no replica left serving a certificate from a CA about to be pruned.
    return rotation.Wanted(dns, ips, margin=dt.timedelta(days=srv.renew_before_days),
                           prune_after=dt.timedelta(seconds=2 * _RENEW_CHECK_SECONDS))


async def ensure_certificates(settings: Settings, api: kube.KubeApi, *, ips: tuple[str, ...] = (),
                 now: dt.datetime | None = None) -> rotation.Plan:
    """Bring Secret, caBundle and local files to the plan; returns what was done."""
    srv = settings.server
    want = wanted(settings, ips)
    # CAs this call made and trusted, whose Secret another replica wrote first: their keys die
    # with this call, nothing is ever served from them, and they leave the bundle at once.
    lost: list["x509.Certificate"] = []
    for _ in range(3):
        secret, version = await kube.read_secret_versioned(api, srv.namespace, srv.cert_secret)
        have = store.material_from_secret(secret)
        trusted = [ca for ca in await kube.read_ca_bundle(api, srv.webhook_config) if ca not in lost]
        plan = rotation.plan(have, trusted, want, now)
        # Trust first: the apiserver must accept a new certificate before anyone serves it.
        await kube.inject_ca_bundle(api, srv.webhook_config, plan.bundle_pem)
        if plan.serving_changed:
            data = store.secret_data(plan.serving, plan.ca.cert_pem, plan.ca.key_pem)
            if not await kube.write_secret(api, srv.namespace, srv.cert_secret, data,
                                           create_only=have.ca is None and have.serving is None,
                                           resource_version=version):
                if plan.ca.cert not in trusted:
                    lost.append(plan.ca.cert)
                continue  # another replica wrote it first: adopt theirs (and count nothing)
            metrics.CERT_ROTATIONS.labels("serving").inc()
            if plan.action in ("created", "ca-rotated"):
                metrics.CERT_ROTATIONS.labels("ca").inc()
        store.write_serving(srv.tls_cert, srv.tls_key, plan.serving)
        metrics.set_expiry("ca", plan.ca.cert.not_valid_after_utc)
        log.info("certificates ensured", extra={"action": plan.action, "secret": f"{srv.namespace}/{srv.cert_secret}",
                                                "not_after": str(plan.serving.cert.not_valid_after_utc)})
        return plan
    raise kube.KubeError(0, f"Secret {srv.namespace}/{srv.cert_secret} kept changing while creating it")


async def keep_certificates_fresh(settings: Settings, api: kube.KubeApi, stop: asyncio.Event,
                     every: float = _RENEW_CHECK_SECONDS) -> None:
    """Re-run `ensure_certificates` until `stop`: renews before the margin and prunes a rotated CA."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except asyncio.TimeoutError:
            pass
        try:
            await ensure_certificates(settings, api)
        except Exception as e:  # noqa: BLE001 - keep serving the current certificate, retry later
            log.warning("certificate renewal failed", extra={"error": f"{type(e).__name__}: {e}"})


def ensure_local_certificates(directory: str | Path, want: rotation.Wanted, now: dt.datetime | None = None) -> rotation.Plan:
    """The same plan for a directory of files (dev-server): CA kept, serving pair renewed.
    PKIError when the directory holds CA files that cannot be used: a new CA would silently
    replace one someone may trust, as `initshift certs create` refuses to."""
    _check_kept_ca(Path(directory))
    plan = rotation.plan(store.read_dir(directory), [], want, now)
    if plan.serving_changed:
        store.write_dir(directory, plan.ca, plan.serving)
    if plan.action == "ca-rotated":  # whoever trusted the old CA must be told
        log.warning("replaced the CA, expired or about to expire: trust the new one",
                    extra={"ca": str(Path(directory) / store.CA_CERT),
                           "not_after": str(plan.ca.cert.not_valid_after_utc)})
    return plan


def _check_kept_ca(d: Path) -> None:
    """Nothing, or both CA files and they make a CA; else PKIError naming the files."""
    cert, key = d / store.CA_CERT, d / store.CA_KEY
    if not cert.exists() and not key.exists():
        return
    if not (cert.exists() and key.exists()):
        there, missing = (cert, key) if cert.exists() else (key, cert)
        raise pki.PKIError(f"{there} is there but {missing} is not: put it back, or remove {there} to have a new "
                           f"CA made (then trust the new {store.CA_CERT})")
    new_ca = f"remove {cert} and {key} to have a new CA made (then trust the new {store.CA_CERT})"
    try:
        pair = pki.KeyPair(cert.read_bytes(), key.read_bytes())
        # Validity is left out (checked at the certificate's own start): a CA that expires
        # is rotation's to replace, and rotation.plan does.
        pki.check_ca(pair, now=pki.load_cert(pair.cert_pem).not_valid_before_utc)
    except OSError as e:
        raise pki.PKIError(f"{e.filename or d}: {os_reason(e)}") from None
    except pki.PKIError as e:
        raise pki.PKIError(f"{cert} and {key} are not a CA that can be kept ({e}): {new_ca}") from None
