"""Where the configuration reloads stand: what the ``kvcache_sidecar_config_*`` series export.

Core, no I/O: :mod:`sidecar.reload` (the edge that reads the files again) writes it, the exporter reads
it, so that the exporter never imports the reload machinery.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReloadStatus:
    """What the reload series export; replaced whole (the HTTP thread reads it while the loop writes)."""

    successful: bool
    last_success_s: float  # Unix time
    successes: int = 0
    failures: int = 0
