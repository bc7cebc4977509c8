"""How the user typed the command, for usage lines: imported by `initshift --help`, which
must stay instant (nothing else here)."""

from __future__ import annotations

import os
import sys

PLUGIN = "kubectl-initshift"  # the same entry point as a kubectl plugin (`kubectl initshift ...`)


def invoked_as() -> str:
    """`kubectl initshift` when kubectl ran the plugin, else `initshift`."""
    return "kubectl initshift" if os.path.basename(sys.argv[0]) == PLUGIN else "initshift"
