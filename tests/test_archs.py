"""One home per architecture (``verl_digen/archs.py``): the registry refuses an incomplete declaration, every
reader takes its facts from there (memory plan, presets, converter, vLLM-Omni rollout), and no other module of
the package keeps a table keyed by architecture name. These tests build no model."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from verl_digen import archs
from verl_digen.archs import ARCH_ALIASES, ARCHS, ArchFacts, Companions, register_arch, unregister_arch

PACKAGE = Path(archs.__file__).parent


def _toy(**changes) -> ArchFacts:
    base = replace(archs.SD3, name="toy_arch", aliases=("toy-arch",), verl_omni_hints=("toy-arch",))
    return replace(base, **changes)


@pytest.mark.parametrize("changes, problem", [
    (dict(companions=None), "companions"),
    (dict(companions=Companions(0.0, 0.0, "")), "companions"),
    (dict(latent_ndim=3), "latent_ndim"),
    (dict(latent_ndim=5), "num_frames"),  # a video model without its default frames
    (dict(vae_factors=(8,)), "vae_factors"),
    (dict(pretrained=None), "pretrained"),
    (dict(rl_pipeline=""), "rl_pipeline"),
    (dict(adapter="ToyModel"), "adapter"),
    (dict(verl_omni_hints=()), "verl_omni_hints"),
    (dict(name="Toy Arch"), "lower-case"),
    (dict(cost=(12.0, 57)), "cost"),
])
def test_the_registry_refuses_an_incomplete_declaration(changes, problem):
    try:
        with pytest.raises(TypeError, match=problem):
            register_arch(_toy(**changes))
    finally:
        leaked = "toy_arch" in ARCHS
        if leaked:  # a declaration let through must not spoil the next case
            unregister_arch("toy_arch")
    assert not leaked and "toy-arch" not in ARCH_ALIASES


def test_a_declaration_registers_once_and_its_names_are_its_own():
    facts = register_arch(_toy())
    try:
        assert archs.arch_facts("TOY-ARCH") is facts and archs.guess_arch("org/Toy-Arch-1B") == "toy_arch"
        with pytest.raises(ValueError, match="already registered"):
            register_arch(_toy(name="toy_two", aliases=("sd3.5",)))
        with pytest.raises(ValueError, match="already registered"):
            register_arch(_toy())
    finally:
        unregister_arch("toy_arch")
    assert "toy_arch" not in ARCHS and "toy-arch" not in ARCH_ALIASES


def test_the_converter_guesses_the_architecture_from_a_model_path():
    """The longest hint wins: Wan2.2's "wan2.2" beats Wan2.1's "wan" whatever the registration order."""
    cases = {"Wan-AI/Wan2.2-TI2V-5B-Diffusers": "wan2_2", "Wan-AI/Wan2.1-T2V-14B-Diffusers": "wan",
             "stabilityai/stable-diffusion-3.5-medium": "sd3", "black-forest-labs/FLUX.1-dev": "flux",
             "Qwen/Qwen-Image": "qwen_image", "hunyuanvideo-community/HunyuanVideo": "hunyuan_video",
             "/models/sd3_local": "sd3", "/ckpt/unknown-dit": None}
    assert {p: archs.guess_arch(p) for p in cases} == cases


def test_readers_take_the_facts():
    """Presets' transformer sizes, the memory plan's companions and the engine's names come from the facts."""
    from verl_digen.rollout.omni import lora, request
    from verl_digen.schedule import presets

    assert presets.WAN == presets.DiT("Wan2.1-14B", 14.0, 40, 5120, 0, 2, True)
    assert presets.FLUX.cfg_passes == 1 and presets.QWEN_IMAGE.cfg_passes == 2 and presets.HUNYUAN.video
    for name, facts in ARCHS.items():
        assert request.pipeline_class(name) == facts.rl_pipeline and request.is_digen_pipeline(facts.rl_pipeline)
        assert lora.engine_renames(name) == dict(facts.engine_lora_renames)
    assert lora.engine_renames("wan2.2") == {"to_out.0": "to_out"} and lora.engine_renames("sd3") == {}
    assert lora.lora_through_extension("hunyuan") and not lora.lora_through_extension("flux")
    assert archs.arch_facts("wan2_2").pretrained.latent_channels == 48
    assert archs.sequence_parallel_archs() == ("wan", "wan2_2", "hunyuan_video")


def _names_pattern() -> re.Pattern:
    names = sorted({n for f in ARCHS.values() for n in (*f.names(), *f.verl_omni_hints)}, key=len, reverse=True)
    alternatives = "|".join(re.escape(n) for n in names)
    return re.compile(rf"""["']({alternatives})["']""", re.IGNORECASE)


#: the lines outside archs.py that may quote an architecture's name: a config field's default value, and the
#: vLLM-Omni pipeline classes pointing to the architecture they serve (as an adapter points to its facts)
ALLOWED = re.compile(r"""^\s*(arch: str = "flux"|digen_arch = "[a-z0-9_]+")\s*(#.*)?$""")


def test_no_module_but_archs_keeps_a_table_keyed_by_architecture_name():
    """Every architecture's facts live in one place: no other module of the package quotes an architecture's
    name or alias (a table keyed by it, a list of them, a switch on one), so a new architecture is one
    adapter file plus its registration, and nothing else goes stale."""
    quoted = _names_pattern()
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == Path(archs.__file__):
            continue
        hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
                if quoted.search(line) and not ALLOWED.match(line)]
        if hits:
            offenders[str(path.relative_to(PACKAGE))] = hits
    assert not offenders, offenders
