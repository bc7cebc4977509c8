"""Prometheus metrics of the process: the one registry and the admission server's series.

`REGISTRY` is the one registry the metrics port serves; other parts of the process (the
watcher, native-sidecar detection) register their own collectors on it, so one scrape
sees everything. Each label says one thing; docs/monitoring.md lists
every series, and the alerts and the dashboard in deploy/ use only these.

Several server processes (webhook/admission/_workers.py) share their values through
prometheus_client's multiprocess mode: every gauge says how the processes' values combine
(`multiprocess_mode`, ignored in a single process) and `serving_registry()` is what the
metrics port serves.
"""

from __future__ import annotations

import datetime as dt
import os

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from . import __version__

# A `_created` series per counter and histogram doubles the output and no alert or panel
# uses it (cert-manager and Kyverno do not export them either).
prometheus_client.disable_created_metrics()

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

_BUILD_INFO = Gauge("initshift_build_info", "Always 1; the running initshift's version.", ["version"],
                   registry=REGISTRY, multiprocess_mode="livemax")
_BUILD_INFO.labels(__version__).set(1)

# outcome: patched, allowed (unchanged), denied, error (internal), bad_request,
# refused (busy: 503, or a body too slow: 408)
REQUESTS = Counter("initshift_admission_requests_total", "AdmissionReview requests by outcome.",
                   ["outcome"], registry=REGISTRY)
# Admission webhooks time out after 10 s at most; buckets resolve the sub-millisecond path.
LATENCY = Histogram("initshift_admission_duration_seconds", "Time to answer one AdmissionReview.",
                    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                    registry=REGISTRY)
# result: rewritten, skipped, denied. reason: for rewritten pods the strategy applied
# (waiter, native, start-order) or `annotated` (native injection requested); otherwise
# why the pod was skipped or denied (the rewrite's slug, protected-namespace, internal-error).
PODS = Counter("initshift_pods_total", "Pod CREATE reviews by result and reason.", ["result", "reason"],
               registry=REGISTRY)
# reason: over-limit (INITSHIFT_MAX_CONNECTIONS), header-timeout (INITSHIFT_HEADER_TIMEOUT_SECONDS)
CONNECTIONS_CLOSED = Counter("initshift_connections_closed_total", "Connections the server closed to protect "
                             "itself, by reason.", ["reason"], registry=REGISTRY)
CERT_RELOADS = Counter("initshift_tls_reloads_total", "Serving certificate reloads by result.", ["result"],
                       registry=REGISTRY)
# certificate: serving (what the TLS port presents) or ca (self-managed: the CA that signs it).
# Several processes: the earliest expiry any of them serves (what an alert must see).
_CERT_EXPIRY = Gauge("initshift_certificate_expiration_timestamp_seconds",
                    "Unix time at which the certificate expires.", ["certificate"], registry=REGISTRY,
                    multiprocess_mode="livemin")
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


_SHARED: CollectorRegistry | None = None


def serving_registry() -> CollectorRegistry:
    """This process's registry; with several server processes, every live one's values,
    read from the shared multiprocess directory (process_* series: the serving process)."""
    global _SHARED
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    if _SHARED is None:
        _SHARED = CollectorRegistry()
        multiprocess.MultiProcessCollector(_SHARED)
        ProcessCollector(registry=_SHARED)
    return _SHARED


def exposition() -> tuple[bytes, str]:
    return generate_latest(serving_registry()), CONTENT_TYPE_LATEST
