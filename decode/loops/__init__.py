"""The decoding loops: one speculative round per step for a batch of rows, its KV caches, and the target alone."""
