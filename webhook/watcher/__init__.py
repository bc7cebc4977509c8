"""The companion controller: pure decisions over a managed pod, the controller that acts on
them (informers of webhook.kube, a store, a work queue with priorities, an Event recorder), Lease leader
election, and the one reader of a managed pod's state (which `initshift status` and `logs`
share)."""

from ._controller import Controller, WatcherStopped, run_watcher
from ._recorder import COMPONENT
from ._decide import FAILED, SUCCEEDED
from ._podstate import (ENDED_PHASES, INIT, MAIN, NOT_RUN, QUIET_WAITING, SIDECAR, STEP, WAITER_RUN, Layout, NotManaged,
                        Run, deletion_asked, layout, json_int, parse_time, pod_ended, ran_at, read_run, read_runs,
                        statuses)

__all__ = ["COMPONENT", "Controller", "ENDED_PHASES", "FAILED", "INIT", "MAIN", "NOT_RUN", "Layout", "NotManaged",
           "QUIET_WAITING", "Run", "SIDECAR", "STEP", "SUCCEEDED", "WAITER_RUN", "WatcherStopped", "deletion_asked",
           "json_int", "layout",
           "parse_time", "pod_ended", "ran_at", "read_run", "read_runs", "run_watcher", "statuses"]
