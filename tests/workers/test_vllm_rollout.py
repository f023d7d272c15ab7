"""The vLLM-Omni rollout on CPU, without vllm: verl-digen's RL-pipeline loop against the diffusers sampler (bit
for bit in float64), the request builder, the output parser on vllm-omni 0.30.0's and verl-omni's layouts,
and the weight-update paths. The real engine is the opt-in tier (tests/workers/test_vllm_engine.py)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from verl_digen.algo.selection import StepSelection
from verl_digen.algo.sigmas import flow_sigmas
from verl_digen.models import build_model
from verl_digen.models.packing import pack_2x2
from verl_digen.rollout.denoise import denoise
from verl_digen.rollout.omni import lora as L
from verl_digen.rollout.omni.extension import LOAD_LORA, LOAD_WEIGHTS, READ_WEIGHTS, DigenWorkerExtension
from verl_digen.rollout.omni.output import DIGEN, VERL_OMNI, parse_output, to_pixels
from verl_digen.rollout.omni.policy import engine_policy
from verl_digen.rollout.omni.request import (
    DIGEN_KEY,
    VERL_OMNI_SDE_TYPES,
    RowRequest,
    StepSettings,
    build_requests,
    pixel_size,
)
from verl_digen.rollout.omni.served import ServedShape, read_served_shape
from verl_digen.rollout.omni.stepper import step_batch
from verl_digen.rollout.sampler import SamplerConfig, sample_trajectories
from verl_digen.workers.config import PolicyConfig, WorkerConfig
from verl_digen.workers.vllm_backend import VllmOmniRollout

torch.set_num_threads(1)
SEED, STEP = 5, 3
PIDS, SIDS = [0, 0, 2], [0, 1, 1]
PROMPTS = ["a red cube", "a red cube", "two cats"]
#: the fields of vllm-omni 0.30.0's OmniDiffusionSamplingParams that the request builder may set
#: (vllm_omni/inputs/data.py:204-326)
PARAM_FIELDS = {"num_inference_steps", "guidance_scale", "guidance_scale_provided", "height", "width", "num_frames",
                "sigmas", "seed", "return_trajectory_latents", "extra_args", "lora_request", "latents"}


@dataclass
class FakeParams:
    """OmniDiffusionSamplingParams' fields the builder uses, with its defaults; unknown keys fail."""

    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    guidance_scale_provided: bool = False
    height: int | None = None
    width: int | None = None
    num_frames: int = 1
    sigmas: list[float] | None = None
    seed: int | None = None
    return_trajectory_latents: bool = False
    extra_args: dict[str, Any] = field(default_factory=dict)
    lora_request: Any = None


@dataclass
class FakeRequestOutput:
    """vllm-omni 0.30.0's OmniRequestOutput diffusion fields (vllm_omni/outputs/__init__.py:145-186)."""

    request_id: str = ""
    prompt: Any = None
    finished: bool = True
    final_output_type: str = "image"
    images: list[Image.Image] = field(default_factory=list)
    latents: torch.Tensor | None = None
    trajectory_latents: torch.Tensor | None = None
    trajectory_timesteps: torch.Tensor | None = None
    trajectory_log_probs: torch.Tensor | None = None
    error: str | None = None


def _pil(pixels: torch.Tensor) -> Image.Image:
    """What the stock post-processor makes of a decoded image (VaeImageProcessor.postprocess, 'pil')."""
    arr = (pixels.clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    return Image.fromarray(arr)


class FakeOmni:
    """An ``Omni`` whose engine-side pipeline is verl-digen's loop on a tiny model: ``generate`` takes the
    prompt dicts and one sampling-params object, as vllm-omni's request batch hands them to the pipeline."""

    def __init__(self, model, arch: str) -> None:
        self.model, self.arch = model, arch
        self.calls: list[int] = []
        self.rpcs: list[tuple[str, tuple]] = []
        self.replies: dict[str, list[Any]] = {}  # method -> what collective_rpc answers (default [True])
        self.engine = self  # Omni.engine.collective_rpc

    def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        self.rpcs.append((method, args))
        return self.replies.get(method, [True])

    def generate(self, prompts: list[dict], params: list[FakeParams]) -> list[FakeRequestOutput]:
        self.calls.append(len(prompts))
        (sp,) = params
        rows = [RowRequest.from_prompt(p) for p in prompts]
        settings = StepSettings.from_extra_args(sp.extra_args)
        policy = engine_policy(self.arch, self.model.transformer, settings.latent_shape, vae=self.model.vae,
                               pretrained=False)
        cond = self.model.encode_prompts([p["prompt"] for p in prompts])
        res = step_batch(policy, cond, rows, settings, torch.float64, "cpu")
        pixels = policy.decode(res.final)
        outs = [FakeRequestOutput(request_id=f"{i}_uuid", prompt=prompts[i], images=[_pil(pixels[i])],
                                  trajectory_latents=res.row_latents(i).unsqueeze(0),
                                  trajectory_log_probs=res.log_probs[i:i + 1], trajectory_timesteps=res.sigmas[i:i + 1])
                for i in range(len(prompts))]
        return outs[::-1]  # as they finish, not in request order


def _sampler(sde: str = "flow_grpo", selection: StepSelection | None = None, **kw: Any) -> SamplerConfig:
    log_prob = "squared_error" if sde == "cps" else "gaussian"
    return SamplerConfig(num_steps=4, shift=3.0, sde=sde, eta=0.6 if sde != "cps" else 0.4,
                         selection=selection or StepSelection("first_k", k=3), log_prob=log_prob, decode=False, **kw)


def _requests(model, cfg: SamplerConfig):
    return build_requests(cfg, SEED, STEP, PIDS, SIDS, PROMPTS, latent_shape=tuple(model.latent_shape),
                          pixels=(32, 32, 1))


@pytest.fixture(scope="module")
def models():
    return {arch: build_model(arch, dtype=torch.float64, seed=0)
            for arch in ("sd3", "flux", "qwen_image", "wan", "hunyuan_video")}


# -- the RL pipeline's loop equals the diffusers sampler ------------------------------------------------------
@pytest.mark.parametrize("arch,sde,selection,gs,shared", [
    ("sd3", "flow_grpo", StepSelection("first_k", k=3), 2.0, False),
    ("sd3", "cps", StepSelection("window", k=2), 1.0, False),
    ("flux", "dance_grpo", StepSelection("random_k", k=2), 3.5, True),  # distilled guidance, packed tokens
    ("qwen_image", "flow_grpo", StepSelection("window", k=2, window_range=(1, 4)), 2.0, False),  # packed + CFG
    ("wan", "dance_grpo", StepSelection("random_k", k=3), 1.5, False),
    ("hunyuan_video", "flow_grpo", StepSelection("first_k", k=2), 6.0, False),  # distilled guidance, text mask
])
def test_pipeline_loop_equals_sampler_bit_for_bit(models, arch, sde, selection, gs, shared):
    model = models[arch]
    cfg = _sampler(sde, selection, guidance_scale=gs, shared_group_noise=shared)
    reqs = _requests(model, cfg)
    settings = StepSettings.from_extra_args(reqs.params["extra_args"])
    policy = engine_policy(arch, model.transformer, settings.latent_shape, vae=model.vae, pretrained=False)
    cond = model.encode_prompts(PROMPTS)
    got = step_batch(policy, cond, reqs.rows, settings, torch.float64, "cpu")
    ref = sample_trajectories(model, cond, PROMPTS, PIDS, SIDS, cfg, SEED, STEP, version=0)
    assert torch.equal(got.states, ref.states)
    assert torch.equal(got.next_states, ref.next_states)
    assert torch.equal(got.log_probs, ref.log_probs)
    assert torch.equal(got.final, ref.final_latents)
    assert torch.equal(got.sigmas, ref.sigmas)


def test_denoise_uses_sigmas_verbatim():
    """A velocity of zero makes flow_grpo's mean x * (1 + std^2 dt / (2 sigma)): the states record exactly the
    sigmas handed in, and a deterministic mask gives log-prob 0 and no movement."""
    sig = torch.tensor([1.0, 0.9, 0.5, 0.0], dtype=torch.float64)
    x = torch.randn(2, 3, dtype=torch.float64)
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    out = denoise(lambda z, s: torch.zeros_like(z), x, sig, gens, "flow_grpo", 0.5, torch.zeros(3, dtype=torch.bool))
    assert torch.equal(out.final, x) and torch.equal(out.log_probs, torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="one noise generator per sample"):
        denoise(lambda z, s: z, x, sig, gens[:1], "flow_grpo", 0.5, torch.ones(3, dtype=torch.bool))


# -- the request builder -----------------------------------------------------------------------------------
@pytest.mark.parametrize("sde", sorted(VERL_OMNI_SDE_TYPES))
def test_requests_map_every_setting(sde):
    cfg = _sampler(sde, StepSelection("window", k=2, window_range=(1, 4)))
    reqs = build_requests(cfg, SEED, STEP, PIDS, SIDS, PROMPTS, latent_shape=(4, 2, 8, 6), pixels=(48, 64, 5))
    p = reqs.params
    assert set(p) <= PARAM_FIELDS
    FakeParams(**p)  # every key is a sampling-params field
    assert (p["height"], p["width"], p["num_frames"], p["num_inference_steps"]) == (48, 64, 5, 4)
    assert p["guidance_scale"] == cfg.guidance_scale and p["guidance_scale_provided"]
    extra = p["extra_args"]
    assert extra["sde_type"] == VERL_OMNI_SDE_TYPES[sde] and extra["noise_level"] == cfg.eta and extra["logprobs"]
    start, end = cfg.selection.window(4, SEED, STEP)
    assert extra["sde_window_size"] == end - start and extra["sde_window_range"] == [start, end]
    settings = StepSettings.from_extra_args(extra)
    assert torch.equal(settings.sigma_tensor(torch.float64), cfg.sigmas(torch.float64))  # verbatim, exact
    assert settings.sde == sde and settings.eta == cfg.eta and settings.log_prob == cfg.log_prob
    assert list(settings.sde_mask) == cfg.sde_mask(SEED, STEP).tolist() and settings.latent_shape == (4, 2, 8, 6)
    # the sigmas field is the unshifted schedule: a scheduler's shift of 3 turns it into verl-digen's
    s = torch.tensor(p["sigmas"], dtype=torch.float64)
    assert torch.allclose(3 * s / (1 + 2 * s), cfg.sigmas(torch.float64)[:-1], atol=1e-15, rtol=0)
    for prompt, pid, sid, row in zip(reqs.prompts, PIDS, SIDS, reqs.rows):
        assert RowRequest.from_prompt(prompt) == row
        assert (row.seed, row.step, row.prompt_id, row.sample_id) == (SEED, STEP, pid, sid)
        assert list(row.train_steps) == list(range(start, end))


def test_requests_without_window_noise_every_step_and_refuse_ode(models):
    reqs = build_requests(_sampler("flow_grpo", StepSelection("random_k", k=2), shared_group_noise=True), SEED, STEP,
                          PIDS, SIDS, PROMPTS, latent_shape=(4, 8, 8), pixels=(64, 64, 1))
    assert reqs.params["extra_args"]["sde_window_size"] == 4 and reqs.params["extra_args"]["sde_window_range"] == [0, 4]
    assert [r.init_sample for r in reqs.rows] == [0, 0, 0]  # shared group noise: x_T of sample 0
    with pytest.raises(ValueError, match="samples deterministically"):
        build_requests(SamplerConfig(sde="ode", eta=0.0), SEED, STEP, PIDS, SIDS, PROMPTS, latent_shape=(4, 8, 8),
                       pixels=(64, 64, 1))
    with pytest.raises(ValueError, match="additional_information"):
        RowRequest.from_prompt("a plain prompt")


# -- the backend against a fake engine with vllm-omni's output types ----------------------------------------
def _backend(models, arch: str, cfg: SamplerConfig, lora_rank: int = 0):
    model = models[arch]
    wcfg = WorkerConfig(policy=PolicyConfig(arch=arch, dtype="float64", lora_rank=lora_rank), sampler=cfg,
                        seed=SEED, rollout_backend="vllm")
    shape = ServedShape(tuple(model.latent_shape), (32, 32, 1), 2, 1, arch in ("flux", "qwen_image"),
                        model.guidance_distilled)
    engine = FakeOmni(model, arch)
    backend = VllmOmniRollout(wcfg, engine=engine, params_cls=FakeParams, lora_cls=lambda *a: a, shape=shape,
                              conditioner=model.encode_prompts)
    return backend, engine


@pytest.mark.parametrize("arch", ["sd3", "flux"])
def test_backend_batches_a_micro_batch_and_equals_diffusers(models, arch):
    cfg = _sampler("flow_grpo", StepSelection("first_k", k=2), guidance_scale=2.0)
    backend, engine = _backend(models, arch, cfg)
    traj = backend.generate(STEP, 4, PIDS, SIDS, PROMPTS)
    assert engine.calls == [len(PROMPTS)]  # one generate, one request per sample
    model = models[arch]
    ref = sample_trajectories(model, model.encode_prompts(PROMPTS), PROMPTS, PIDS, SIDS,
                              SamplerConfig(**{**cfg.__dict__, "decode": True}), SEED, STEP, version=4)
    for f in ("states", "next_states", "log_probs", "final_latents", "sigmas", "sigmas_next", "step_indices",
              "prompt_ids", "sample_ids", "versions"):
        assert torch.equal(getattr(traj, f), getattr(ref, f)), f
    assert torch.allclose(traj.images, ref.images.float(), atol=1 / 255 + 1e-6)  # PIL quantisation only
    assert torch.equal(traj.cond.tensors["prompt_embeds"], ref.cond.tensors["prompt_embeds"])


def _verl_omni_outputs(model, arch: str, cfg: SamplerConfig, scale: float = 1000.0, packed: bool = False):
    """What verl-omni's RL pipelines return per request: the SDE window's latents (W + 1), log-probs and
    scheduler timesteps, from the full rollout."""
    cond = model.encode_prompts(PROMPTS)
    full = sample_trajectories(model, cond, PROMPTS, PIDS, SIDS, SamplerConfig(**{**cfg.__dict__, "selection":
                               StepSelection("first_k", k=cfg.num_steps)}), SEED, STEP, version=0)
    start, end = cfg.selection.window(cfg.num_steps, SEED, STEP)
    sig = cfg.sigmas(torch.float64)
    outs = []
    for i in range(len(PROMPTS)):
        lat = torch.cat([full.states[i, start:end], full.next_states[i, end - 1:end]]).float()
        if packed:
            lat = pack_2x2(lat)
        outs.append(FakeRequestOutput(
            request_id=f"{i}_x", images=[torch.rand(3, 32, 32)], trajectory_latents=lat.unsqueeze(0),
            trajectory_log_probs=full.log_probs[i, start:end].float().unsqueeze(0),
            trajectory_timesteps=(sig[start:end] * scale).float().unsqueeze(0)))
    return outs, full, (start, end)


@pytest.mark.parametrize("window", [(1, 4), (2, 4)])  # (2, 4): the SDE window ends at the last step
@pytest.mark.parametrize("arch,packed", [("sd3", False), ("flux", True)])
def test_parser_reads_verl_omni_layout(models, arch, packed, window):
    cfg = _sampler("flow_grpo", StepSelection("window", k=2, window_range=window))
    model = models[arch]
    outs, full, (start, end) = _verl_omni_outputs(model, arch, cfg, packed=packed)
    for i, out in enumerate(outs):
        row = parse_output(out, VERL_OMNI, cfg.sigmas(torch.float64), torch.arange(start, end),
                           tuple(model.latent_shape), packed=packed)
        assert torch.equal(row.states, full.states[i, start:end].float())
        assert torch.equal(row.next_states, full.next_states[i, start:end].float())
        assert torch.equal(row.log_probs, full.log_probs[i, start:end].float())
        assert row.image.shape == (3, 32, 32)
        assert bool(row.final.isnan().all()) == (end < cfg.num_steps)  # final latents unknown mid-trajectory
        if end == cfg.num_steps:  # a window that ends the trajectory carries its final latents
            assert torch.equal(row.final, full.final_latents[i].float())
    assert window != (2, 4) or end == cfg.num_steps


def test_parser_refuses_a_second_shift_and_missing_trajectories(models):
    cfg = _sampler("flow_grpo", StepSelection("window", k=2, window_range=(1, 4)))
    model = models["sd3"]
    outs, _, (start, end) = _verl_omni_outputs(model, "sd3", cfg)
    shifted = 3 * cfg.sigmas(torch.float64) / (1 + 2 * cfg.sigmas(torch.float64))  # shifted twice
    outs[0].trajectory_timesteps = (shifted[start:end] * 1000).float().unsqueeze(0)
    with pytest.raises(RuntimeError, match="shifted a second time"):
        parse_output(outs[0], VERL_OMNI, cfg.sigmas(torch.float64), torch.arange(start, end), tuple(model.latent_shape))
    outs[1].trajectory_log_probs = None
    with pytest.raises(RuntimeError, match="no trajectory_log_probs"):
        parse_output(outs[1], VERL_OMNI, cfg.sigmas(torch.float64), torch.arange(start, end), tuple(model.latent_shape))
    with pytest.raises(RuntimeError, match="outside the recorded SDE window"):
        parse_output(outs[2], VERL_OMNI, cfg.sigmas(torch.float64), torch.arange(0, 2), tuple(model.latent_shape))


def test_backend_reads_a_foreign_pipeline_one_request_per_sample(models):
    cfg = _sampler("flow_grpo", StepSelection("window", k=2, window_range=(1, 4)))
    backend, _ = _backend(models, "sd3", cfg)
    outs, full, (start, end) = _verl_omni_outputs(models["sd3"], "sd3", cfg)
    calls = []

    def generate(prompts, params):
        calls.append(params[0].seed)
        return [outs[len(calls) - 1]]

    backend.engine.generate = generate
    backend.layout = VERL_OMNI
    traj = backend.generate(STEP, 0, PIDS, SIDS, PROMPTS)
    assert len(calls) == 3 and len(set(calls)) == 3  # a seed of its own per sample
    assert torch.equal(traj.log_probs, full.log_probs[:, start:end].float().double())  # recorded in float32


def test_to_pixels_reads_pil_tensors_and_video():
    img = torch.rand(3, 4, 6)
    assert torch.allclose(to_pixels(_pil(img)), img, atol=1 / 255)
    assert torch.equal(to_pixels((img * 255).round().to(torch.uint8).permute(1, 2, 0)),
                       (img * 255).round() / 255)
    assert to_pixels(torch.rand(5, 4, 6, 3)).shape == (3, 5, 4, 6)  # frames, H, W, C
    assert to_pixels([_pil(img), _pil(img)]).shape == (3, 2, 4, 6)  # a list of frames
    video = torch.randint(0, 256, (1, 5, 4, 6, 3), dtype=torch.uint8)  # Wan's post-processor: (1, F, H, W, C)
    assert torch.equal(to_pixels(video), video[0].permute(3, 0, 1, 2).float() / 255)


# -- weights ----------------------------------------------------------------------------------------------
def test_lora_updates_keep_one_adapter_id_and_one_directory(models):
    before = set(os.listdir(tempfile.gettempdir()))
    backend, engine = _backend(models, "sd3", _sampler(), lora_rank=4)
    slot_dir = backend.slot.dir
    reqs = []
    for version in (1, 2, 3):
        state = {"transformer_blocks.0.attn.to_q.lora_A.weight": torch.full((4, 32), float(version))}
        backend.load_weights(version, state)
        reqs.append(backend.lora_request)
    assert {r[1] for r in reqs} == {L.ADAPTER_ID} and {r[2] for r in reqs} == {str(slot_dir)}
    assert engine.rpcs == [("remove_lora", (L.ADAPTER_ID,))] * 3  # re-read on the next request
    from safetensors.torch import load_file

    saved = load_file(str(slot_dir / L.WEIGHTS_FILE))
    assert torch.equal(saved["base_model.model.transformer_blocks.0.attn.to_q.lora_A.weight"], torch.full((4, 32), 3.0))
    assert set(os.listdir(slot_dir)) == {L.WEIGHTS_FILE, L.CONFIG_FILE}
    assert backend.requests(STEP, PIDS, SIDS, PROMPTS).params["lora_request"] == reqs[-1]
    backend.close()
    assert not slot_dir.exists()
    assert set(os.listdir(tempfile.gettempdir())) - before == set()


def test_lora_names_follow_the_engines_modules_where_they_differ(models):
    """vllm-omni's Qwen-Image and Wan have one ``to_out`` layer where diffusers has ``to_out.0``: the adapter
    config's targets and the saved keys are renamed for the engine, other names are left alone."""
    renames = L.engine_renames("wan")
    assert L.engine_name("blocks.0.attn1.to_out.0.lora_A.weight", renames) == "blocks.0.attn1.to_out.lora_A.weight"
    assert L.engine_name("to_out.0", renames) == "to_out"
    assert L.engine_name("blocks.0.attn1.to_q.lora_A.weight", renames) == "blocks.0.attn1.to_q.lora_A.weight"
    assert L.engine_renames("sd3") == {}  # SD3's engine keeps diffusers' names
    backend, _ = _backend(models, "wan", _sampler(), lora_rank=2)
    assert "to_out" in backend.slot.config["target_modules"] and "to_out.0" not in backend.slot.config["target_modules"]
    backend.load_weights(1, {"blocks.0.attn1.to_out.0.lora_B.weight": torch.ones(2, 2)})
    from safetensors.torch import load_file

    saved = load_file(str(backend.slot.dir / L.WEIGHTS_FILE))
    assert set(saved) == {"base_model.model.blocks.0.attn1.to_out.lora_B.weight"}
    # weights() reads the directory the engine reads, back under the trainer's names
    assert list(backend.weights()) == ["blocks.0.attn1.to_out.0.lora_B.weight"]
    backend.close()


def test_hunyuan_video_lora_goes_through_the_worker_extension(models):
    """vllm-omni's LoRA manager cannot wrap the diffusers layers of HunyuanVideo's pipeline: its adapters go
    to the pipeline through the extension, with the trainer's PEFT config, and no adapter directory is made."""
    backend, engine = _backend(models, "hunyuan_video", _sampler(), lora_rank=2)
    assert backend.slot is None and backend.lora_config["r"] == 2
    state = {"transformer_blocks.0.attn.to_q.lora_A.weight": torch.ones(2, 32)}
    backend.load_weights(1, state)
    ((method, (sent, config)),) = engine.rpcs
    assert method == LOAD_LORA and torch.equal(sent[next(iter(state))], state[next(iter(state))])
    assert config == backend.lora_config and backend.lora_request is None


def test_served_shape_is_read_from_a_checkpoints_config_files(tmp_path, models):
    model = models["wan"]
    model.transformer.save_config(tmp_path / "transformer")
    model.vae.save_config(tmp_path / "vae")
    shape = read_served_shape("wan", str(tmp_path), latent_size=8, latent_width=12, num_frames=9)
    assert shape.latent_shape == (model.transformer.config.in_channels, 3, 8, 12)  # 8x spatial, 4x temporal VAE


def test_full_fine_tune_goes_through_the_worker_extension(models):
    """Bucket by bucket, the tensors handed over as they are (on the engine's device: no host copy), nothing kept;
    ``weights`` asks the engine for its weights under the trainer's layout."""
    backend, engine = _backend(models, "sd3", _sampler())
    backend.bucket_bytes = 32
    state = {"proj_out.weight": torch.ones(2, 2), "proj_out.bias": torch.ones(2), "norm.weight": torch.ones(4)}
    backend.load_weights(1, state)
    assert [m for m, _ in engine.rpcs] == [LOAD_WEIGHTS] * 2  # 16 + 16 bytes, then 8 (name order)
    sent = {k: v for _, (chunk,) in engine.rpcs for k, v in chunk.items()}
    assert set(sent) == set(state) and all(sent[k].data_ptr() == state[k].data_ptr() for k in state)
    assert not [k for k, v in vars(backend).items() if isinstance(v, dict) and any(
        isinstance(t, torch.Tensor) for t in v.values())]  # no copy of the weights kept
    backend._template = (("proj_out.weight", torch.float64, (2, 2)),)
    engine.replies[READ_WEIGHTS] = [{"proj_out.weight": torch.full((2, 2), 7.0)}]
    assert torch.equal(backend.weights()["proj_out.weight"], torch.full((2, 2), 7.0))
    assert engine.rpcs[-1] == (READ_WEIGHTS, ([("proj_out.weight", (2, 2))],))
    state = {"proj_out.weight": torch.ones(2, 2)}

    class Pipeline:
        loaded = None

        def digen_load_transformer_weights(self, s):
            Pipeline.loaded = s

    ext = DigenWorkerExtension()
    ext.model_runner = type("Runner", (), {"pipeline": Pipeline()})()
    assert ext.digen_load_weights(state) == 1 and Pipeline.loaded is state
    ext.model_runner.pipeline = object()
    with pytest.raises(RuntimeError, match="not a verl-digen RL pipeline"):
        ext.digen_load_weights(state)


def test_every_architecture_has_a_pipeline():
    from verl_digen.models import known_archs
    from verl_digen.rollout.omni.request import is_digen_pipeline, pipeline_class

    assert all(is_digen_pipeline(pipeline_class(arch)) for arch in known_archs())
    assert flow_sigmas(2).shape == (3,) and DIGEN == "digen" and DIGEN_KEY == "digen"


# -- each engine on a rendezvous of its own (issue 43) ---------------------------------------------------------
def test_two_engines_on_one_node_get_rendezvous_ports_of_their_own(models, monkeypatch):
    """verl gives every generator of a worker group the same MASTER_ADDR / MASTER_PORT, and vllm-omni takes the
    environment's port before its ``master_port`` argument: each engine must start with that unset and a free
    port of its own, and the worker's variables must be back afterwards (the engine overwrites them)."""
    import socket

    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("RANK", "1")
    seen: list[tuple[dict, dict]] = []

    class RecordingOmni(FakeOmni):
        def __init__(self, model: str, **kwargs: Any) -> None:
            env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK")}
            seen.append((env, kwargs))
            os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(kwargs["master_port"]), RANK="0")
            with socket.socket() as s:  # the port is free: the engine can bind its store there
                s.bind(("127.0.0.1", kwargs["master_port"]))
            super().__init__(models["sd3"], "sd3")

    wcfg = WorkerConfig(policy=PolicyConfig(arch="sd3", dtype="float64", pretrained="/ckpt"), sampler=_sampler(),
                        seed=SEED, rollout_backend="vllm")
    shape = ServedShape(tuple(models["sd3"].latent_shape), (32, 32, 1), 2, 1, False, False)
    backends = [VllmOmniRollout(wcfg, omni_cls=RecordingOmni, params_cls=FakeParams, shape=shape,
                                conditioner=models["sd3"].encode_prompts) for _ in range(2)]
    ports = [kw["master_port"] for _, kw in seen]
    assert len(set(ports)) == 2 and 29500 not in ports
    assert [b.master_port for b in backends] == ports
    assert all(env == {"MASTER_ADDR": None, "MASTER_PORT": None, "RANK": None} for env, _ in seen)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], os.environ["RANK"]) == ("10.0.0.7", "29500", "1")


@pytest.mark.parametrize("arch,lora_rank", [("sd3", 0), ("flux", 0), ("sd3", 4), ("wan", 2)])
def test_the_collective_template_is_the_trainers_layout_without_weights(tmp_path, models, arch, lora_rank):
    """``sync_layout``: the names, dtypes and shapes a collective pickup into the engine expects, from the
    checkpoint's config on the meta device, equal the diffusers policy's own (what the trainer sends)."""
    from verl_digen.models.lora import apply_lora
    from verl_digen.workers import policy as P
    from verl_digen.workers.buckets import layout_of
    from verl_digen.workers.vllm_backend import sync_layout

    model = build_model(arch, dtype=torch.float64, seed=0)
    model.transformer.save_config(tmp_path / "transformer")
    if lora_rank:
        apply_lora(model, rank=lora_rank)
    cfg = WorkerConfig(policy=PolicyConfig(arch=arch, dtype="float64", pretrained=str(tmp_path), lora_rank=lora_rank),
                       sampler=_sampler(), seed=SEED, rollout_backend="vllm")
    want = layout_of(P.live_weights(model, bool(lora_rank)))
    got = sync_layout(cfg)
    assert got == want and all(d == torch.float64 for _, d, _ in got)


@pytest.mark.parametrize("latent_shape,want", [
    ((16, 21, 60, 104), (480, 832, 81)),  # Wan2.1 at 480p: 21 latent frames are 81 video frames, not 84
    ((16, 1, 8, 8), (64, 64, 1)),  # one latent frame is one video frame
    ((16, 64, 128), (512, 1024, 1)),  # an image
])
def test_pixel_size_counts_a_causal_video_vaes_frames(latent_shape, want):
    """Causal video VAEs (Wan2.1, HunyuanVideo) encode the first frame alone and each later latent frame from
    ``temporal`` frames: F latent frames decode to (F - 1) * temporal + 1."""
    assert pixel_size(latent_shape, 8, 4) == want


# -- the backend's construction and bookkeeping (issue 45: each piece pinned by a value) --------------------------
def _wcfg(arch: str = "sd3", dtype: str = "float64", **kw: Any) -> WorkerConfig:
    policy = {k: kw.pop(k) for k in list(kw) if k in PolicyConfig.__dataclass_fields__}
    return WorkerConfig(policy=PolicyConfig(arch=arch, dtype=dtype, **policy), sampler=_sampler(), seed=SEED,
                        rollout_backend="vllm", **kw)


def _shape(models, arch: str = "sd3") -> ServedShape:
    model = models[arch]
    return ServedShape(tuple(model.latent_shape), (32, 32, 1), 2, 1, arch in ("flux", "qwen_image"),
                       model.guidance_distilled)


def test_generate_casts_to_the_policy_dtype_and_fills_every_field(models):
    """The engine's float64 trajectories come back in the policy's dtype (float32 here), sigmas too; the rows
    carry the micro-batch's prompts, step and version; an output without an image leaves ``images`` unset."""
    wcfg = WorkerConfig(policy=PolicyConfig(arch="sd3", dtype="float32"), sampler=_sampler(), seed=SEED,
                        rollout_backend="vllm")
    engine = FakeOmni(models["sd3"], "sd3")
    backend = VllmOmniRollout(wcfg, engine=engine, params_cls=FakeParams, shape=_shape(models),
                              conditioner=models["sd3"].encode_prompts)
    traj = backend.generate(STEP, 6, PIDS, SIDS, PROMPTS)
    for f in ("states", "next_states", "log_probs", "final_latents", "sigmas", "sigmas_next"):
        assert getattr(traj, f).dtype == torch.float32, f
    assert torch.equal(traj.sigmas, wcfg.sampler.sigmas(torch.float32)[traj.step_indices])
    assert traj.prompts == PROMPTS and traj.global_step == STEP and traj.versions.tolist() == [6, 6, 6]
    assert traj.images is not None and traj.images.shape[0] == 3
    generate = engine.generate

    def one_without_image(prompts, params):
        outs = generate(prompts, params)
        outs[1].images = []
        return outs

    engine.generate = one_without_image
    assert backend.generate(STEP, 6, PIDS, SIDS, PROMPTS).images is None


def test_a_foreign_pipeline_gets_each_samples_own_seed_and_the_batchs_settings(models):
    """verl-omni's pipelines draw a request's noise from its seed: one call per sample, with the sample's
    ``sample_seed(seed, step, prompt, sample, "sde")`` (31 bits) and every sampling setting of the batch."""
    from verl_digen.algo.seeding import sample_seed

    cfg = _sampler("flow_grpo", StepSelection("window", k=2, window_range=(1, 4)))
    backend, _ = _backend(models, "sd3", cfg)
    outs, _, _ = _verl_omni_outputs(models["sd3"], "sd3", cfg)
    calls = []

    def generate(prompts, params):
        calls.append((prompts, params))
        return [outs[len(calls) - 1]]

    backend.engine.generate = generate
    backend.layout = VERL_OMNI
    reqs = backend.requests(STEP, PIDS, SIDS, PROMPTS)
    backend.generate(STEP, 0, PIDS, SIDS, PROMPTS)
    for (prompts, (params,)), prompt, pid, sid in zip(calls, reqs.prompts, PIDS, SIDS, strict=True):
        assert prompts == [prompt]
        assert params.seed == sample_seed(SEED, STEP, pid, sid, "sde") & 0x7FFFFFFF
        assert params.num_inference_steps == cfg.num_steps and params.sigmas == reqs.params["sigmas"]


def test_outputs_are_put_in_request_order_only_when_every_id_says_where():
    from types import SimpleNamespace as NS

    a, b, c = NS(request_id="2_u"), NS(request_id="0_v"), NS(request_id="1_w")
    assert VllmOmniRollout._in_order([a, b, c], None) == [b, c, a]
    bare = [NS(), NS()]  # no request ids at all: the engine's order
    assert VllmOmniRollout._in_order(bare, None) == bare
    partial = [NS(request_id=""), NS(request_id="0_x")]  # one id missing: not a permutation, left as it is
    assert VllmOmniRollout._in_order(partial, None) == partial


def test_a_backend_without_an_engine_needs_a_checkpoint():
    with pytest.raises(ValueError, match="set model.path"):
        VllmOmniRollout(_wcfg(), omni_cls=object, params_cls=FakeParams)


def test_the_served_shape_comes_from_the_checkpoint_with_the_policys_sizes(tmp_path, models):
    model = models["wan"]
    model.transformer.save_config(tmp_path / "transformer")
    model.vae.save_config(tmp_path / "vae")
    wcfg = _wcfg("wan", pretrained=str(tmp_path), latent_size=8, latent_width=12, num_frames=9)
    backend = VllmOmniRollout(wcfg, engine=FakeOmni(model, "wan"), params_cls=FakeParams,
                              conditioner=model.encode_prompts)
    assert backend.shape == read_served_shape("wan", str(tmp_path), latent_size=8, latent_width=12, num_frames=9)
    assert backend.shape.latent_shape == (model.transformer.config.in_channels, 3, 8, 12)


def test_the_engine_starts_on_the_checkpoint_with_its_own_kwargs(models):
    from verl_digen.workers.vllm_backend import engine_kwargs

    started = []

    class Recording(FakeOmni):
        def __init__(self, model: str, **kwargs: Any) -> None:
            started.append((model, kwargs))
            super().__init__(models["sd3"], "sd3")

    wcfg = _wcfg(pretrained="/ckpt", vllm_max_batch=3)
    backend = VllmOmniRollout(wcfg, omni_cls=Recording, params_cls=FakeParams, shape=_shape(models),
                              conditioner=models["sd3"].encode_prompts)
    ((model, kwargs),) = started
    assert model == "/ckpt" and kwargs == engine_kwargs(wcfg, backend.pipeline, backend.master_port)
    assert kwargs["custom_pipeline_args"] == {"pipeline_class": backend.pipeline}


def test_digen_pipelines_encode_prompts_in_the_engine(models):
    """No conditioner given: verl-digen's pipeline encodes through the engine (one copy of the encoders), asking
    for the negative rows only where the model uses classifier-free guidance."""
    from verl_digen.rollout.omni.extension import ENCODE
    from verl_digen.workers.vllm_backend import EngineConditioner

    engine = FakeOmni(models["sd3"], "sd3")
    backend = VllmOmniRollout(_wcfg(), engine=engine, params_cls=FakeParams, shape=_shape(models))
    assert isinstance(backend.conditioner, EngineConditioner)
    pos, neg = {"prompt_embeds": torch.ones(2, 3)}, {"prompt_embeds": torch.zeros(2, 3)}
    engine.replies[ENCODE] = [[(pos, neg)]]
    cond = backend.conditioner(["a", "b"])
    assert engine.rpcs == [(ENCODE, (["a", "b"], ["", ""], True))]  # SD3: CFG, so negatives too
    assert torch.equal(cond.tensors["prompt_embeds"], pos["prompt_embeds"])
    assert torch.equal(cond.negative["prompt_embeds"], neg["prompt_embeds"])  # the unconditional branch
    engine.replies[ENCODE] = [[(pos, None)]]  # an engine that encodes no negative rows
    assert backend.conditioner(["a", "b"]).negative is None
    assert models["flux"].guidance_distilled  # FLUX: guidance distilled, so no negative rows asked for
    flux = FakeOmni(models["flux"], "flux")
    flux.replies[ENCODE] = [[(pos, None)]]
    VllmOmniRollout(_wcfg("flux"), engine=flux, params_cls=FakeParams, shape=_shape(models, "flux")).conditioner(["a"])
    assert flux.rpcs[-1] == (ENCODE, (["a"], [""], False))


def test_a_foreign_pipeline_is_served_in_its_own_layout_with_the_checkpoints_encoders(models, monkeypatch):
    from verl_digen.rollout.omni import served
    from verl_digen.workers import vllm_backend

    loaded = []
    monkeypatch.setattr(vllm_backend.TextConditioner, "from_checkpoint",
                        classmethod(lambda cls, *a: loaded.append(a) or "encoders"))
    wcfg = _wcfg(pretrained="/ckpt", vllm_pipeline="verl_omni.pipelines.SD3RLPipeline")
    backend = VllmOmniRollout(wcfg, "cpu", engine=FakeOmni(models["sd3"], "sd3"), params_cls=FakeParams,
                              shape=_shape(models))
    assert backend.pipeline == "verl_omni.pipelines.SD3RLPipeline" and backend.layout == VERL_OMNI
    assert backend.conditioner == "encoders" and served.TextConditioner is vllm_backend.TextConditioner
    assert loaded == [("sd3", "/ckpt", torch.float64, "cpu", False)]


def test_lora_adapters_get_the_trainers_peft_config(models):
    from verl_digen.models.arch import MODEL_REGISTRY
    from verl_digen.models.lora import default_lora_targets

    backend, _ = _backend(models, "sd3", _sampler(), lora_rank=4)
    assert backend.slot.config == L.peft_config(4, None, default_lora_targets(MODEL_REGISTRY["sd3"]))
    assert backend.weights() == {}  # nothing served before the first update
    backend.close()
    wcfg = _wcfg(lora_rank=4, lora_alpha=8.0, lora_target_modules=("to_q", "to_v"))
    backend = VllmOmniRollout(wcfg, engine=FakeOmni(models["sd3"], "sd3"), params_cls=FakeParams,
                              lora_cls=lambda *a: a, shape=_shape(models), conditioner=models["sd3"].encode_prompts)
    assert backend.slot.config["lora_alpha"] == 8.0 and backend.slot.config["target_modules"] == ["to_q", "to_v"]
    backend.close()


@pytest.mark.parametrize("arch,lora_rank", [("sd3", 0), ("hunyuan_video", 2)])
def test_weights_go_to_the_engines_device(models, arch, lora_rank):
    """The tensors handed to the engine are on its device (the meta device stands in for a GPU here)."""
    model = models[arch]
    backend = VllmOmniRollout(_wcfg(arch, lora_rank=lora_rank), "meta", engine=FakeOmni(model, arch),
                              params_cls=FakeParams, shape=_shape(models, arch), conditioner=model.encode_prompts)
    backend.load_weights(1, {"proj_out.weight": torch.ones(2, 2)})
    ((_, (sent, *_)),) = backend.engine.rpcs
    assert sent["proj_out.weight"].device.type == "meta"


@pytest.mark.parametrize("mb,want", [(0, 1 << 20), (3, 3 << 20)])
def test_full_weights_go_in_buckets_of_the_configured_mib(models, mb, want):
    backend = VllmOmniRollout(_wcfg(sync_bucket_mb=mb), engine=FakeOmni(models["sd3"], "sd3"), params_cls=FakeParams,
                              shape=_shape(models), conditioner=models["sd3"].encode_prompts)
    assert backend.bucket_bytes == want  # at least 1 MiB
    third = want // 3 // 8  # three float64 tensors that fill one bucket
    backend.load_weights(1, {f"w{i}": torch.zeros(third, dtype=torch.float64) for i in range(3)})
    assert len(backend.engine.rpcs) == 1


def test_buckets_of_starts_each_chunk_empty():
    from verl_digen.workers.vllm_backend import buckets_of

    state = {k: torch.zeros(2, dtype=torch.float64) for k in "abcd"}  # 16 bytes each
    assert [list(c) for c in buckets_of(state, 32)] == [["a", "b"], ["c", "d"]]


def test_the_collective_template_is_built_once(models, monkeypatch):
    from verl_digen.workers import vllm_backend

    made = []
    monkeypatch.setattr(vllm_backend, "sync_layout", lambda cfg: made.append(cfg) or (("w", torch.float64, (2,)),))
    backend, _ = _backend(models, "sd3", _sampler())
    assert backend.template() == (("w", torch.float64, (2,)),) and backend.template() is backend.template()
    assert made == [backend.cfg]  # from this generator's own settings, once


def test_a_full_fine_tunes_sink_hands_each_completed_tensor_to_the_engine(models):
    from verl_digen.workers.buckets import layout_of, plan_for

    backend, _ = _backend(models, "sd3", _sampler())  # no LoRA: the transformer's tensors, chunk by chunk
    assert backend.sink(plan_for(layout_of({"a": torch.zeros(2)}), 64, 1), "meta").load == backend.load_chunk


def test_an_engine_sink_makes_tensors_on_its_device_counts_its_peak_and_finds_a_torn_pickup(models):
    from verl_digen.workers.buckets import layout_of, plan_for

    state = {"a": torch.zeros(4, 4, dtype=torch.float64), "b": torch.zeros(2, dtype=torch.float64)}
    plan = plan_for(layout_of(state), 64, 1)  # "a" (128 bytes) in two buckets, then "b"
    backend, _ = _backend(models, "sd3", _sampler(), lora_rank=4)
    sink = backend.sink(plan, "meta")  # adapters: kept whole (``done``) for ``load_weights``
    assert sink.peak_bytes == 0 and sink["a"].device.type == "meta" and sink["a"].dtype == torch.float64
    assert sink.peak_bytes == 128
    sink.landed(0)
    with pytest.raises(RuntimeError, match="incomplete"):
        sink.check_complete()
    for k in range(1, len(plan.pieces)):
        for piece in plan.pieces[k]:
            sink[piece.name]
        sink.landed(k)
    sink.check_complete()
    assert set(sink.done) == {"a", "b"} and sink.peak_bytes == 128  # "a" was handed over before "b" began
    backend.close()


def test_the_generators_rollout_backend_is_built_on_its_device(monkeypatch):
    from verl_digen.workers import vllm_backend

    built = []
    monkeypatch.setattr(vllm_backend, "VllmOmniRollout", lambda *a: built.append(a) or "engine")
    wcfg = _wcfg()
    assert vllm_backend.build_rollout_backend(wcfg, "meta") == "engine" and built == [(wcfg, "meta")]
    with pytest.raises(ValueError, match="unknown rollout_backend 'diffusers'"):
        vllm_backend.build_rollout_backend(WorkerConfig())


def test_a_foreign_pipelines_packed_latents_are_unpacked(models):
    """FLUX's verl-omni pipeline returns 2x2-packed latents: the backend unpacks them into the policy's layout."""
    cfg = _sampler("flow_grpo", StepSelection("window", k=2, window_range=(1, 4)))
    backend, _ = _backend(models, "flux", cfg)
    outs, full, (start, end) = _verl_omni_outputs(models["flux"], "flux", cfg, packed=True)
    backend.engine.generate = lambda prompts, params: [outs.pop(0)]
    backend.layout = VERL_OMNI
    traj = backend.generate(STEP, 0, PIDS, SIDS, PROMPTS)
    assert torch.equal(traj.states, full.states[:, start:end].float().double())
