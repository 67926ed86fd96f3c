"""The prompt record: one prompt as a prompt set gives it, before any template is applied."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """One prompt, before any template is applied.

    ``text`` is the prompt proper (an instruction, a question, a code prefix); ``context`` is
    optional extra input that goes with it (Alpaca's ``input`` field); ``reference`` is a
    reference answer or the text that really follows, when the source has one.
    """

    id: str
    text: str
    source: str
    split: str
    style: str
    context: str = ""
    reference: str | None = None

    @property
    def message(self) -> str:
        """The whole user message: ``text``, then ``context`` after a blank line if there is one."""
        return f"{self.text}\n\n{self.context}" if self.context else self.text
