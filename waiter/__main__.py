"""`python -m waiter ...` (and the frozen executable's entry point)."""

import sys

from waiter.cli import main

sys.exit(main())
