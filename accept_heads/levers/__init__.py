"""``python -m accept_heads.levers [+exp=NAME] [overrides]``: the dev table of the levers tried on each head.

A lever changes what the stop rule is fed. Each one tried here is a recalibration of an exported head fitted
on the decoder's own rounds — the candidates it visits when it drafts with that head (DAgger-style data,
beside the token-mixed prefixes the head was trained on), on as many prompts of the train split as dev has,
never dev or test —
against the true acceptance probability of each visited candidate (the hindsight target of the bounds,
DESIGN §5):

* ``platt``: ``σ(a·z + b)`` of the head's logit ``z`` (temperature scaling with a bias, fitted on
  the visited states rather than on token-mixed dev positions);
* ``decode-time``: ``σ(a·z + b + w·f)`` with the features the decoder has at decode time: the position
  in the round, the running keep-probability ``log Π P̂``, the previous round's accepted length, the
  draft's entropy and its change since the previous candidate;
* ``retrained``: the head itself fine-tuned on those candidates' inputs (its hidden state and features)
  against their true acceptance — one DAgger iteration (a fifth of the candidates held out to stop it);
* ``pre-draft`` (DSpark): a copy of the head fine-tuned on the same inputs against the acceptance probability of
  the *next* candidate before it is drawn, ``1 − TV(v, q)`` (:meth:`decode.rules.Rule.expected_accept`), so that
  the stop decides before drafting it: the threshold stop drafts ``y_{i+1}`` only while
  ``1 − Π_{j≤i} P̂_j · F̂_{i+1} ≤ h``, the goodput stop takes the forecast ``F̂_{i+1}`` instead of ``P̂_i`` for the
  undrafted candidates; ``pre-draft-linear``: the forecast a logistic regression on the round features.
  The next candidate's label is observed for every visited decision, stops included: where the head stops,
  the logging run drafts one candidate more to read it and withdraws it uncounted;
* ``perfect-pre-draft`` (a reference, never kept): the same stops fed the truth — the next candidate's
  acceptance probability before its draw, read in hindsight — the room a pre-draft forecast has on dev.

``evaluate.levers`` names the levers tried. Each variant and the head as exported decode the dev prompts with the
threshold stop (``h`` chosen on dev for each of them over the heads' ``h`` grid in the evaluation,
``evaluate.grids.head`` over the declared one) and with the goodput stop; a lever's effect is its throughput over the
head's at the evaluation's ``cost`` model (``cost.source``: the configured pair or this machine's measured costs), with
a 95 % paired-bootstrap interval over the dev prompts. A lever is kept only if the interval's
lower end is above 1. Writes ``levers.csv`` and ``levers.json`` under ``<evaluate.out_dir>/levers``.

By role: :mod:`~accept_heads.levers.lever_policies` (the length policies a lever feeds),
:mod:`~accept_heads.levers.fitting` (fitting a lever on the visited rounds), :mod:`~accept_heads.levers.driver`
(trying them on each head) and the CLI (``__main__``).
"""
