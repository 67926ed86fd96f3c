"""This machine's cost profile of an experiment's models: the prices ``cost.source=measured`` models the evaluation at.

    python -m benchmarks.costs [--exp smollm2] [--compiled] [--repeats 10] [--threads N] [--refresh] [OVERRIDE ...]

Loads the experiment's models as the evaluation does (``+exp=NAME`` and any Hydra overrides of it, such as
``models.draft.id=real:smollm2/draft``: their ids, dtypes and device) and reads this
machine's stored profile of them, measuring it first where there is none or it is stale
(:func:`accept_heads.measure.machine_costs.machine_profile`; the evaluation, the heads' ``h`` and the levers reuse
what this stores). Prints the machine class, the dtype, the target's forward of ``m = 1..16`` tokens at batch 1 on a
cached context, ``T(m)`` and ``T(m)/T(1)``, the draft's and the companion's one-token steps over the target's, eager
and (``--compiled``) compiled, and the cost model the evaluation prices at.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from rich.console import Console
from rich.table import Table

from accept_heads.measure.machine_costs import CostsSource, machine_profile
from ahconf.entry import CONF_DIR, USER_ERRORS, quiet_library_output, to_config
from ahconf.schema import Config
from decode.batch_costs import CostProfile
from decode.threads import torch_threads
from runtime.models import load_trio
from runtime.placement import place

EXPERIMENTS = sorted(path.stem for path in (Path(CONF_DIR) / "exp").glob("*.yaml"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp", choices=EXPERIMENTS, default="smollm2",
                        help="the experiment whose models are priced (default smollm2, the real pair)")
    parser.add_argument("--compiled", action="store_true",
                        help="time compiled forwards too (default: the experiment's decoding.compile)")
    parser.add_argument("--repeats", type=int, default=10, help="timed forwards per shape, median (default 10)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: the experiment's decoding.threads, which the evaluation "
                             "prices at; the profile is stored per thread count)")
    parser.add_argument("--refresh", action="store_true", help="measure again even where a profile is stored")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra overrides of the experiment's config, e.g. models.draft.id=real:smollm2/draft")
    args = parser.parse_args(argv)
    if args.repeats < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--repeats and --threads must be >= 1")
    return args


def experiment(name: str, overrides: list[str]) -> Config:
    """The composed config of ``+exp=name`` with ``overrides``."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_config(compose(config_name="config", overrides=[f"+exp={name}", *overrides]))


def measured_kinds(profile: CostProfile) -> list[bool]:
    """Eager (False), and compiled (True) where the profile has it."""
    return [False] + ([True] if profile.compiled is not None else [])


def profile_table(profile: CostProfile) -> Table:
    """``T(m)`` in ms and ``T(m)/T(1)`` for every measured ``m``, eager and, where measured, compiled."""
    kinds = measured_kinds(profile)
    out = Table(title="the target's forward of m tokens, batch 1, on a cached context", title_justify="left")
    out.add_column("m (tokens fed)", justify="right")
    for compiled in kinds:
        name = "compiled" if compiled else "eager"
        out.add_column(f"T(m) ms, {name}", justify="right")
        out.add_column(f"T(m)/T(1), {name}", justify="right")
    columns = [(profile.costs(c).target[0], profile.ratios(c)) for c in kinds]
    for i in range(len(profile.ratios())):
        out.add_row(str(i + 1), *[cell for times, ratios in columns for cell in (f"{1e3 * times[i]:.2f}",
                                                                                   f"{ratios[i]:.3f}")])
    return out


def summary(profile: CostProfile, source: CostsSource, compiled: bool) -> list[str]:
    """The steps' shares, the evaluation's cost model and where the profile is stored."""
    lines = []
    for fast in measured_kinds(profile):
        shares = ", ".join(f"{name} {share:.3f}" for name, share in profile.shares(fast).items())
        lines.append(f"one-token step / target step T(1), {'compiled' if fast else 'eager'}: {shares}")
    fast = compiled and profile.compiled is not None
    model = profile.cost_model(fast)
    lines.append(f"cost.source=measured prices ({'compiled' if fast else 'eager'}): "
                 f"t_d = {1e3 * model.t_draft:.2f} ms, t_c = {1e3 * model.t_companion:.2f} ms, "
                 f"t_t = T(2) = {1e3 * model.t_target:.2f} ms with "
                 f"shape(L) = T(L+1)/T(2), the target alone T(1) = {1e3 * model.target_alone:.2f} ms a token")
    lines.append(f"profile: {source.path} ({'stored earlier' if source.reused else 'measured now'})")
    return lines


def main(argv: list[str] | None = None) -> CostProfile:
    args = parse_args(argv)
    quiet_library_output()
    try:
        config = experiment(args.exp, args.overrides)
        torch_threads(args.threads or config.decoding.threads)
        trio = load_trio(config.models, config.paths.zoo_dir)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    place(trio)
    compiled = args.compiled or config.decoding.compile
    profile, source = machine_profile(trio.target, trio.draft, trio.companion, models=trio.description.to_dict(),
                                      repeats=args.repeats, compiled=compiled, refresh=args.refresh)
    console = Console(width=140)
    described = trio.description
    console.print(f"{profile.machine}; {profile.dtype}; models {described.name}: "
                  + ", ".join(f"{role} {model.id}" for role, model in (("target", described.target),
                                                                       ("draft", described.draft),
                                                                       ("companion", described.companion))
                              if model is not None), markup=False)
    console.print(profile_table(profile))
    for line in summary(profile, source, compiled):
        console.print(line, markup=False)
    return profile


if __name__ == "__main__":
    main()
