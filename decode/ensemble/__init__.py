"""Speculative Ensemble decoding (DESIGN §4): n models, alternate proposals, its counters."""

from decode.ensemble.decoder import EnsembleDecoder, EnsembleOutput
from decode.ensemble.ensemble_stats import EnsembleStats

__all__ = ["EnsembleDecoder", "EnsembleOutput", "EnsembleStats"]
