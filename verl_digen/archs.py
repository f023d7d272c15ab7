"""What verl-digen knows about each architecture, in one place and without torch: one frozen ``ArchFacts`` per
architecture, registered in ``ARCHS``. Its adapter class (``models/flux.py``, ...) points to it (``facts =
archs.FLUX``) and adds only what needs the nn.Module (the tiny config, packing, the transformer call); every other
reader takes the architecture's facts from here: the config's checks and memory plan (latent channels, video or
image, the text encoders' and VAE's sizes), the simulator's presets (the released transformer's sizes), the
vLLM-Omni rollout (RL pipeline, LoRA module renames) and the verl-omni converter (path hints, guidance key).

So reading a config, dry-running a recipe or converting a verl-omni config costs no torch and no diffusers,
and adding an architecture is its adapter file plus one ``register_arch(ArchFacts(...))`` here (see
docs/architecture.md, "Adding a model"). Standard library only (and ``verl_digen.registry``): every layer,
``schedule/`` included, may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from verl_digen.registry import Registry

#: where verl-digen's vLLM-Omni RL pipeline classes live (``rollout/omni/pipelines.py``)
PIPELINES = "verl_digen.rollout.omni.pipelines"
#: channels of the tiny random-weight models' latent (every tiny VAE of ``models/spec.py``): the config's checks
#: size a tiny run's trajectories from it without loading torch
TINY_LATENT_CHANNELS = 4


@dataclass(frozen=True)
class PretrainedSpec:
    """Diffusers class names, text encoders and default generation size of one released pipeline."""

    pipeline_class: str
    transformer_class: str
    vae_class: str
    #: the pipeline's text-encoder attributes, in order (their tokenizers are named alike)
    text_encoders: tuple[str, ...]
    height: int
    width: int
    num_frames: int | None = None  # pixel frames, video only
    #: text length the pipeline pads/truncates prompts to (what diffusers' pipeline uses by default)
    max_sequence_length: int = 512
    #: guidance enters as an embedding (FLUX.1-dev, HunyuanVideo): one transformer pass, no CFG branch
    guidance_distilled: bool = False
    #: channels of the VAE's latent (16 for FLUX, SD3.5, Qwen-Image, Wan2.1, HunyuanVideo; Wan2.2's is 48)
    latent_channels: int = 16


@dataclass(frozen=True)
class SequencePlan:
    """Where Ulysses sequence parallelism cuts the transformer (``models/ulysses.py``; module names as in
    ``named_modules``). Video architectures declare one; the others cannot be cut."""

    rope: str  # its output (cos, sin) is sliced along the tokens
    rope_token_dim: int
    first_blocks: tuple[str, ...]  # the first of these that exists gets its image tokens sliced
    attention: tuple[str, ...]  # attention modules (glob) whose processor attends over all image tokens
    output: str  # its output (B, tokens, C) is all-gathered along the tokens
    #: parameter-name prefixes whose gradient diffusers sums over the tokens in float32 whatever the model dtype:
    #: with the tokens split over ranks the halves round apart, so a float64 model agrees with one rank to ~1e-8
    #: relative there, not to float64
    float32_reduced: tuple[str, ...] = ()


@dataclass(frozen=True)
class Companions:
    """What a released pipeline loads besides its transformer (parameters): the memory plan counts them."""

    text_encoders: float
    vae: float
    what: str  # the text encoders, as the memory plan names them


@dataclass(frozen=True)
class CostSizes:
    """The released transformer as the simulator prices it (``schedule/presets.py``); its CFG passes per
    sampling step follow from ``PretrainedSpec.guidance_distilled`` and video from ``ArchFacts.latent_ndim``."""

    name: str
    params_b: float  # billions
    blocks: int
    hidden: int
    text_tokens: int  # tokens the transformer attends over besides the image's (0: text by cross-attention only)


@dataclass(frozen=True)
class ArchFacts:
    """Everything verl-digen knows about one architecture that needs no torch."""

    #: canonical name used in configs (``model.arch``): lower-case, no spaces
    name: str
    #: the adapter class, ``module.Class`` (imported only where a model is built: ``models/arch.py``)
    adapter: str
    #: the released diffusers pipeline: classes, text encoders, default size, latent channels
    pretrained: PretrainedSpec
    #: 4 for images (B, C, H, W), 5 for video (B, C, F, H, W)
    latent_ndim: int
    #: (spatial, temporal) compression of the released VAE (1: no time axis)
    vae_factors: tuple[int, int]
    #: text encoders and VAE of the released pipeline (the memory plan)
    companions: Companions
    #: verl-digen's vLLM-Omni RL pipeline (``rollout.backend=vllm``), ``module.Class``
    rl_pipeline: str
    #: lower-case substrings of a verl-omni ``model.path`` that mean this architecture (the converter: the
    #: longest one found in a path wins, so Wan2.2's "wan2.2" beats Wan2.1's "wan")
    verl_omni_hints: tuple[str, ...]
    #: other spellings accepted for ``model.arch`` (matched lower-case)
    aliases: tuple[str, ...] = ()
    #: verl-omni's ``rollout.pipeline`` key holding the real classifier-free guidance scale (diffusers' Qwen-Image
    #: pipelines take ``true_cfg_scale``; FLUX.1-dev feeds ``guidance_scale`` to its guidance embedding)
    verl_omni_cfg_key: str = "guidance_scale"
    #: adapter module names that land on a differently named module in vllm-omni's re-implementation
    #: (diffusers' ``to_out.0`` ModuleList is one ``to_out`` layer there); the engine refuses unknown targets
    engine_lora_renames: tuple[tuple[str, str], ...] = ()
    #: vllm-omni serves it through its diffusers adapter: LoRA goes in through verl-digen's worker extension
    #: (its LoRA manager cannot wrap those layers) and ``enforce_eager`` is refused there
    engine_diffusers_adapter: bool = False
    #: how Ulysses sequence parallelism cuts the transformer; None: it cannot
    sequence_plan: SequencePlan | None = None
    #: the released transformer's sizes in the cost model; None: no simulator preset prices it
    cost: CostSizes | None = None

    @property
    def video(self) -> bool:
        return self.latent_ndim == 5

    @property
    def cfg_passes(self) -> int:
        """Transformer passes per sampling step with guidance: one for a guidance-distilled model."""
        return 1 if self.pretrained.guidance_distilled else 2

    def names(self) -> tuple[str, ...]:
        """The canonical name and every alias, lower-case."""
        return (self.name, *(a.lower() for a in self.aliases))


#: canonical architecture name -> its facts
ARCHS: Registry[ArchFacts] = Registry("model arch")
#: other spelling -> canonical arch name
ARCH_ALIASES: dict[str, str] = {}

_TYPES = {"pretrained": PretrainedSpec, "companions": Companions, "sequence_plan": (SequencePlan, type(None)),
          "cost": (CostSizes, type(None))}


def _problems(facts: ArchFacts) -> list[str]:
    """What is missing or malformed in a declaration (empty when it is complete)."""
    out = [f"{f.name} must be a {_TYPES[f.name]}" for f in fields(facts)
           if f.name in _TYPES and not isinstance(getattr(facts, f.name), _TYPES[f.name])]
    if not (isinstance(facts.name, str) and facts.name and facts.name == facts.name.strip().lower()
            and " " not in facts.name):
        out.append(f"name must be lower-case without spaces, got {facts.name!r}")
    for key in ("adapter", "rl_pipeline"):
        value = getattr(facts, key)
        if not (isinstance(value, str) and "." in value.strip(".")):
            out.append(f"{key} must name a class as module.Class, got {value!r}")
    if facts.latent_ndim not in (4, 5):
        out.append(f"latent_ndim must be 4 (image) or 5 (video), got {facts.latent_ndim!r}")
    elif isinstance(facts.pretrained, PretrainedSpec) and (facts.pretrained.num_frames is None) == facts.video:
        out.append("pretrained.num_frames is set for a video model and only for one")
    if not (len(facts.vae_factors) == 2 and all(isinstance(v, int) and v >= 1 for v in facts.vae_factors)):
        out.append(f"vae_factors must be (spatial, temporal) integers >= 1, got {facts.vae_factors!r}")
    if isinstance(facts.companions, Companions) and not (facts.companions.text_encoders > 0
                                                         and facts.companions.vae > 0 and facts.companions.what):
        out.append("companions must count the text encoders' and the VAE's parameters and name the encoders")
    if not facts.verl_omni_hints or any(h != h.lower() or not h for h in facts.verl_omni_hints):
        out.append(f"verl_omni_hints must be non-empty lower-case substrings, got {facts.verl_omni_hints!r}")
    return out


def register_arch(facts: ArchFacts) -> ArchFacts:
    """Add an architecture: refuses an incomplete declaration, and a name or alias already taken (two
    declarations answering to one ``model.arch`` value)."""
    problems = _problems(facts)
    if problems:
        raise TypeError(f"architecture {facts.name!r} is not fully declared: {'; '.join(problems)}")
    names = facts.names()
    taken = [n for n in names if n in ARCHS or n in ARCH_ALIASES]
    if taken or len(set(names)) != len(names):
        raise ValueError(f"arch name(s) {taken or list(names)} of {facts.name!r} already registered or repeated")
    ARCHS.register(facts.name, facts)
    ARCH_ALIASES.update({alias: facts.name for alias in names[1:]})
    return facts


def unregister_arch(name: str) -> None:
    """Remove an architecture and its aliases (tests that declare a throwaway one)."""
    facts = ARCHS[name]
    ARCHS.unregister(name)
    for alias in facts.names()[1:]:
        ARCH_ALIASES.pop(alias, None)


def canonical_arch(arch: str) -> str:
    """The canonical name of ``arch`` (case-insensitive, aliases allowed); ValueError lists known ones."""
    key = str(arch).strip().lower()
    key = ARCH_ALIASES.get(key, key)
    if key not in ARCHS:
        raise ValueError(f"unknown model arch {arch!r}; known: {sorted(ARCHS)} (aliases: {sorted(ARCH_ALIASES)})")
    return key


def arch_facts(arch: str) -> ArchFacts:
    """The facts of ``arch`` (any accepted spelling)."""
    return ARCHS[canonical_arch(arch)]


def known_archs() -> list[str]:
    """Canonical architecture names."""
    return sorted(ARCHS)


def guess_arch(path: str | None) -> str | None:
    """The architecture a model id or path names (``verl_omni_hints``: the longest hint found wins), or None."""
    low = (path or "").lower()
    found = [(len(h), f.name) for f in ARCHS.values() for h in f.verl_omni_hints if h in low]
    return max(found)[1] if found else None


def sequence_parallel_archs() -> tuple[str, ...]:
    """The architectures whose facts declare a ``sequence_plan`` (Ulysses can cut them)."""
    return tuple(name for name, f in ARCHS.items() if f.sequence_plan is not None)


def video_tokens(latent_shape: tuple[int, ...], patch: int, patch_t: int) -> int:
    """Tokens of one (C, F, H, W) latent after patchifying."""
    _, f, h, w = latent_shape
    return (f // patch_t) * (h // patch) * (w // patch)


def sequence_parallel_problem(arch: str, heads: int, tokens: int, size: int) -> str | None:
    """What a sequence-parallel size must be for this model, when ``size`` is not (None when it fits): each
    rank takes whole heads in attention and an equal share of the video tokens (``models/ulysses.py``)."""
    if arch not in ARCHS or ARCHS[arch].sequence_plan is None:
        return f"1 for model.arch={arch} (sequence parallelism cuts {', '.join(sequence_parallel_archs())})"
    if heads % size:
        return f"a divisor of the {arch} transformer's {heads} attention heads"
    if tokens % size:
        return (f"a divisor of the {tokens} video tokens per sample ({arch}: latent frames x (height / patch) x "
                "(width / patch)); pick another size or resolution")
    return None


# -- the architectures -----------------------------------------------------------------------------------------
_T5_CLIP = 4.762e9 + 0.123e9  # T5-XXL encoder 4.76B + CLIP-L 0.12B
_TO_OUT = (("to_out.0", "to_out"),)  # vllm-omni 0.30.0's attention output is one RowParallelLinear named to_out

FLUX = register_arch(ArchFacts(
    name="flux", aliases=("flux.1", "flux1"), adapter="verl_digen.models.flux.FluxModel",
    pretrained=PretrainedSpec("FluxPipeline", "FluxTransformer2DModel", "AutoencoderKL",
                              ("text_encoder", "text_encoder_2"), 512, 512, guidance_distilled=True),
    latent_ndim=4, vae_factors=(8, 1),
    companions=Companions(_T5_CLIP, 0.084e9, "T5-XXL encoder 4.76B + CLIP-L 0.12B"),  # ~9.8 GB bf16
    rl_pipeline=f"{PIPELINES}.DigenFluxPipeline", verl_omni_hints=("flux",),
    cost=CostSizes("FLUX.1-12B", 12.0, 57, 3072, 512),
))
SD3 = register_arch(ArchFacts(
    name="sd3", aliases=("sd3.5", "sd35", "stable_diffusion_3"), adapter="verl_digen.models.sd3.SD3Model",
    pretrained=PretrainedSpec("StableDiffusion3Pipeline", "SD3Transformer2DModel", "AutoencoderKL",
                              ("text_encoder", "text_encoder_2", "text_encoder_3"), 512, 512,
                              max_sequence_length=256),
    latent_ndim=4, vae_factors=(8, 1),
    companions=Companions(_T5_CLIP + 0.695e9, 0.084e9, "T5-XXL encoder 4.76B + CLIP-L 0.12B + CLIP-G 0.69B"),
    rl_pipeline=f"{PIPELINES}.DigenSD3Pipeline", verl_omni_hints=("stable-diffusion-3", "sd3"),
))
QWEN_IMAGE = register_arch(ArchFacts(
    name="qwen_image", aliases=("qwen-image", "qwenimage", "qwen"),
    adapter="verl_digen.models.qwen_image.QwenImageModel",
    pretrained=PretrainedSpec("QwenImagePipeline", "QwenImageTransformer2DModel", "AutoencoderKLQwenImage",
                              ("text_encoder",), 512, 512),
    latent_ndim=4, vae_factors=(8, 1),
    companions=Companions(8.29e9, 0.127e9, "Qwen2.5-VL-7B 8.29B"),  # ~15.4 GiB bf16
    rl_pipeline=f"{PIPELINES}.DigenQwenImagePipeline", verl_omni_hints=("qwen-image", "qwen_image"),
    verl_omni_cfg_key="true_cfg_scale", engine_lora_renames=_TO_OUT,
    cost=CostSizes("Qwen-Image-20B", 20.0, 60, 3072, 256),
))
# self-attention attn1 over the video tokens; attn2 cross-attends to the whole text. The blocks add the time
# embedding to their modulation table as ``temb.float()``: its layers' gradients are summed in float32
_WAN_PLAN = SequencePlan("rope", 1, ("blocks.0",), ("blocks.*.attn1",), "proj_out",
                         float32_reduced=("condition_embedder.time_embedder.", "condition_embedder.time_proj."))
WAN = register_arch(ArchFacts(
    name="wan", aliases=("wan2.1", "wan21"), adapter="verl_digen.models.wan.WanModel",
    pretrained=PretrainedSpec("WanPipeline", "WanTransformer3DModel", "AutoencoderKLWan", ("text_encoder",),
                              480, 832, 33),
    latent_ndim=5, vae_factors=(8, 4),
    companions=Companions(5.68e9, 0.127e9, "umT5-XXL encoder 5.68B"),  # ~11.4 GB bf16
    rl_pipeline=f"{PIPELINES}.DigenWanPipeline", verl_omni_hints=("wan",), engine_lora_renames=_TO_OUT,
    sequence_plan=_WAN_PLAN, cost=CostSizes("Wan2.1-14B", 14.0, 40, 5120, 0),  # text by cross-attention only
))
WAN2_2 = register_arch(ArchFacts(
    name="wan2_2", aliases=("wan2.2", "wan22", "wan2.2-ti2v", "wan2.2-ti2v-5b"),
    adapter="verl_digen.models.wan2_2.Wan22Model",
    pretrained=PretrainedSpec("WanPipeline", "WanTransformer3DModel", "AutoencoderKLWan", ("text_encoder",),
                              704, 1280, 33, latent_channels=48),
    latent_ndim=5, vae_factors=(16, 4),
    companions=Companions(5.68e9, 0.705e9, "umT5-XXL encoder 5.68B"),  # TI2V-5B's 16x VAE, ~2.8 GB fp32
    rl_pipeline=f"{PIPELINES}.DigenWanPipeline", verl_omni_hints=("wan2.2", "wan2_2"), engine_lora_renames=_TO_OUT,
    sequence_plan=_WAN_PLAN,
))
HUNYUAN_VIDEO = register_arch(ArchFacts(
    name="hunyuan_video", aliases=("hunyuan", "hunyuanvideo", "hunyuan-video"),
    adapter="verl_digen.models.hunyuan_video.HunyuanVideoModel",
    pretrained=PretrainedSpec("HunyuanVideoPipeline", "HunyuanVideoTransformer3DModel", "AutoencoderKLHunyuanVideo",
                              ("text_encoder", "text_encoder_2"), 320, 512, 33, max_sequence_length=256,
                              guidance_distilled=True),
    latent_ndim=5, vae_factors=(8, 4),
    companions=Companions(7.50e9 + 0.123e9, 0.246e9, "llava-llama-3-8B text model 7.5B + CLIP-L 0.12B"),
    rl_pipeline=f"{PIPELINES}.DigenHunyuanVideoPipeline", verl_omni_hints=("hunyuan",),
    engine_diffusers_adapter=True,
    # joint attention over [video tokens, text tokens] in both block kinds
    sequence_plan=SequencePlan("rope", 0, ("transformer_blocks.0", "single_transformer_blocks.0"),
                               ("transformer_blocks.*.attn", "single_transformer_blocks.*.attn"), "proj_out"),
    cost=CostSizes("HunyuanVideo-13B", 13.0, 60, 3072, 256),  # embedded guidance: one pass
))
