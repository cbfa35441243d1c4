"""Suite-wide settings. Shared fixture paths live in tests/paths.py (`from paths import SHARED`)."""

from __future__ import annotations

import os

from hypothesis import settings

# CI must not flake on a lucky draw: property tests replay the same examples there.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
