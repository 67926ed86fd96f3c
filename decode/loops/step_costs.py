"""A machine's prices at batch 1, eager and compiled (DESIGN §5): :func:`measure_cost_profile`.

The target's forward of ``m = 1..SHORT`` tokens (every feed a compiled round runs compiled), the draft's and the
companion's, on a cached context of random ids, in the dtype the models were loaded in, with the models taking turns
(:func:`decode.batch_costs.forward_tables`). Compiled forwards are timed through the models' own
:class:`~decode.loops.compiled.CompiledModel` (:func:`compiled_forward`), the first call of each compiling every feed
length in the untimed warm-up round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from torch import Tensor
from transformers import PreTrainedModel

from decode.batch_costs import CostProfile, measure_batch_costs
from decode.cache_api import drop_last
from decode.loops.compiled import SHORT, compiled_models
from decode.timing import forward_inputs, machine_class

CONTEXT = 128  # tokens of cached context every timed forward follows


@contextmanager
def compiled_forward(model: PreTrainedModel, context: Tensor) -> Iterator[Callable[[Tensor], None]]:
    """The :data:`~decode.timing.ForwardFactory` of compiled forwards: a call feeding ``tokens [B, w]`` (``w <= SHORT``)
    through ``model``'s compiled forward on a pooled static cache holding ``context [B, C]``, the cache cut back after
    each call and given back to the pool at the end (so a later decode of that cache length gets its graphs)."""
    compiled = compiled_models([model])
    if compiled is None:
        raise ValueError(f"{type(model).__name__} cannot run compiled here")
    (fast,) = compiled
    cache = fast.acquire(context.shape[1] + SHORT)
    try:
        inputs = forward_inputs(model, context.to(model.device))
        fast(inputs.pop("input_ids"), cache, 1, **inputs)  # a new cache's first feed runs eager

        def forward(tokens: Tensor) -> None:
            fed = forward_inputs(model, tokens)
            fast(fed.pop("input_ids"), cache, 1, **fed)
            drop_last(cache, tokens.shape[1])

        yield forward
    finally:
        fast.release(cache)


def measure_cost_profile(target: PreTrainedModel, draft: PreTrainedModel, companion: PreTrainedModel | None = None,
                         *, repeats: int, compiled: bool = False, context: int = CONTEXT) -> CostProfile:
    """This machine's :class:`~decode.batch_costs.CostProfile` of the models: eager, and with ``compiled`` compiled too
    (left out, after the one warning line :mod:`decode.loops.compiled` gives, where a model cannot be compiled here
    or a compilation fails)."""
    measure = partial(measure_batch_costs, target, draft, batches=(1,), max_length=SHORT, context=context,
                      repeats=repeats, companion=companion)
    eager = measure()
    fast = None
    models = [model for model in (target, draft, companion) if model is not None]
    if compiled and (handles := compiled_models(models)) is not None:
        fast = measure(forward=compiled_forward)
        if any(handle.failed for handle in handles):
            fast = None
    return CostProfile(machine_class(target.device), str(target.dtype).removeprefix("torch."), eager, fast)

