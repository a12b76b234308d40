"""The same seed, the same weights: the CPU settings that make a run's numbers repeatable.

Two things change the float sums of the same SFT or RL step on a CPU:

- **the thread count**: reductions are split by thread (measured: 1 and 2 threads give
  other weights after 20 SFT steps; docs/results.md, "Reproducibility");
- **the vector unit**: torch picks its kernels by the CPU's best instruction set
  (``torch.backends.cpu.get_cpu_capability()``: AVX512 on a recent server, AVX2 on most
  laptops) and MKL does the same for its matrix products. Measured on one AVX-512 machine:
  six SFT steps under ``ATEN_CPU_CAPABILITY=avx2`` give other weights than under its
  default, so two machines with different CPUs drift apart from the first step.

:func:`fix_numerics` fixes both for this process: the intra-op thread count, and (``kernels
= "avx2"``) torch's and MKL's kernels to the AVX2 ones, which every x86-64 CPU since about
2015 has, through the environment variables torch and MKL read on their first use
(``ATEN_CPU_CAPABILITY``, ``MKL_CBWR``, ``ONEDNN_MAX_CPU_ISA``). It must therefore run
before the process's first tensor operation; when it comes too late, or on a CPU without
AVX2, it says so and the run goes on with the kernels it has. ``"native"`` leaves each
machine its own best (faster on AVX-512, not comparable across CPUs). Not covered: ARM
machines (no AVX2; the pin is skipped), other torch or MKL versions.
"""

from __future__ import annotations

import logging
import os
import platform

log = logging.getLogger(__name__)

KERNELS = ("avx2", "native")
# What torch (ATen's dispatch), MKL (conditional numerical reproducibility) and oneDNN read.
KERNEL_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2",
                       "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "x86", "i686")


def fix_numerics(threads: int | None, kernels: str = "avx2") -> str:
    """Pin this process's kernels, then its thread count (None: leave torch's); returns
    the kernels in use (``torch.backends.cpu.get_cpu_capability()``, e.g. "AVX2")."""
    if kernels not in KERNELS:
        raise ValueError(f"cpu kernels {kernels!r}: expected one of {', '.join(KERNELS)}")
    wanted = KERNEL_ENV.get(kernels) if is_x86() else None
    if wanted:
        os.environ.update(wanted)
    import torch

    in_use = torch.backends.cpu.get_cpu_capability()
    if wanted and in_use != kernels.upper():
        log.warning("cpu kernels: wanted %s, torch uses %s (a tensor operation ran before "
                    "the pin, or the CPU lacks it): this run's weights may differ from "
                    "another machine's with the same seed", kernels.upper(), in_use)
    if threads is not None:
        torch.set_num_threads(threads)
    return in_use


def describe() -> dict:
    """What this process computes with, for a run's summary: the same seed is expected to
    give the same numbers only where all of these match."""
    import torch

    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "kernels": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine()}


def pin(threads: int | None, kernels: str) -> dict:
    """:func:`fix_numerics`, then what this process computes with (:func:`describe`)."""
    fix_numerics(threads, kernels)
    return describe()
