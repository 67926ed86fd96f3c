"""Artifacts on disk and on the hub: heads and profiles in safetensors with metadata, model cards, model loading."""
