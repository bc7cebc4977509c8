"""`python -m waiter ...` (and the frozen executable's entry point)."""

from waiter.cli import run

run()
