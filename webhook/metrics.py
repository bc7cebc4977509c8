"""Prometheus metrics of the admission server.

`REGISTRY` is the one registry `/metrics` serves; other parts of the process (the
watcher) register their own collectors on it, so one scrape sees everything. Several
server processes share their values through prometheus_client's multiprocess mode, so
gauges say how to combine the processes' values (`multiprocess_mode`).
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

# outcome: patched, allowed (unchanged), denied, error (internal, per failure mode), bad_request,
# refused (busy: 503, or a body too slow: 408)
REQUESTS = Counter("initshift_admission_requests_total", "AdmissionReview requests by outcome.",
                   ["outcome"], registry=REGISTRY)
# Admission webhooks time out after 10 s at most; buckets resolve the sub-millisecond path.
LATENCY = Histogram("initshift_admission_duration_seconds", "Time to answer one AdmissionReview.",
                    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                    registry=REGISTRY)
# result: rewritten, skipped, denied; reason: the rewrite's slug (or protected-namespace, internal-error)
PODS = Counter("initshift_pods_total", "Pod CREATE reviews by result and reason.", ["result", "reason"],
               registry=REGISTRY)
# reason: over-limit (INITSHIFT_MAX_CONNECTIONS), header-timeout (INITSHIFT_HEADER_TIMEOUT_SECONDS)
CONNECTIONS_CLOSED = Counter("initshift_connections_closed_total", "Connections the server closed to protect "
                             "itself, by reason.", ["reason"], registry=REGISTRY)
CERT_RELOADS = Counter("initshift_tls_reloads_total", "Serving certificate reloads by result.", ["result"],
                       registry=REGISTRY)


def exposition() -> tuple[bytes, str]:
    """This process's registry; with several server processes (webhook/admission/_workers.py)
    every worker's values, read from the shared multiprocess directory."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    ProcessCollector(registry=registry)  # process_* series: the worker that answered
    return generate_latest(registry), CONTENT_TYPE_LATEST
