"""Placement-invariant randomness.

Every random draw that belongs to one sample (its initial noise, its SDE noise, its DanceGRPO step
choice) comes from a generator seeded only by (seed, global step, prompt index, sample index). Which
worker, batch or process produces the sample never enters, so generator, TAG and colocated runs produce
identical trajectories and the modes can be compared exactly.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where a generator is built: a seed is plain arithmetic
    import torch


def sample_seed(seed: int, step: int, prompt: int, sample: int, stream: str = "noise") -> int:
    """A stable 63-bit seed for one sample's random stream (independent of Python's hash salt)."""
    key = f"{seed}/{step}/{prompt}/{sample}/{stream}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def sample_generator(seed: int, step: int, prompt: int, sample: int, stream: str = "noise") -> torch.Generator:
    """A CPU generator for one sample's stream; draws are moved to the target device afterwards."""
    import torch

    return torch.Generator(device="cpu").manual_seed(sample_seed(seed, step, prompt, sample, stream))
