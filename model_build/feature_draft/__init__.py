"""Feature-conditioned (EAGLE-style) drafts for any target: the target's data in shards, then training.

``python -m model_build.feature_draft`` runs both (:mod:`.shards`, :mod:`.training`); the model itself is
:mod:`decode.drafts.feature_model`. ``docs/design.md`` §8 has the math, ``docs/real.md`` the SmolLM2 run.
"""
