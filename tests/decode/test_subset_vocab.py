"""The reduced-vocabulary draft as a stock Llama (for engines that load only stock architectures)."""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from decode.subset_vocab import (
    SubsetVocabLlamaConfig,
    SubsetVocabLlamaForCausalLM,
    plain_greedy_agreement,
    plain_llama,
)

SUBSET = [3, 5, 8, 13]


def reduced_draft(seed: int) -> SubsetVocabLlamaForCausalLM:
    torch.manual_seed(seed)
    config = SubsetVocabLlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, draft_vocab_size=len(SUBSET))
    draft = SubsetVocabLlamaForCausalLM(config)
    draft.lm_head.token_ids.copy_(torch.tensor(SUBSET))
    return draft.eval()


def test_the_plain_export_scores_the_subset_as_the_draft_and_zero_elsewhere(tmp_path):
    draft = reduced_draft(0)
    ids = torch.randint(0, 32, (3, 12), generator=torch.Generator().manual_seed(1))
    plain_llama(draft).save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(plain) is LlamaForCausalLM and type(plain.config) is LlamaConfig
    with torch.no_grad():
        ours, theirs = draft(ids).logits, plain(ids).logits  # [3, 12, 32]
    off = [t for t in range(32) if t not in SUBSET]
    torch.testing.assert_close(theirs[..., SUBSET], ours[..., SUBSET])
    assert theirs[..., off].abs().max() == 0 and ours[..., off].max() < -1e30


def test_the_greedy_agreement_counts_where_the_export_proposes_another_token():
    """The agreement is the share of positions where both models' greedy tokens are the same, for a draft and for
    the same draft with its subset logits negated, which proposes off the subset somewhere (a control that the
    count can fall below one)."""
    ids = torch.randint(0, 32, (4, 16), generator=torch.Generator().manual_seed(2))
    shares = []
    for sign in (1.0, -1.0):
        draft = reduced_draft(0)
        draft.lm_head.weight.data.mul_(sign)
        with torch.no_grad():
            same = draft(ids).logits.argmax(-1) == plain_llama(draft)(ids).logits.argmax(-1)
        shares.append(plain_greedy_agreement(draft, ids))
        assert shares[-1] == same.float().mean().item()
    assert min(shares) < 1.0
