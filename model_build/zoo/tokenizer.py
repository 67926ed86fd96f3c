"""Byte-level BPE tokenizer trained on the zoo's training text."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, PAD)


def train_tokenizer(texts: Sequence[str], vocab_size: int, context: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of ``vocab_size`` tokens (specials included) on ``texts``.

    The tokenizer adds no special tokens on its own: training windows are arbitrary slices of a
    ``<|bos|> module <|eos|>`` stream, so prompts need no ``<|bos|>``. A newline is always a token of
    its own (as in Llama's and most code tokenizers): with GPT-2's rule it merges with the next line's
    indentation (``"\n   "``), so a prompt ending in a newline would end on a token that in training
    only ever precedes column-0 text — and the target would never indent the body it is asked for.
    """
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=context,
    )
