"""`python -m webhook.cli`: the `initshift` command."""

import sys

from ._main import main

sys.exit(main())
