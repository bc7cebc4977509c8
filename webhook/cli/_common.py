"""What several commands share: their settings, read once with a one-line error."""

from __future__ import annotations

import sys
from typing import Callable

from ..settings import Settings, SettingsError


def load_settings(prog: str, with_flags: Callable[[Settings], Settings] = lambda s: s) -> Settings | None:
    """INITSHIFT_* (and the command's flags on top); None once the error is printed as one line."""
    try:
        return with_flags(Settings.from_env())
    except SettingsError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
