"""A machine's prices at batch 1, eager and compiled (DESIGN §5): :func:`measure_cost_profile`.

The target's forward of ``m = 1..SHORT`` tokens (every feed a compiled round runs compiled), the draft's and the
companion's, on a cached context of random ids, in the dtype the models were loaded in, with the models taking turns
(:func:`decode.batch_costs.forward_tables`). Compiled forwards are timed through the models' own
:class:`~decode.compile.model.CompiledModel` (:func:`compiled_forward`), the first call of each compiling every feed
length in the untimed warm-up round; they are opened by a :class:`~decode.compile.owner.CompiledModels` that the
measurement closes, unless the caller passes its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from torch import Tensor
from transformers import PreTrainedModel

from decode.batch_costs import CostProfile, measure_batch_costs
from decode.cache_api import drop_last
from decode.compile.config import SHORT
from decode.compile.owner import CompiledModels
from decode.drafts import drafter_of
from decode.timing import machine_class

CONTEXT = 128  # tokens of cached context every timed forward follows


@contextmanager
def compiled_forward(owner: CompiledModels, model: PreTrainedModel,
                     context: Tensor) -> Iterator[Callable[[Tensor], None]]:
    """With ``owner`` bound, the :data:`~decode.timing.ForwardFactory` of compiled forwards: a call feeding
    ``tokens [B, w]`` (``w <= SHORT``) through ``model``'s compiled forward (opened by ``owner``) on a pooled static
    cache holding ``context [B, C]``, the cache cut back after each call and given back to the pool at the end (so a
    later decode of that cache length on the same owner gets its graphs)."""
    compiled = owner.open([model])
    if compiled is None:
        raise ValueError(f"{type(model).__name__} cannot run compiled here")
    (fast,) = compiled
    cache = fast.acquire(context.shape[1] + fast.config.short)
    try:
        kind = drafter_of(model)
        inputs = kind.forward_inputs(model, context.to(model.device))
        fast(inputs.pop("input_ids"), cache, 1, **inputs)  # a new cache's first feed runs eager

        def forward(tokens: Tensor) -> None:
            fed = kind.forward_inputs(model, tokens)
            fast(fed.pop("input_ids"), cache, 1, **fed)
            drop_last(cache, tokens.shape[1])

        yield forward
    finally:
        fast.release(cache)


def measure_cost_profile(target: PreTrainedModel, draft: PreTrainedModel, companion: PreTrainedModel | None = None,
                         *, repeats: int, compiled: bool = False, context: int = CONTEXT,
                         owner: CompiledModels | None = None) -> CostProfile:
    """This machine's :class:`~decode.batch_costs.CostProfile` of the models: eager, and with ``compiled`` compiled too
    (left out, after the one warning line :class:`~decode.compile.owner.CompiledModels` gives, where a model cannot be
    compiled here or a compilation fails). The compiled forwards are ``owner``'s (left open), or opened here and closed
    at the end."""
    measure = partial(measure_batch_costs, target, draft, batches=(1,), max_length=SHORT, context=context,
                      repeats=repeats, companion=companion)
    eager = measure()
    fast = None
    models = [model for model in (target, draft, companion) if model is not None]
    if compiled:
        opened = CompiledModels() if owner is None else owner
        try:
            if (handles := opened.open(models)) is not None:
                fast = measure(forward=partial(compiled_forward, opened))
                if any(handle.failed for handle in handles):
                    fast = None
        finally:
            if owner is None:
                opened.close()
    return CostProfile(machine_class(target.device), str(target.dtype).removeprefix("torch."), eager, fast)

