"""The one error type of the capacity model.

Every problem a user can cause (a missing config field, a tensor-parallel
size that does not divide the heads, a budget that leaves no room for KV)
raises :class:`CapacityError`. Its message names the field and the fix; the
CLI prints it on one line and exits 2, never with a traceback.
"""

from __future__ import annotations


class CapacityError(ValueError):
    """User-facing input error: the message names the field and the fix.

    Several problems found in one pass (a config.json with two impossible fields) are given as
    several messages: ``problems`` holds each, one line apiece; ``str()`` joins them with ``; ``.
    """

    def __init__(self, message: str, *more: str):
        self.problems: tuple[str, ...] = (message, *more)
        super().__init__("; ".join(self.problems))
