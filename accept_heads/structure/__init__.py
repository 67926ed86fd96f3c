"""The structure of acceptance (``python -m accept_heads.structure``): along the target's responses to the test and
out-of-distribution prompts, acceptance by depth of the round and what the round so far, the request so far, the
position and the target's last state tell beyond the draft's top probability (docs/design.md §10)."""
