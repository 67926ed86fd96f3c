"""What every stage needs to run a trio: load it (:mod:`.models`, ``zoo:`` / ``real:`` ids through
:mod:`.schemes`), place it (:mod:`.placement`), turn prompts into token ids (:mod:`.prompt`, :mod:`.templates`,
:mod:`.encoding`), seed each prompt's draws (:mod:`.seeding`) and install a directory atomically (:mod:`.install`).

Layer 2: below data_gen, model_build and accept_heads, above ahconf and decode (tests/test_imports.py).
"""
