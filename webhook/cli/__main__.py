"""`python -m webhook.cli`: the `initshift` command."""

import sys

from . import main

sys.exit(main())
