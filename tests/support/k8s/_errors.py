"""The one error the cluster launcher raises: what failed, in one line, with the log to read."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """A component did not start, or the machine lacks something the cluster needs."""
