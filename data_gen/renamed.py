"""The model builders' old command names, kept for one release: ``python -m data_gen.zoo`` (``.real``,
``.feature_draft``, ``.feature_draft.ablation``) says its new name on stderr and runs it.

The builders moved to :mod:`model_build`, a layer above this package, so a forwarder runs the new module by name
(:func:`runpy.run_module`) and imports nothing of it; tests/test_imports.py lists these forwarders as the only
modules of this layer that run another by name. Remove them with the next release.
"""

from __future__ import annotations

import runpy
import sys


def forward(old: str, new: str) -> None:
    """Print one note that ``python -m old`` is now ``python -m new``, then run ``new`` as ``__main__`` with the same
    arguments."""
    print(f"note: python -m {old} is now python -m {new} (the old name works for this release)", file=sys.stderr)
    runpy.run_module(new, run_name="__main__", alter_sys=True)
