"""Root test configuration. Shared paths live in tests/paths.py (import them from there)."""

from paths import CPU_032, METRICS, MODEL_CONFIGS, SHARED  # noqa: F401  (re-exported for older imports)
