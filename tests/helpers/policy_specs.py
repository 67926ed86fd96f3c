"""Policy specs of every kind with the inputs they build from: a pre head with its metadata, an SV profile, costs, and
measured batch costs for the kinds that decide at them."""

from __future__ import annotations

from dataclasses import replace

import torch

from decode import AcceptanceHead, HeadConfig, SVProfile
from decode.batch_costs import BatchCosts
from decode.costs import CostModel
from decode.head import PRE_FEATURES
from decode.metadata import HeadMetadata
from decode.policies.base import PolicyInputs
from decode.policy_specs import (
    ConfidenceSpec,
    FixedSpec,
    HeuristicSpec,
    OracleSpec,
    PolicySpec,
    RefitConfidenceSpec,
    SourceStopSpec,
    SVIPSpec,
    SVSpec,
)
from decode.rules import Speculative
from decode.sampling import Sampling

#: One spec of each kind that builds from :func:`policy_inputs` alone.
SPECS = [FixedSpec(4), HeuristicSpec(), ConfidenceSpec(0.3), SourceStopSpec("confidence", "h", 0.6),
         SourceStopSpec("confidence", "goodput"), RefitConfidenceSpec(), SVIPSpec(0.9),
         SourceStopSpec("adaedl", "goodput", 0.1), SourceStopSpec("margin", "h", 0.5),
         SourceStopSpec("margin", "goodput"), SourceStopSpec("vllm", "h", 0.5), SourceStopSpec("vllm", "goodput"),
         SourceStopSpec("head", "h", 0.8, "pre"),
         SourceStopSpec("head", "goodput", head="pre"), SourceStopSpec("head-online", "h", 0.8, "pre"),
         SourceStopSpec("head-online", "goodput", head="pre"), SVSpec("profile"), SVSpec("profile", k=3),
         SourceStopSpec("perfect", "h", 0.7), SourceStopSpec("perfect", "goodput"), OracleSpec()]
#: The kinds that decide at measured batch costs (built with ``PolicyInputs.batch_costs``).
BATCH_SPECS = [SourceStopSpec("head", "budget", head="pre"), SourceStopSpec("head-online", "budget", head="pre"),
               SourceStopSpec("margin", "budget"), SourceStopSpec("vllm", "budget"),
               SourceStopSpec("confidence", "budget"), SourceStopSpec("adaedl", "budget", 0.1)]
#: Measured batch costs at batch 1 and 4 (what the budget kinds need).
COSTS = BatchCosts(batches=(1, 4), draft=(0.1, 0.2), target=((1.0, 1.1, 1.2), (1.5, 1.8, 2.1)))


def buildable(spec: PolicySpec, inputs: PolicyInputs) -> PolicyInputs:
    """``inputs`` with the measured batch costs where ``spec`` needs them."""
    return replace(inputs, batch_costs=COSTS) if spec in BATCH_SPECS else inputs


def policy_inputs() -> PolicyInputs:
    """A pre head (with its metadata, k in [2, 12]), an SV profile and costs, k_max 20; no batch costs."""
    head = AcceptanceHead(HeadConfig(8, depth=1, timing="pre", features=PRE_FEATURES))
    head.metadata = HeadMetadata(draft="draft", tokenizer_hash="x", rule=Speculative().spec(), sampling=Sampling(),
                                 head_config=head.config, k_min=2, k_max=12)
    profile = SVProfile(x_edges=torch.tensor([0.0, 1.0]), y_edges=torch.tensor([0.0, 1.0]), table=torch.ones(1, 1),
                        counts=torch.ones(1, 1), latency=torch.ones(6))
    return PolicyInputs(heads={"pre": head}, profiles={"profile": profile},
                        costs=CostModel(t_draft=0.2, t_target=1.0, t_companion=0.0), k_max=20)
