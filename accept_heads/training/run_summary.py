"""End-of-run summary tables (rich) for trained heads and fitted SV profiles."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from accept_heads.training.outcomes import HeadOutcome, ProfileOutcome


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def print_head_summary(result: HeadOutcome) -> None:
    """Artifacts and dev metrics against the constant predictor."""
    dev = result.dev_metrics
    table = Table(title=f"accept_heads.train — {result.name}", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("head", result.head_path)
    table.add_row("checkpoints", result.checkpoint_dir)
    table.add_row("head", f"timing={result.timing} depth={result.depth} rule={result.rule['name']}")
    if result.round_depths > 1:
        table.add_row("trained on", f"depths 1-{result.round_depths} of a round (the depth is an input)")
    kl, kl_constant = dev.get("val/binary_kl"), dev.get("val/binary_kl_constant")
    gain = ""
    if kl is not None and kl_constant is not None and kl_constant > 1e-6:
        change = 100 * (kl / kl_constant - 1)
        gain = f" ({abs(change):.1f}% {'lower' if change < 0 else 'higher'})"
    table.add_row("dev binary KL", f"{_fmt(kl)} vs constant predictor {_fmt(kl_constant)}{gain}")
    auroc = dev.get("val/auroc")
    table.add_row("dev AUROC", "undefined (every dev outcome the same)" if auroc is None else _fmt(auroc, 3))
    table.add_row("dev ECE", _fmt(dev.get("val/ece")))
    mean_pred, mean_label = _fmt(dev.get("val/mean_pred"), 3), _fmt(dev.get("val/mean_label"), 3)
    table.add_row("dev mean pred / label", f"{mean_pred} / {mean_label}")
    table.add_row("dev weighted BCE", _fmt(dev.get("val/weighted_bce")))
    table.add_row("h", "chosen on dev by python -m accept_heads.evaluate (recorded beside the head)")
    Console().print(table)


def print_profile_summary(result: ProfileOutcome) -> None:
    """Artifact, bins, information gain on dev and the latency profile."""
    info = result.information["dev"]
    table = Table(title=f"accept_heads.train — SV profile {result.name}", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("profile", result.profile_path)
    table.add_row("bins (X × Y)", f"{result.bins[0]} × {result.bins[1]} "
                  f"(requested {result.requested_bins[0]} × {result.requested_bins[1]})")
    table.add_row("backed-off bins", str(result.backed_off_bins))
    table.add_row("dev H(A)", f"{info.h_a:.4f} bits")
    table.add_row("dev H(A | X, Y)", f"{info.h_a_given_xy:.4f} bits")
    table.add_row("dev information gain", f"{info.gain:.4f} bits ({100 * info.gain_fraction:.1f}% of H(A); "
                  f"shuffle-corrected, plug-in {info.gain_plugin:.4f})")
    latency = ", ".join(f"{1000 * t:.2f}" for t in result.latency)
    table.add_row("latency L=1.. (ms)", f"{latency} on {result.latency_device}")
    for size, row in zip(result.batch_sizes or (), result.batch_latency or ()):
        table.add_row(f"B={size}: 1..{len(row)} tokens/row (ms)", ", ".join(f"{1000 * t:.2f}" for t in row))
    Console().print(table)
