"""The config layer between the decode library and the pipeline stages (runtime, data_gen, model_build,
accept_heads).

:mod:`ahconf.schema`: the structured config dataclasses every Hydra entry point composes onto;
:mod:`ahconf.entry`: what those entry points share (config → typed objects, dry runs, one-line
errors). It imports omegaconf, hydra and :mod:`decode`; never a package above it.
"""
