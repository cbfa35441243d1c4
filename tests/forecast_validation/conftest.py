"""bench/ on sys.path: the tests replay through bench/replay.py and judge with bench/forecast.py's rules."""

from __future__ import annotations

import sys

from fixtures import REPO

sys.path.insert(0, str(REPO / "bench"))
