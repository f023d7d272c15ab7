"""Prompt conditioning: deterministic hashed embeddings (tiny models) and real text encoders (pipelines).

Both produce the same keys, so adapters do not care which one made them:
``prompt_embeds`` (B, L, D), optionally ``pooled_prompt_embeds`` (B, P) and ``prompt_mask`` (B, L).
"""

from verl_digen.models.conditioning.hashed import HashedPromptEncoder, prompt_seed
from verl_digen.models.conditioning.text import PipelinePromptEncoder, PromptEncoder

__all__ = ["HashedPromptEncoder", "PipelinePromptEncoder", "PromptEncoder", "prompt_seed"]
