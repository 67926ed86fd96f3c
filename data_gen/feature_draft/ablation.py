"""``python -m data_gen.feature_draft.ablation``: now ``python -m model_build.feature_draft.ablation``
(:mod:`data_gen.renamed`)."""

from data_gen.renamed import forward

if __name__ == "__main__":
    forward("data_gen.feature_draft.ablation", "model_build.feature_draft.ablation")
