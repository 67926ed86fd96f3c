"""The shape and input contract of a SpecDec++ acceptance head (DESIGN §2), and the features it may read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from decode.json_types import JSONDict

Timing = Literal["post", "pre"]

#: Scalar features of the sampled candidate, available to a ``pre`` head without a draft call.
PRE_FEATURES: tuple[str, ...] = ("log_q", "entropy", "top_prob")
#: The candidate's depth in its round (1 for the first): a feature draft's ``q`` depends on it (``docs/design.md`` §8).
DEPTH_FEATURE = "depth"
#: The id of the token whose draft forward produced ``q_i`` (``y_{i−1}``, or the last committed token for ``i = 1``):
#: a DSpark-style head embeds it (its low-rank Markov embedding) instead of reading it as a number.
PREVIOUS_TOKEN = "previous_token"
#: The request so far: the rate at which its verified rounds accepted their first candidate, ``(a + 1) / (n + 2)`` after
#: ``a`` of ``n`` rounds (``docs/design.md`` §10: what a round's draft state cannot tell).
REQUEST_FEATURE = "request_acceptance"
#: The draft's second, third and fourth largest probabilities where it drew the candidate: how its mass spreads
#: beyond the top (``docs/design.md`` §2, "Heads that read more").
TOP_K_FEATURES: tuple[str, ...] = ("top2_prob", "top3_prob", "top4_prob")
#: The round so far: ``Σ_{j<i} log q_j(y_j)``, the draft's log probability of the round's earlier candidates (0 for
#: the first); their verdicts are unknown until the round is verified, so it reads none.
ROUND_FEATURE = "round_log_q"
#: Every feature a ``pre`` head may read of its candidate.
HEAD_FEATURES: tuple[str, ...] = (*PRE_FEATURES, DEPTH_FEATURE, PREVIOUS_TOKEN, REQUEST_FEATURE, *TOP_K_FEATURES,
                                  ROUND_FEATURE)
#: Companion SV indicators (DESIGN §3), optional extra features of a ``pre`` head.
COMPANION_FEATURES: tuple[str, ...] = ("companion_x", "companion_y")


@dataclass(frozen=True)
class HeadConfig:
    """Shape and input contract of an :class:`AcceptanceHead`.

    ``timing="post"``: input is the draft's final hidden state of the forward that consumed
    ``y_i``. ``timing="pre"``: input is the hidden state that produced ``q_i`` concatenated with
    ``features`` of the sampled ``y_i`` (plus the companion's ``X_i, Y_i`` when
    ``companion_features``). ``depths``: the round depths its labels covered; its ``depth`` feature, if it reads
    one, is the candidate's depth capped there. ``markov_rank > 0`` (DSpark, DESIGN §2): the ``previous_token``
    feature is looked up in a ``vocab_size × markov_rank`` embedding whose row joins the input.
    """

    hidden_size: int
    depth: int = 3
    timing: Timing = "post"
    features: tuple[str, ...] = field(default=())
    companion_features: bool = False
    depths: int = 1
    markov_rank: int = 0
    vocab_size: int = 0

    def __post_init__(self) -> None:
        if self.timing not in ("post", "pre"):
            raise ValueError(f"timing must be 'post' or 'pre', got {self.timing!r}")
        if self.depth < 0 or self.hidden_size < 1 or self.depths < 1:
            raise ValueError(f"need depth >= 0, hidden_size >= 1 and depths >= 1, got {self.depth}, "
                             f"{self.hidden_size}, {self.depths}")
        object.__setattr__(self, "features", tuple(self.features))
        if self.timing == "post" and (self.features or self.companion_features):
            raise ValueError("a 'post' head takes only the hidden state: no features, no companion features")
        unknown = set(self.features) - set(HEAD_FEATURES)
        if unknown:
            raise ValueError(f"unknown head features {sorted(unknown)}; valid: {', '.join(HEAD_FEATURES)}")
        if (self.markov_rank > 0) != (PREVIOUS_TOKEN in self.features) or self.markov_rank < 0:
            raise ValueError(f"the {PREVIOUS_TOKEN} feature and markov_rank > 0 go together (its embedding), got "
                             f"features {self.features}, markov_rank {self.markov_rank}")
        if self.markov_rank and self.vocab_size < 1:
            raise ValueError("a Markov embedding needs the vocabulary size it embeds (vocab_size >= 1)")

    def depth_of(self, i: int) -> int:
        """The ``depth`` feature of the ``i``-th candidate of a round (1-based): ``min(i, depths)``."""
        return min(i, self.depths)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """All scalar features in input order."""
        return self.features + (COMPANION_FEATURES if self.companion_features else ())

    @property
    def input_size(self) -> int:
        """Width of the blocks: hidden size, the scalar features and the Markov embedding's rank."""
        return self.hidden_size + len(self.feature_names) - (PREVIOUS_TOKEN in self.features) + self.markov_rank

    def to_dict(self) -> JSONDict:
        """JSON-ready form (tuples become lists; ``depths`` only where the labels had several and the Markov fields
        only where there is an embedding, so the document of a head without them is the one written before the
        fields existed)."""
        data = asdict(self)
        data["features"] = list(self.features)
        if self.depths == 1:
            del data["depths"]
        if not self.markov_rank:
            del data["markov_rank"], data["vocab_size"]
        return data

    @classmethod
    def from_dict(cls, data: JSONDict) -> HeadConfig:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**data, "features": tuple(data.get("features", ()))})
