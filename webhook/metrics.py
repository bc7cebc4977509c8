"""Prometheus metrics of the process: the one registry and the admission server's series.

`REGISTRY` is the one registry the metrics port serves; other parts of the process (the
watcher, native-sidecar detection) register their own collectors on it, so one scrape
sees everything. Each label says one thing; docs/monitoring.md lists
every series, and the alerts and the dashboard in deploy/ use only these.
"""

from __future__ import annotations

import datetime as dt

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from . import __version__

# A `_created` series per counter and histogram doubles the output and no alert or panel
# uses it (cert-manager and Kyverno do not export them either).
prometheus_client.disable_created_metrics()

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

_BUILD_INFO = Gauge("initshift_build_info", "Always 1; the running initshift's version.", ["version"],
                   registry=REGISTRY)
_BUILD_INFO.labels(__version__).set(1)

# outcome: patched, allowed (unchanged), denied, error (internal), bad_request,
# refused (busy: 503, a body too slow: 408, too large: 413), gone (the client left first)
REQUESTS = Counter("initshift_admission_requests_total", "AdmissionReview requests by outcome.",
                   ["outcome"], registry=REGISTRY)
# Admission webhooks time out after 10 s at most; buckets resolve the sub-millisecond path.
LATENCY = Histogram("initshift_admission_duration_seconds", "Time to answer one AdmissionReview.",
                    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                    registry=REGISTRY)
# result: rewritten, skipped, denied. reason: for rewritten pods the strategy applied
# (waiter, native, hybrid, start-order) or `annotated` (native injection requested); otherwise
# why the pod was skipped or denied (the rewrite's slug, protected-namespace, internal-error).
PODS = Counter("initshift_pods_total", "Pod CREATE reviews by result and reason.", ["result", "reason"],
               registry=REGISTRY)
# reason: over-limit (INITSHIFT_MAX_CONNECTIONS, 16 on the metrics port), header-timeout
# (INITSHIFT_HEADER_TIMEOUT_SECONDS), idle-timeout (INITSHIFT_KEEPALIVE_TIMEOUT_SECONDS), write-timeout
# (INITSHIFT_WRITE_TIMEOUT_SECONDS), body-timeout (INITSHIFT_BODY_TIMEOUT_SECONDS, a body the app did not
# read), header-limit, no-length, pipelined
CONNECTIONS_CLOSED = Counter("initshift_connections_closed_total", "Connections the server closed to protect "
                             "itself, by reason.", ["reason"], registry=REGISTRY)
CERT_RELOADS = Counter("initshift_tls_reloads_total", "Serving certificate reloads by result.", ["result"],
                       registry=REGISTRY)
# certificate: serving (what the TLS port presents) or ca (self-managed: the CA that signs it).
_CERT_EXPIRY = Gauge("initshift_certificate_expiration_timestamp_seconds",
                    "Unix time at which the certificate expires.", ["certificate"], registry=REGISTRY)
CERT_ROTATIONS = Counter("initshift_certificate_rotations_total",
                         "Self-managed certificates issued (a new serving pair, or a new CA and pair).",
                         ["certificate"], registry=REGISTRY)


def set_expiry(certificate: str, not_after: dt.datetime | None) -> None:
    """Record when `certificate` expires; an unreadable one drops the series (no stale value)."""
    if not_after is None:
        try:
            _CERT_EXPIRY.remove(certificate)
        except KeyError:
            pass
        return
    _CERT_EXPIRY.labels(certificate).set(not_after.timestamp())


def exposition() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
