"""Prometheus metrics of the watcher, on the process-wide registry `/metrics` serves (the
watcher runs in one server process: its gauges combine as `livemax`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from ..metrics import REGISTRY

TRACKED = Gauge("initshift_watcher_pods_tracked", "Managed pods in flight the watcher keeps (finished ones are "
                "dropped).", registry=REGISTRY, multiprocess_mode="livemax")
# From the watch event that made an action due to its patch's answer: what the queue and the API add.
REACTION = Histogram("initshift_watcher_reaction_seconds",
                     "Seconds from the pod change that called for an action to its patch being written.",
                     buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=REGISTRY)
# From the pod's start to the ready annotation: image pulls and sidecar start-up dominate.
READY_LATENCY = Histogram("initshift_watcher_ready_latency_seconds",
                          "Seconds from pod start until every sidecar was Ready and the gate was opened.",
                          buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800), registry=REGISTRY)
OUTCOMES = Counter("initshift_watcher_outcomes_total", "Outcomes written, by result and how sidecars stopped.",
                   ["result", "sidecars_stopped_by"], registry=REGISTRY)
DEADLINES = Counter("initshift_watcher_deadline_terminations_total",
                    "Pods ended with activeDeadlineSeconds.", registry=REGISTRY)
API_ERRORS = Counter("initshift_watcher_api_errors_total", "Failed Kubernetes API calls, by call and HTTP status "
                     "(0: unreachable).", ["call", "status"], registry=REGISTRY)
LEADER = Gauge("initshift_watcher_leader", "1 while this replica holds the leader Lease.", registry=REGISTRY,
               multiprocess_mode="livemax")
# stage: steps (no outcome yet) or ending (outcome recorded, the pod still runs). Leader only.
IN_FLIGHT = Gauge("initshift_watcher_pods_in_flight", "Waiter-managed pods not ended yet, by stage.", ["stage"],
                  registry=REGISTRY, multiprocess_mode="livemax")
# A timestamp, not an age: it stays right between updates; 0 when no pod is ending.
OLDEST_ENDING = Gauge("initshift_watcher_oldest_ending_timestamp_seconds",
                      "When the outcome of the oldest pod still not ended was recorded (Unix time); 0: none.",
                      registry=REGISTRY, multiprocess_mode="livemax")


def export_in_flight(steps: int, ending: list[float]) -> None:
    """Set the in-flight gauges: pods running their steps, and the decision times (Unix
    time, 0 when unknown) of the pods whose outcome is written but that still run."""
    IN_FLIGHT.labels("steps").set(steps)
    IN_FLIGHT.labels("ending").set(len(ending))
    OLDEST_ENDING.set(min((t for t in ending if t), default=0.0))
