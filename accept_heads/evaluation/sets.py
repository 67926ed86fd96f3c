"""The prompt sets an evaluation decodes: dev (selection), test, and the out-of-distribution sets."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from ahconf.schema import Config
from data_gen.encoding import EncodedPrompt, encode_prompts
from data_gen.prompts import available_splits, load_prompts, parse_source

#: Load this many times the wanted count, so that prompts skipped as too long can be replaced.
_OVERSAMPLE = 4


@dataclass(frozen=True)
class PromptSet:
    """Encoded prompts of one set; ``role`` is ``dev``, ``test`` or ``ood``."""

    name: str
    role: str
    source: str
    style: str | None
    split: str
    prompts: list[EncodedPrompt]
    skipped: dict[str, int]

    def key(self) -> dict[str, str]:
        """The set's columns in a results row."""
        return {"role": self.role, "split": self.split}

    def describe(self) -> dict[str, object]:
        """Metadata: where the prompts come from and which ones were used."""
        return {
            "name": self.name, "role": self.role, "source": self.source, "style": self.style, "split": self.split,
            "count": len(self.prompts), "skipped": self.skipped, "prompt_ids": [p.prompt_id for p in self.prompts],
        }


def ood_split(source: str) -> str:
    """The split an out-of-distribution source is read from: ``test`` when it has one, else its last."""
    splits = available_splits(source)
    return "test" if "test" in splits else splits[-1]


def _load(config: Config, tokenizer: PreTrainedTokenizerBase, budget: int, *, name: str, role: str,
          source: str, style: str | None, split: str, count: int) -> PromptSet:
    p = config.prompts
    raw = load_prompts(source, split, size=count * _OVERSAMPLE, style=style, seed=config.seed,
                       revision=p.revision if role != "ood" else None, text_field=p.text_field,
                       sizes=p.sizes if role != "ood" else None)
    encoded, skipped = encode_prompts(raw, tokenizer, p.template, budget, p.truncation)
    if not encoded:
        raise ValueError(f"prompt set {name!r}: every prompt was skipped ({skipped}); raise prompts.max_prompt_tokens")
    return PromptSet(name, role, source, style, split, encoded[:count], skipped)


def load_sets(config: Config, tokenizer: PreTrainedTokenizerBase, context: int) -> list[PromptSet]:
    """dev, test (the configured source) and every ``prompts.ood`` set, sized by ``evaluate.prompts``."""
    sizes = config.evaluate.prompts
    budget = min(config.prompts.max_prompt_tokens, context - config.evaluate.max_new_tokens - 2)
    if budget < 1:
        raise ValueError(f"evaluate.max_new_tokens={config.evaluate.max_new_tokens} leaves no room for a prompt "
                         f"in the models' context of {context} tokens")
    p = config.prompts
    sets = [_load(config, tokenizer, budget, name=split, role=split, source=p.source, style=p.style, split=split,
                  count=sizes[split]) for split in ("dev", "test")]
    for spec in p.ood:
        source, style = parse_source(spec)
        sets.append(_load(config, tokenizer, budget, name=spec, role="ood", source=source, style=style,
                          split=ood_split(source), count=sizes["ood"]))
    return sets
