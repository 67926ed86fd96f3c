"""Building the models the project ships and installs: the tiny-code trio (:mod:`.zoo`), the real pairs
(:mod:`.real`), feature-conditioned drafts (:mod:`.feature_draft`) and the store they install into, each file
verified by its sha256 (:mod:`.model_store`).

Layer 4, beside accept_heads (neither imports the other): it uses data_gen's prompts and generation to train and
measure. Model ids ``zoo:<role>`` and ``real:<pair>/<role>`` reach its resolvers through :mod:`runtime.schemes`.
"""
