"""The architecture registry: canonical names, aliases and the adapter class of each, all read from the
adapter classes. Adding a model is one adapter file and one entry in ``ADAPTERS`` below (see
docs/architecture.md, "Adding a model")."""

from __future__ import annotations

from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.flux import FluxModel
from verl_digen.models.hunyuan_video import HunyuanVideoModel
from verl_digen.models.qwen_image import QwenImageModel
from verl_digen.models.sd3 import SD3Model
from verl_digen.models.wan import WanModel
from verl_digen.models.wan2_2 import Wan22Model
from verl_digen.registry import Registry

#: every supported architecture, one line each
ADAPTERS: tuple[type[DiffusersAdapter], ...] = (
    FluxModel,
    SD3Model,
    QwenImageModel,
    WanModel,
    Wan22Model,
    HunyuanVideoModel,
)

#: what every adapter class must declare (``DiffusersAdapter`` documents each)
REQUIRED_ATTRIBUTES: tuple[str, ...] = (
    "arch",
    "aliases",
    "pretrained",
    "tiny",
    "packed",
    "text_dim_key",
    "pooled_dim_key",
    "latent_ndim",
)

#: canonical arch name -> adapter class (a :class:`verl_digen.registry.Registry`)
MODEL_REGISTRY: Registry[type[DiffusersAdapter]] = Registry("model arch")
#: other spelling -> canonical arch name
ARCH_ALIASES: dict[str, str] = {}


def register(cls: type[DiffusersAdapter]) -> type[DiffusersAdapter]:
    """Add ``cls`` under ``cls.arch`` and its aliases; refuses a class that misses a declaration or whose
    name or an alias is taken (two adapters answering to one ``model.arch`` value)."""
    missing = [a for a in REQUIRED_ATTRIBUTES if not hasattr(cls, a)]
    if missing:
        raise TypeError(f"{cls.__name__} does not declare {missing} (see DiffusersAdapter)")
    for abstract in ("_forward", "_decode_latents"):
        if getattr(getattr(cls, abstract), "__isabstractmethod__", False):
            raise TypeError(f"{cls.__name__} does not implement {abstract}")
    if cls.arch != cls.arch.strip().lower():
        raise ValueError(f"{cls.__name__}.arch must be lower-case without spaces, got {cls.arch!r}")
    names = [cls.arch, *(a.lower() for a in cls.aliases)]
    taken = [n for n in names if n in MODEL_REGISTRY or n in ARCH_ALIASES]
    if taken or len(set(names)) != len(names):
        raise ValueError(f"{cls.__name__}: arch name(s) {taken or names} already registered or repeated")
    MODEL_REGISTRY.register(cls.arch, cls)
    ARCH_ALIASES.update({alias: cls.arch for alias in names[1:]})
    return cls


def unregister(arch: str) -> None:
    """Remove ``arch`` and its aliases (tests that register a throwaway adapter)."""
    cls = MODEL_REGISTRY[arch]
    MODEL_REGISTRY.unregister(arch)
    for alias in cls.aliases:
        ARCH_ALIASES.pop(alias.lower(), None)


for _cls in ADAPTERS:
    register(_cls)


def canonical_arch(arch: str) -> str:
    """The canonical name of ``arch`` (case-insensitive, aliases allowed); ValueError lists known ones."""
    key = str(arch).strip().lower()
    key = ARCH_ALIASES.get(key, key)
    if key not in MODEL_REGISTRY:
        raise ValueError(
            f"unknown model arch {arch!r}; known: {sorted(MODEL_REGISTRY)} (aliases: {sorted(ARCH_ALIASES)})"
        )
    return key
