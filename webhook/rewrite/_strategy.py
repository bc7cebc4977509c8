"""The one shape of a strategy: `build(pod, cls, settings, images, lookup_error) -> Built`.

`_waiter.build`, `_native.build` and `_hybrid.build` each take the pod as admitted and
its classification, and return the rewritten pod (a new dict sharing what it leaves alone
with its input), the warnings to give, and the reason; they raise RewriteError for a pod
they cannot handle. `images` holds the image configurations the registry lookup found for
the plan's lookups, and `lookup_error` why that lookup failed (the message for a container
whose image is missing); strategies that wrap no container ignore both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..settings import RewriteSettings
from ._classify import Classification
from ._entrypoint import ImageEntrypoints
from ._reasons import Reason


@dataclass
class Built:
    pod: dict
    warnings: list[str] = field(default_factory=list)
    reason: Reason = Reason.REWRITTEN


Build = Callable[[Mapping, Classification, RewriteSettings, Mapping[str, ImageEntrypoints], "str | None"], Built]
