"""The frozen draft model turned into head inputs at the loss positions of a mixed batch.

The hidden state is the draft's final hidden state after its final norm — the input of its LM
head, the same tensor :class:`decode.loops.runner.ModelRunner` captures at decode time. It is read as
``last_hidden_state`` of the draft's decoder (``get_decoder()``), so full-vocabulary logits are
only computed where a ``pre`` head needs ``q_t``.

* ``post``: ``e_t`` = state at sequence position of ``z_t = y_t`` (the forward that consumed ``y_t``).
* ``pre``: the state at the position before (it produced ``q_t`` on the mixed prefix), plus
  :func:`decode.head.head_features` of ``y_t`` under that ``q_t`` — over the shared vocabulary and
  transformed exactly as the decoder does (``rule.transform(sampling).feature_probs``) — and, with
  ``head.use_companion``, the head's rule's stored companion indicators ``X_t, Y_t`` (columns ``sv_x_<rule>``,
  ``sv_y_<rule>``: :func:`decode.profile.companion_indicators` under the same transform, of the
  same candidate). Those were computed at the *unmixed* (true) prefix during collection: an
  approximation on top of token mixing.

A depth-dependent draft, such as a feature draft (:class:`RoundFeatures`), is read at every depth of a round along the
target's own prefix (:meth:`decode.drafts.Drafter.round_states`: a feature draft's reads the target's features from
one forward, then :func:`decode.drafts.feature_model.depth_hidden`); a ``pre`` head's input at
depth ``d`` is the draft's output that produced ``q_t`` at that depth, plus the candidate's features there and its
``depth`` (``docs/design.md`` §8), and the round so far is the summed ``log q`` of the candidates before it at
their own depths (:func:`round_so_far`).
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel

from decode.drafts import Drafter, drafter_of
from decode.head import HeadConfig as ArchConfig
from decode.head import candidate_log_q, head_features
from decode.head_config import REQUEST_FEATURE, ROUND_FEATURE
from decode.sampling import Sampling


class DraftFeatures:
    """Frozen draft → ``(hidden [M, H], features [M, F] | None)`` for the ``loss_mask`` positions.

    Not an ``nn.Module`` on purpose: a LightningModule holding it neither trains, checkpoints nor
    DDP-wraps the draft.
    """

    def __init__(self, draft: PreTrainedModel, arch: ArchConfig, feature_sampling: Sampling, vocab: int) -> None:
        self.draft = draft.eval().requires_grad_(False)
        self.arch = arch
        self.feature_sampling = feature_sampling
        self.vocab = vocab
        self.softcap = getattr(draft.config, "final_logit_softcapping", None)
        self.reads_request = REQUEST_FEATURE in arch.features

    @property
    def device(self) -> torch.device:
        return self.draft.device

    def to(self, device: torch.device | str) -> DraftFeatures:
        """Move the draft (no-op when it is already there)."""
        if self.draft.device != torch.device(device):
            self.draft.to(device)
        return self

    def q_logits(self, hidden: Tensor) -> Tensor:
        """Float logits of the draft's LM head (with its final soft-capping, if any) for ``hidden``, sliced to the
        shared vocabulary ``vocab`` the collection and the decoder use (padding rows are never tokens)."""
        logits = self.draft.get_output_embeddings()(hidden)[..., : self.vocab].float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @torch.no_grad()
    def __call__(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
        device = self.device
        states = self.draft.get_decoder()(
            input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)
        ).last_hidden_state
        rows, positions = batch["loss_mask"].to(device).nonzero(as_tuple=True)
        if self.arch.timing == "post":
            return states[rows, positions].float(), None
        hidden = states[rows, positions - 1]
        q = self.feature_sampling.feature_probs(self.q_logits(hidden))
        candidates = batch["candidate"].to(device)[rows, positions]
        companion = None
        if self.arch.companion_features:
            stored = batch["companion"].to(device)[rows, positions]
            companion = (stored[:, 0], stored[:, 1])
        previous = batch["input_ids"].to(device)[rows, positions - 1]  # the (mixed) token that produced q_t
        request = batch["request"].to(device)[rows, positions] if self.reads_request else None
        return hidden.float(), head_features(q, candidates, self.arch.features, companion, previous=previous,
                                             request=request)


class RoundFeatures(DraftFeatures):
    """Frozen target + depth-dependent draft → ``(hidden [M, D, H], features [M, D, F])`` at the ``loss_mask``
    positions, one per depth ``1 .. D = arch.depths`` of a round (``pre`` heads only; candidates ``[B, W, D]`` in the
    batch)."""

    def __init__(self, target: PreTrainedModel | None, draft: PreTrainedModel, kind: Drafter, arch: ArchConfig,
                 feature_sampling: Sampling, vocab: int) -> None:
        if arch.timing != "pre":
            raise ValueError(f"a {kind.name} draft's head reads the state that produced q at each depth: timing='pre'")
        super().__init__(draft, arch, feature_sampling, vocab)
        self.kind = kind
        self.target = target.eval().requires_grad_(False) if target is not None else None

    def to(self, device: torch.device | str) -> RoundFeatures:
        """Move the target and the draft (no-op when they are already there)."""
        if self.target is not None and self.target.device != torch.device(device):
            self.target.to(device)
        super().to(device)
        return self

    @torch.no_grad()
    def __call__(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
        device = self.device
        depths = self.arch.depths
        outputs = self.kind.round_states(self.target, self.draft, batch["input_ids"].to(device),
                                         batch["attention_mask"].to(device), depths)
        rows, positions = batch["loss_mask"].to(device).nonzero(as_tuple=True)
        hidden = torch.stack([h[rows, positions - 1] for h in outputs], dim=1)  # [M, D, H]
        q = self.feature_sampling.feature_probs(self.q_logits(hidden))
        candidates = batch["candidate"].to(device)[rows, positions].reshape(len(rows), depths)
        depth = torch.arange(1, depths + 1, device=device)
        # what produced q_t at depth d: the target's token x_{t−1} at d = 1, the round's candidate at t − 1 after
        previous = torch.cat([batch["input_ids"].to(device)[rows, positions - 1, None],
                              batch["candidate"].to(device)[rows, positions - 1].reshape(len(rows), depths)[:, :-1]],
                             dim=1)
        # the request so far at the round's start t − d + 1, as the decoder reads it for the whole round
        starts = (positions[:, None] - torch.arange(depths, device=device)).clamp_min(0)
        request = batch["request"].to(device)[rows[:, None], starts] if self.reads_request else None
        round_log_q = None
        if ROUND_FEATURE in self.arch.features:
            round_log_q = round_so_far(candidate_log_q(q, candidates), rows, positions, batch["input_ids"].shape)
        return hidden.float(), head_features(q, candidates, self.arch.features, depth=depth, previous=previous,
                                             request=request, round_log_q=round_log_q)


def round_so_far(log_q: Tensor, rows: Tensor, positions: Tensor, shape: torch.Size) -> Tensor:
    """``[M, D]``: at the candidate of position ``t`` and depth ``d``, the summed ``log_q [M, D]`` of its round's
    earlier candidates, ``(t − d + j, j)`` for ``j < d`` (:data:`decode.head_config.ROUND_FEATURE`), from the
    candidates at ``(rows, positions)`` of a ``shape = [B, W]`` batch (a round reaching before them reads 0 there)."""
    depths = log_q.shape[1]
    grid = log_q.new_zeros(*shape, depths)
    grid[rows, positions] = log_q
    total = torch.zeros_like(log_q)
    for d in range(1, depths):
        for j in range(d):
            total[:, d] += grid[rows, (positions - d + j).clamp_min(0), j]
    return total


def head_encoder(draft: PreTrainedModel, arch: ArchConfig, feature_sampling: Sampling, vocab: int,
                 target: PreTrainedModel | None = None) -> DraftFeatures:
    """What turns a batch into a head's inputs: the draft alone, or a depth-dependent draft read along ``target``'s
    rounds."""
    kind = drafter_of(draft)
    if not kind.depth_dependent:
        return DraftFeatures(draft, arch, feature_sampling, vocab)
    if target is None and kind.reads_target:
        raise ValueError(f"a {kind.name} draft's head inputs need the target's forward: pass the target")
    return RoundFeatures(target, draft, kind, arch, feature_sampling, vocab)
