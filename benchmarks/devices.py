"""The benchmarks' ``--device`` option: one definition of its default and of the line a device that is not here gets."""

from __future__ import annotations

import argparse

import torch


def device(text: str) -> torch.device:
    """``text`` as a device this machine has (argparse ``type``): a bad name or a missing CUDA device is one line."""
    try:
        parsed = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} names no device; use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"no CUDA device here (torch {torch.__version__}); use --device cpu")
    if parsed.type == "cuda" and (parsed.index or 0) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return parsed


def add_device_option(parser: argparse.ArgumentParser, default: str | None = None, more: str = "") -> None:
    """``--device`` (default ``default``, else CUDA when available, else the CPU)."""
    default = default or ("cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--device", type=device, default=torch.device(default),
                        help=f"cpu, cuda, cuda:1 ... (default: {default}){more}")
