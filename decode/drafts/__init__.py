"""Draft kinds behind one interface (:class:`Drafter`), registered by their config class: the plain draft and the
feature draft (``docs/design.md`` §8). Importing the package registers both."""

from decode.drafts.base import DRAFTERS, Drafter, DraftFeed, TargetObserver, drafter_of, register_drafter
from decode.drafts.feature import FeatureDrafter
from decode.drafts.plain import PlainDrafter

__all__ = ["DRAFTERS", "DraftFeed", "Drafter", "FeatureDrafter", "PlainDrafter", "TargetObserver", "drafter_of",
           "register_drafter"]
