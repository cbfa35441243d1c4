"""Engine adapters other than vLLM's, each on its real pages and on the simulator's page of it."""
