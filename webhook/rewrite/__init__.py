"""The pure rewrite: classification, the waiter and native strategies, declared start
order, resources, and the safety net that never lets an invalid pod out. No I/O."""

from ._classify import classify, managed_as
from ._entrypoint import (EntrypointResolver, ImageConfig, ImageEntrypoints, Lookup, UnresolvedEntrypoint,
                          effective_argv)
from ._native import resolve_support
from ._resources import is_restartable
from ._rewrite import RewriteResult, lookups_needed, rewrite
from ._start_order import start_order_ready_patch

__all__ = ["EntrypointResolver", "ImageConfig", "ImageEntrypoints", "Lookup", "RewriteResult", "UnresolvedEntrypoint",
           "classify", "effective_argv", "is_restartable", "lookups_needed", "managed_as", "resolve_support",
           "rewrite", "start_order_ready_patch"]
