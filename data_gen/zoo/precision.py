"""The zoo's training precision: bfloat16 autocast only where the CPU runs bfloat16 natively.

On CPUs without native bfloat16 (no AVX-512-BF16 / AMX, e.g. AMD Zen 3) PyTorch emulates it and a
training step under ``torch.autocast("cpu", bfloat16)`` is ~25–50× slower than float32, so ``auto``
chooses float32 there. The choice changes the trained bytes and is recorded in ``zoo.json``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

Precision = Literal["auto", "bf16", "fp32"]
PRECISIONS: tuple[str, ...] = ("auto", "bf16", "fp32")
#: ``/proc/cpuinfo`` flags of native bfloat16 matrix arithmetic.
NATIVE_BF16_FLAGS: tuple[str, ...] = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class TrainingPrecision:
    """The resolved choice: ``autocast_bf16`` and why it was made (stored in ``zoo.json``)."""

    autocast_bf16: bool
    reason: str

    @property
    def name(self) -> str:
        """``bf16-autocast`` or ``fp32``."""
        return "bf16-autocast" if self.autocast_bf16 else "fp32"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's feature flags, or ``None`` where ``/proc/cpuinfo`` does not list them (non-Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def bf16_probe_speedup(seconds: float = 0.5) -> float:
    """float32 time / bf16-autocast time of a small matmul forward+backward (> 1: bf16 is faster)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(512, 256, generator=generator, requires_grad=True)
    w = torch.randn(256, 688, generator=generator, requires_grad=True)

    def step_time(autocast: bool) -> float:
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 2 or runs < 2:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = a @ w
            out.float().sum().backward()
            runs += 1
        return (time.perf_counter() - start) / runs

    return step_time(False) / step_time(True)


def resolve_precision(request: str, flags: set[str] | None = None) -> TrainingPrecision:
    """Resolve ``auto`` / ``bf16`` / ``fp32``; ``auto`` reads the CPU flags, else a one-second probe.

    ``flags`` defaults to :func:`cpu_flags` (pass a set to decide for another CPU, e.g. in tests).
    """
    if request not in PRECISIONS:
        raise ValueError(f"unknown zoo precision {request!r}; choose one of {', '.join(PRECISIONS)}")
    if request == "bf16":
        return TrainingPrecision(True, "requested (bf16)")
    if request == "fp32":
        return TrainingPrecision(False, "requested (fp32)")
    flags = cpu_flags() if flags is None else flags
    if flags is not None:
        native = sorted(set(NATIVE_BF16_FLAGS) & flags)
        if native:
            return TrainingPrecision(True, f"auto: CPU has native bfloat16 ({', '.join(native)})")
        return TrainingPrecision(False, "auto: CPU has no native bfloat16 (no avx512_bf16 / amx_bf16 flag)")
    speedup = bf16_probe_speedup()
    return TrainingPrecision(speedup > 1.0, f"auto: probe, bf16 autocast {speedup:.2f}x float32 speed")
