"""Dtype names, in one place: the config's spellings, the aliases verl / verl-omni / diffusers users
write, and bytes per element (torch-free, so configs and memory plans are checked without torch;
``models.parse_dtype`` turns a name into a ``torch.dtype``)."""

from __future__ import annotations

#: what ``model.dtype`` and the ``actor.*_dtype`` keys accept
PRECISIONS = ("float64", "float32", "bfloat16", "float16")

#: bytes per element of each precision
BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}

#: every accepted spelling -> its precision (verl-omni's FSDP engine writes fp32 / bf16 / fp16)
ALIASES = {
    **{p: p for p in PRECISIONS},
    "fp64": "float64", "double": "float64",
    "fp32": "float32", "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16", "half": "float16",
}


def canonical(name: object) -> str:
    """The precision a spelling names (``torch.bfloat16``, ``bf16`` -> ``bfloat16``); ``ValueError``
    naming the accepted spellings otherwise."""
    key = str(name).lower().removeprefix("torch.")
    if key not in ALIASES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(sorted(ALIASES))}")
    return ALIASES[key]
