"""Shared test settings: one thread (2-core CI machines), deterministic torch where torch is used."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # the pure scheduling tests do not need torch
    pass
