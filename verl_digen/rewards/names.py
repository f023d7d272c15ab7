"""The rewards' names, without torch: ``config/validate.py`` checks ``reward.name`` / ``reward.weights`` against
them before anything is built, so a dry run never imports a reward (torch, PIL).

``BUILTIN`` lists what ``rewards/registry.py`` registers (``tests/rewards/test_reward_names.py`` holds the two
equal). A plugin registers its own reward into that registry, which imports it; :func:`reward_names` reads the
registry itself whenever it is loaded, so a plugin's name is accepted too.
"""

from __future__ import annotations

import sys

#: the reward that a user's ``custom_reward_function`` (or ``reward.functions``) is scored under
CUSTOM = "custom"

#: every name ``rewards/registry.py`` registers at import
BUILTIN = ("brightness", "colorfulness", CUSTOM, "hpsv2", "imagereward", "jpeg_compressibility",
           "jpeg_incompressibility", "latent_mean", "latent_target", "ocr", "pickscore", "random_cnn", "vlm_judge")


def reward_names() -> tuple[str, ...]:
    """The registered reward names, sorted: the registry's once it is imported (plugins add there), else
    ``BUILTIN`` (nothing else can have registered one without importing the registry)."""
    registry = sys.modules.get(f"{__package__}.registry")
    return tuple(sorted(registry.REWARDS if registry is not None else BUILTIN))
