"""Speculative decoding with pluggable verification rules and length policies.

Imports only torch, transformers, safetensors and the standard library.
"""

from decode import policies, rules
from decode.artifacts.serialization import load_head, load_profile, save_head, save_profile, write_card
from decode.artifacts.speculators import export_speculators, load_speculators
from decode.ensemble.decoder import EnsembleDecoder, EnsembleOutput
from decode.ensemble.ensemble_stats import EnsembleStats
from decode.ensemble_fn import EnsembleFn
from decode.head import AcceptanceHead, HeadConfig
from decode.loops.batched import BatchDecodeOutput, BatchTotals, row_seed
from decode.loops.hf_generate import SpeculativeGenerateOutput, generate_from_repo, speculative_generate
from decode.loops.speculative_decoder import DecodeOutput, SpeculativeDecoder
from decode.metadata import HeadMetadata, ProfileMetadata
from decode.profile import SVProfile
from decode.sampling import Sampling
from decode.stats import DecodeStats

__all__ = [
    "AcceptanceHead",
    "BatchDecodeOutput",
    "BatchTotals",
    "DecodeOutput",
    "DecodeStats",
    "EnsembleDecoder",
    "EnsembleFn",
    "EnsembleOutput",
    "EnsembleStats",
    "HeadConfig",
    "HeadMetadata",
    "ProfileMetadata",
    "SVProfile",
    "Sampling",
    "SpeculativeDecoder",
    "SpeculativeGenerateOutput",
    "export_speculators",
    "generate_from_repo",
    "load_head",
    "load_profile",
    "load_speculators",
    "policies",
    "row_seed",
    "rules",
    "save_head",
    "save_profile",
    "speculative_generate",
    "write_card",
]
