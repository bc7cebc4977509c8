"""The pure rewrite: classification, the waiter, native and hybrid strategies, declared
start order, resources, and the safety net that never lets an invalid pod out. No I/O."""

from ._classify import classify, managed_as
from ._command import gate_of
from ._entrypoint import (EntrypointResolver, ImageConfig, ImageEntrypoints, Lookup, UnresolvedEntrypoint,
                          effective_argv)
from ._native import resolve_support
from ._quantity import QuantityError, parse as parse_quantity
from ._resources import is_restartable
from ._errors import RewriteError
from ._hold import removed_post_start, removed_startup_probes
from ._reasons import Reason
from ._rewrite import Plan, RewriteResult, plan, rewrite
from ._shape import MAX_DEPTH, depth_problem
from ._start_order import start_order_ready_patch

__all__ = ["EntrypointResolver", "ImageConfig", "ImageEntrypoints", "Lookup", "MAX_DEPTH", "Plan", "QuantityError",
           "Reason", "RewriteError", "RewriteResult", "UnresolvedEntrypoint", "classify", "depth_problem", "effective_argv",
           "gate_of", "is_restartable", "managed_as", "parse_quantity", "plan", "removed_post_start", "removed_startup_probes", "resolve_support", "rewrite",
           "start_order_ready_patch"]
