"""The companion controller: pure decisions over a managed pod, the watch loop that acts on
them, Lease leader election, and the reader of a managed pod's state that `initshift status`
and `logs` share."""

from ._controller import COMPONENT, run_watcher
from ._decide import FAILED, SUCCEEDED
from ._podstate import WAITER_RUN, Layout, NotManaged, layout, parse_time, statuses
from ._podview import (PodView, State, has_started, has_terminated, is_waiter_line, log_plan, pod_ended, pod_view,
                       state_text)

__all__ = ["WAITER_RUN", "COMPONENT", "FAILED", "Layout", "NotManaged", "PodView", "SUCCEEDED", "State", "has_started",
           "has_terminated", "is_waiter_line", "layout", "log_plan", "parse_time", "pod_ended", "pod_view",
           "run_watcher", "state_text", "statuses"]
