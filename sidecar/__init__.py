"""kv-cache-sidecar: KV-cache capacity monitor for LLM inference servers."""

__version__ = "0.1.0"
