"""The vLLM-Omni rollout's pure parts, one function at a time (no engine, no model fixture): the output parser's
edge cases (a wrapped output, missing fields, a window of three steps, one past it, packed latents on a
non-square grid), decoded images in every layout the engines return, the served geometry from config dicts,
the LoRA slot's files, and the request builder's fields. What the end-to-end CPU tests in
test_vllm_rollout.py do not pin down (scripts/mutation.sh's ``omni`` scope runs both)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from verl_digen.algo.selection import StepSelection
from verl_digen.archs import arch_facts
from verl_digen.models.packing import pack_2x2
from verl_digen.rollout.omni import lora as L
from verl_digen.rollout.omni import served as S
from verl_digen.rollout.omni.extension import DigenWorkerExtension
from verl_digen.rollout.omni.output import DIGEN, VERL_OMNI, _latents, _one, match_steps, parse_output, to_pixels
from verl_digen.rollout.omni.policy import engine_policy
from verl_digen.rollout.omni.request import RowRequest, StepSettings, build_requests, is_digen_pipeline
from verl_digen.rollout.omni.stepper import StepBatch
from verl_digen.rollout.sampler import SamplerConfig

torch.set_num_threads(1)
SCHEDULE = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0], dtype=torch.float64)  # 4 steps
SHAPE = (2, 4, 6)  # a non-square latent: swapped height and width would not fit


def _window_output(steps: list[int], n_latents: int | None = None, **kw) -> SimpleNamespace:
    """A verl-omni layout output for a contiguous (or not) list of recorded steps; latent i is filled with i."""
    n = len(steps) + 1 if n_latents is None else n_latents
    lat = torch.stack([torch.full(SHAPE, float(i)) for i in range(n)]).unsqueeze(0)
    return SimpleNamespace(trajectory_latents=lat, trajectory_log_probs=-torch.arange(1.0, len(steps) + 1)[None],
                           trajectory_timesteps=(SCHEDULE[steps] * 1000).float()[None], **kw)


# -- output: _one and match_steps ---------------------------------------------------------------------------
def test_one_takes_arrays_and_any_tensor_dtype_and_refuses_a_batch_of_two():
    assert torch.equal(_one(np.ones((1, 2, 3)), "x"), torch.ones(2, 3, dtype=torch.float64))  # an array
    assert torch.equal(_one([[1.0, 2.0]], "x"), torch.tensor([1.0, 2.0], dtype=torch.float64))  # a list
    bf16 = torch.ones(1, 3, dtype=torch.bfloat16)  # numpy has no bfloat16: a tensor is taken as it is
    assert _one(bf16, "x").dtype == torch.bfloat16
    assert torch.equal(_one(torch.tensor([3.0]), "x"), torch.tensor(3.0))  # one request's scalar
    with pytest.raises(RuntimeError, match="x of one request must have a leading batch dimension of 1, got"):
        _one(torch.ones(2, 3), "x")
    with pytest.raises(RuntimeError, match=r"vLLM-Omni returned no trajectory_log_probs"):
        _one(None, "trajectory_log_probs")


def test_match_steps_accepts_a_sigma_exactly_atol_away_and_refuses_one_beyond():
    assert match_steps(torch.tensor([0.75, 0.5]), SCHEDULE, atol=0.125).tolist() == [1, 2]
    assert match_steps(torch.tensor([0.625]), SCHEDULE, atol=0.125).tolist() == [1]  # 0.125 away: on the step
    with pytest.raises(RuntimeError, match="not on verl-digen's schedule"):
        match_steps(torch.tensor([0.625]), SCHEDULE, atol=0.0625)


# -- output: parse_output ------------------------------------------------------------------------------------
def test_parse_output_reads_a_wrapped_output_and_names_a_failed_or_missing_field():
    inner = _window_output([1, 2, 3], images=[torch.rand(3, 4, 6)])
    row = parse_output(SimpleNamespace(request_output=inner), VERL_OMNI, SCHEDULE, torch.tensor([2]), SHAPE)
    assert row.steps.tolist() == [2] and float(row.states[0, 0, 0, 0]) == 1.0 and row.image.shape == (3, 4, 6)
    with pytest.raises(RuntimeError, match="vLLM-Omni request failed: out of memory"):
        parse_output(_window_output([1], error="out of memory"), VERL_OMNI, SCHEDULE, torch.tensor([1]), SHAPE)
    for name in ("trajectory_latents", "trajectory_log_probs", "trajectory_timesteps"):
        out = _window_output([1])
        delattr(out, name)  # an output object without the field at all (no error field either)
        with pytest.raises(RuntimeError, match=f"vLLM-Omni returned no {name}: "):
            parse_output(out, VERL_OMNI, SCHEDULE, torch.tensor([1]), SHAPE)


def test_parse_output_of_a_three_step_window_that_ends_the_trajectory():
    """Steps 1-3 of 4 recorded: each trained step's (state, next state) is its window position's pair, and the
    last latent is the final one (the window reaches the last step)."""
    out = _window_output([1, 2, 3])
    row = parse_output(out, VERL_OMNI, SCHEDULE, torch.tensor([1, 3]), SHAPE)
    assert [float(s[0, 0, 0]) for s in row.states] == [0.0, 2.0]
    assert [float(s[0, 0, 0]) for s in row.next_states] == [1.0, 3.0]
    assert row.log_probs.tolist() == [-1.0, -3.0] and torch.equal(row.final, torch.full(SHAPE, 3.0))
    mid = parse_output(_window_output([0, 1, 2]), VERL_OMNI, SCHEDULE, torch.tensor([0]), SHAPE)
    assert mid.final.shape == SHAPE and bool(mid.final.isnan().all())  # ends before the last step: unknown


def test_parse_output_refuses_windows_it_cannot_read():
    with pytest.raises(RuntimeError, match="verl-omni layout: 3 latents for 3 log-probs"):  # W latents, not W + 1
        parse_output(_window_output([1, 2, 3], n_latents=3), VERL_OMNI, SCHEDULE, torch.tensor([1]), SHAPE)
    with pytest.raises(RuntimeError, match="one contiguous window"):  # a gap at step 2
        parse_output(_window_output([0, 1, 3]), VERL_OMNI, SCHEDULE, torch.tensor([1]), SHAPE)
    with pytest.raises(RuntimeError, match="outside the recorded SDE window"):  # one past the window
        parse_output(_window_output([0, 1]), VERL_OMNI, SCHEDULE, torch.tensor([2]), SHAPE)


def test_parse_output_digen_layout_checks_its_latent_count_and_unpacks_tokens():
    x = torch.randn(5, *SHAPE)  # K = 2: (s0, n0, s1, n1, final)
    out = SimpleNamespace(trajectory_latents=pack_2x2(x)[None], trajectory_log_probs=torch.tensor([[-1.0, -2.0]]),
                          trajectory_timesteps=SCHEDULE[[1, 3]][None], images=None)
    row = parse_output(out, DIGEN, SCHEDULE, torch.tensor([1, 3]), SHAPE, packed=True)
    assert torch.equal(row.states, x[[0, 2]]) and torch.equal(row.next_states, x[[1, 3]])
    assert torch.equal(row.final, x[4]) and row.image is None
    with pytest.raises(RuntimeError, match="do not hold latents"):  # packed tokens read as latents are refused
        parse_output(out, DIGEN, SCHEDULE, torch.tensor([1, 3]), SHAPE)
    out.trajectory_latents = out.trajectory_latents[:, :4]  # no final latents
    with pytest.raises(RuntimeError, match="verl-digen layout: 4 latents, 2 log-probs, steps \\[1, 3\\]; expected 2K"):
        parse_output(out, DIGEN, SCHEDULE, torch.tensor([1, 3]), SHAPE, packed=True)


def test_latents_unpack_a_non_square_grid():
    x = torch.randn(3, *SHAPE)
    assert torch.equal(_latents(pack_2x2(x), SHAPE, True), x)


@pytest.mark.parametrize("images", [None, []])
def test_parse_output_without_images_has_no_image(images):
    out = _window_output([1, 2, 3], images=images)
    assert parse_output(out, VERL_OMNI, SCHEDULE, torch.tensor([1]), SHAPE).image is None
    del out.images  # an output object without the field
    assert parse_output(out, VERL_OMNI, SCHEDULE, torch.tensor([1]), SHAPE).image is None


def test_parse_output_takes_the_first_of_several_images_and_a_video_tensor_whole():
    a, b = torch.rand(3, 4, 6), torch.rand(3, 4, 6)
    row = parse_output(_window_output([1], images=[a, b]), VERL_OMNI, SCHEDULE, torch.tensor([1]), SHAPE)
    assert torch.equal(row.image, a)
    video = torch.rand(5, 4, 6, 3)  # (F, H, W, C), no batch axis
    row = parse_output(_window_output([1], images=video), VERL_OMNI, SCHEDULE, torch.tensor([1]), SHAPE)
    assert torch.equal(row.image, video.permute(3, 0, 1, 2))


# -- output: to_pixels ---------------------------------------------------------------------------------------
def test_to_pixels_reads_every_layout():
    img = torch.rand(3, 4, 6)
    assert torch.equal(to_pixels([img]), img)  # a list of one frame is an image, not a 1-frame video
    rgba = Image.fromarray(np.full((4, 6, 4), 255, dtype=np.uint8), "RGBA")
    assert torch.equal(to_pixels(rgba), torch.ones(3, 4, 6))  # any PIL mode is read as RGB
    gray = Image.fromarray(np.full((4, 6), 255, dtype=np.uint8), "L")
    assert torch.equal(to_pixels(gray), torch.ones(3, 4, 6))
    assert torch.equal(to_pixels(img.to(torch.bfloat16)), img.to(torch.bfloat16).float())  # no numpy round trip
    assert torch.equal(to_pixels(img), img)  # float in [0, 1]: kept, not divided by 255
    assert torch.equal(to_pixels(img[:1]), img[:1])  # one channel, channels first
    assert torch.equal(to_pixels(img.permute(1, 2, 0)[None]), img)  # (1, H, W, C): batch axis dropped
    gray_video = torch.rand(2, 4, 6, 1)  # (F, H, W, 1)
    assert torch.equal(to_pixels(gray_video), gray_video.permute(3, 0, 1, 2))
    with pytest.raises(ValueError, match="cannot read a decoded output of shape"):
        to_pixels(torch.rand(4, 6))


# -- stepper, policy, extension ------------------------------------------------------------------------------
def test_row_latents_interleave_each_steps_pair_then_the_final_latents():
    states, nexts = torch.tensor([[[0.0], [2.0]]]), torch.tensor([[[1.0], [3.0]]])  # one row, K = 2
    batch = StepBatch(states, nexts, torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[4.0]]))
    assert batch.row_latents(0).flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_engine_policy_applies_the_released_pipelines_settings_unless_told_not_to():
    transformer = torch.nn.Linear(1, 1)  # the adapter only holds it here
    assert engine_policy("qwen_image", transformer, (16, 8, 8)).cfg_renorm  # pretrained by default
    assert not engine_policy("qwen_image", transformer, (16, 8, 8), pretrained=False).cfg_renorm


def test_the_extension_names_a_pipeline_that_cannot_load_weights():
    ext = DigenWorkerExtension.__new__(DigenWorkerExtension)
    ext.model_runner = SimpleNamespace()  # no pipeline at all
    with pytest.raises(RuntimeError, match="the served pipeline NoneType is not a verl-digen RL pipeline"):
        ext.digen_load_weights({})

    class StockPipeline:
        pass

    ext.model_runner = SimpleNamespace(pipeline=StockPipeline())
    with pytest.raises(RuntimeError, match="the served pipeline StockPipeline is not"):
        ext.digen_load_weights({})


# -- served geometry -----------------------------------------------------------------------------------------
FLUX_T = {"in_channels": 64, "guidance_embeds": True}
FLUX_VAE = {"block_out_channels": [8, 8, 8]}  # 4x spatial, not the released 8x


def test_served_shape_from_config_dicts():
    got = S.served_shape("flux", FLUX_T, FLUX_VAE, latent_size=6, latent_width=4)
    assert got == S.ServedShape((16, 6, 4), (24, 16, 1), 4, 1, True, True)
    got = S.served_shape("flux", {"in_channels": 64}, None, latent_size=6, latent_width=4)  # the released VAE
    assert got == S.ServedShape((16, 6, 4), (48, 32, 1), 8, 1, True, False)
    got = S.served_shape("flux", FLUX_T, FLUX_VAE)  # the released pixel size, 512x512
    assert got.latent_shape == (16, 128, 128) and got.pixels == (512, 512, 1)


def test_read_served_shape_reads_the_vae_config_locally_and_does_without_one(monkeypatch, tmp_path):
    import diffusers

    spec = S.MODEL_REGISTRY["flux"].pretrained
    calls: list[tuple] = []

    def loader(configs):
        def load_config(path, subfolder=None, **kw):
            calls.append((path, subfolder, kw))
            if path != str(tmp_path) or subfolder not in configs:
                raise OSError(f"no {subfolder} config")
            return configs[subfolder]
        return load_config

    for vae in (FLUX_VAE, None):
        configs = {"transformer": FLUX_T, **({"vae": FLUX_VAE} if vae else {})}
        for cls in (spec.transformer_class, spec.vae_class):  # stand-ins, without importing the real classes
            monkeypatch.setitem(vars(diffusers), cls, SimpleNamespace(load_config=loader(configs)))
        got = S.read_served_shape("flux", str(tmp_path), latent_size=6, latent_width=4)
        assert got == S.served_shape("flux", FLUX_T, vae, latent_size=6, latent_width=4)
        assert got.spatial == (4 if vae else 8)
    assert [(c[1], c[2]) for c in calls] == [("transformer", {"local_files_only": True}),
                                             ("vae", {"local_files_only": True})] * 2



def test_text_conditioner_encodes_an_empty_negative_prompt_on_the_cpu_in_float32_by_default(monkeypatch):
    calls: list[tuple] = []

    def encoder(prompts, device, dtype):
        calls.append((prompts, device, dtype))
        return {"prompt_embeds": torch.ones(len(prompts), 2, 3, dtype=dtype)}

    cond = S.TextConditioner(encoder, guidance_distilled=False)(["a", "b"])
    assert calls == [(["a", "b"], "cpu", torch.float32), ([""], "cpu", torch.float32)]
    assert cond.negative["prompt_embeds"].shape == (2, 2, 3)
    assert S.TextConditioner(encoder, guidance_distilled=True)(["a"]).negative is None  # no CFG: no negative rows
    loads: list[tuple] = []

    def load_pipeline(*args, **kw):
        loads.append((args, kw))
        return SimpleNamespace(to=lambda device: f"pipe on {device}")

    monkeypatch.setattr(S, "load_pipeline", load_pipeline)
    monkeypatch.setattr(S, "PipelinePromptEncoder", lambda pipe, cls: (pipe, cls.arch))
    got = S.TextConditioner.from_checkpoint("sd3", "ckpt", torch.float64, "cuda:7", guidance_distilled=True)
    assert loads == [(("sd3", "ckpt", torch.float64), {"transformer": None, "vae": None})]  # text encoders only
    assert got.encoder == ("pipe on cuda:7", "sd3") and got.negative_prompt == "" and got.dtype == torch.float64
    assert got.guidance_distilled is True and got.device == "cuda:7"

# -- LoRA slot -----------------------------------------------------------------------------------------------
def test_peft_config_is_the_trainers_adapter_config():
    assert L.peft_config(4, None, ("to_q", "to_k")) == {
        "peft_type": "LORA", "r": 4, "lora_alpha": 4.0, "target_modules": ["to_q", "to_k"], "lora_dropout": 0.0,
        "bias": "none"}
    assert L.peft_config(4, 8, ["to_q"])["lora_alpha"] == 8.0


def test_lora_slot_writes_its_config_and_names_the_adapter_and_closes_quietly():
    made: list[tuple] = []
    slot = L.LoraSlot(L.peft_config(2, None, ["to_q"]), lambda *a: made.append(a) or a)
    assert slot.dir.name.startswith("digen_lora_") and slot.version is None
    req = slot.write(3, {"to_q.lora_A.weight": torch.ones(2, 2)})
    assert made == [(L.ADAPTER_NAME, L.ADAPTER_ID, str(slot.dir))] and req == made[0] and slot.version == 3
    assert json.loads((slot.dir / L.CONFIG_FILE).read_text()) == slot.config
    assert list(slot.read()) == ["to_q.lora_A.weight"]
    for f in slot.dir.iterdir():
        f.unlink()
    slot.dir.rmdir()  # removed by someone else (a tmp cleaner): closing still succeeds
    slot.close()
    assert slot.closed


# -- requests --------------------------------------------------------------------------------------------------
def test_is_digen_pipeline_knows_only_verl_digens_own():
    assert is_digen_pipeline(arch_facts("sd3").rl_pipeline)
    assert not is_digen_pipeline("verl_omni.pipelines.FlowGRPOSD3Pipeline")


def test_from_prompt_names_what_it_got():
    with pytest.raises(ValueError, match=r"^a verl-digen RL pipeline needs each prompt .* got str$"):
        RowRequest.from_prompt("a red cube")


def test_step_settings_travel_as_lists_and_cast_to_the_asked_dtype():
    s = StepSettings((1.0, 0.5, 0.0), "sde", 0.7, "gaussian", (True, False), 4.5, (4, 8, 8))
    d = s.to_dict()
    assert all(isinstance(d[k], list) for k in ("sigmas", "sde_mask", "latent_shape"))
    assert s.sigma_tensor(torch.float32).dtype == torch.float32


def test_requests_ask_for_trajectories_with_an_empty_negative_prompt_by_default():
    cfg = SamplerConfig(num_steps=4, shift=3.0, sde="flow_grpo", eta=0.6, selection=StepSelection("first_k", k=2),
                        decode=False)
    reqs = build_requests(cfg, 1, 0, [0], [0], ["a cat"], latent_shape=(4, 8, 8), pixels=(64, 64, 1))
    assert reqs.params["return_trajectory_latents"] is True
    assert set(reqs.prompts[0]) == {"prompt", "negative_prompt", "additional_information"}
    assert reqs.prompts[0]["negative_prompt"] == ""
