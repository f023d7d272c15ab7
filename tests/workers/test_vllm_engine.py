"""The opt-in vLLM tier: the real vLLM-Omni 0.30.0 engine on CPU, serving verl-digen's RL pipeline of every
architecture (SD3, FLUX, Qwen-Image, Wan2.1, HunyuanVideo).

Runs only where ``vllm_omni`` imports (``scripts/vllm_tier.sh`` makes such a venv); elsewhere
``tests/conftest.py`` skips it with that reason. vllm-omni has no CPU platform: ``vllm_cpu_platform`` supplies
the missing hooks. The engine is ``VllmOmniRollout`` itself (``rollout.backend=vllm``): ``Omni(model=<a tiny
local checkpoint>, custom_pipeline_args={"pipeline_class": DigenSD3Pipeline}, ...)`` (FLUX: ``DigenFluxPipeline``,
packed latents and distilled guidance; Qwen-Image: ``DigenQwenImagePipeline``, packed latents, text masks and
CFG; Wan2.1: ``DigenWanPipeline``, video latents; HunyuanVideo 1.0: ``DigenHunyuanVideoPipeline``, diffusers'
own pipeline inside vllm-omni's adapter). Checked here, per architecture:

- one ``generate`` runs a micro-batch as one request batch, and its trajectories are the trainer's: the
  log-probs equal ``algo.tsp.recompute_log_probs`` with verl-digen's adapter loaded from the same checkpoint
  (float32; the engine's transformer is vllm-omni's re-implementation, so not bit for bit), x_T is the
  sample's own stream exactly, and the states follow the diffusers sampler;
- a full fine-tune's weights reach the engine through the worker extension: samples move, log-probs recompute;
- LoRA updates move samples: adapters installed under the one adapter id (HunyuanVideo: through the worker
  extension) change the trajectories, the trainer with the same adapters recomputes the new log-probs, and the
  trainer without them does not (the check can fail);
- issue 43: the text encoders live once (the engine's) and give the trainer's conditioning; a collective pickup
  lands in the engine bit-identical; two engines of one worker group on one node run on rendezvous of their own.

Figures (engine start, generate, max |diff|) are printed at the end of the module and written to
``$VLLM_TIER_FIGURES`` (default ``<tmp>/verl-digen-vllm-tier.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from verl_digen.algo.loss import LossConfig
from verl_digen.algo.selection import StepSelection
from verl_digen.algo.tsp import recompute_log_probs
from verl_digen.models.arch import MODEL_REGISTRY
from verl_digen.models.loading import load_pretrained
from verl_digen.models.lora import (
    apply_lora,
    default_lora_targets,
    disable_adapters,
    load_lora_state_dict,
    lora_state_dict,
)
from verl_digen.rollout.omni.extension import LOAD_WEIGHTS
from verl_digen.rollout.omni.lora import ADAPTER_ID, lora_through_extension
from verl_digen.rollout.omni.served import TextConditioner
from verl_digen.rollout.sampler import SamplerConfig, initial_noise, sample_trajectories
from verl_digen.workers.config import PolicyConfig, WorkerConfig

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARCHS = ("sd3", "flux", "qwen_image", "wan", "hunyuan_video")
VIDEO = ("wan", "hunyuan_video")
FRAMES = 9  # video: pixel frames; 3 latent frames by the checkpoint's VAE config
SEED, LATENT, RANK = 11, 8, 4
PIDS, SIDS = [0, 0, 1, 1], [0, 1, 0, 1]
PROMPTS = ["a red cube", "a red cube", "two cats on a mat", "two cats on a mat"]
#: float32 engine vs float32 trainer on different transformer implementations (vllm-omni's vs diffusers'); the
#: measured differences (docs/testing.md): SD3 1.2e-7, FLUX, Qwen-Image and HunyuanVideo 0, Wan up to 9e-5
LOGPROB_ATOL = 5e-4
#: whole trajectories against the diffusers sampler: the per-step float32 differences compound over the steps
#: (Wan's were 2.4e-4 after 3 steps, SD3's 2.4e-7, FLUX's 0)
STATES_ATOL = 1e-3
FIGURES: dict[str, object] = {}


def _distilled(arch: str) -> bool:
    return MODEL_REGISTRY[arch].pretrained.guidance_distilled


def _sampler(arch: str) -> SamplerConfig:
    # real CFG (a negative row per sample in the batched forward) except for the guidance-distilled FLUX and
    # HunyuanVideo (guidance embedding, no CFG branch)
    gs = 3.5 if _distilled(arch) else 2.0
    return SamplerConfig(num_steps=4, shift=3.0, sde="flow_grpo", eta=0.7, guidance_scale=gs,
                         selection=StepSelection("first_k", k=3), decode=True)


def _latent(arch: str) -> tuple[int, ...]:
    return (4, 3, LATENT, LATENT) if arch in VIDEO else (4, LATENT, LATENT)


def _cfg(arch: str, checkpoint: str) -> WorkerConfig:
    policy = PolicyConfig(arch=arch, pretrained=checkpoint, dtype="float32", latent_size=LATENT, lora_rank=RANK,
                          num_frames=FRAMES if arch in VIDEO else None)
    return WorkerConfig(policy=policy, sampler=_sampler(arch), seed=SEED, rollout_backend="vllm",
                        vllm_max_batch=len(PROMPTS))


@pytest.fixture(scope="module", params=ARCHS)
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def checkpoint(arch, tmp_path_factory) -> str:
    from vllm_engine_helpers import SAVERS

    return SAVERS[arch](tmp_path_factory.mktemp(f"tiny_{arch}") / arch, seed=0)


@pytest.fixture(scope="module")
def batches(arch):
    """The sizes of the request batches verl-digen's pipeline ran (the engine runs inline in this process)."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from verl_digen.rollout.omni.request import pipeline_class

    cls = resolve_obj_by_qualname(pipeline_class(arch))
    sizes: list[int] = []
    forward = cls.forward

    def recording(self, req):
        out = forward(self, req)
        sizes.append(len(out))
        return out

    cls.forward = recording
    yield sizes
    del cls.forward  # back to the mixin's


@pytest.fixture(scope="module")
def rollout(request, arch, checkpoint, batches):
    """``VllmOmniRollout`` on the real engine (LoRA-configured; base weights until ``load_weights``)."""
    import vllm_cpu_platform

    from verl_digen.workers.vllm_backend import VllmOmniRollout

    FIGURES[f"{arch}_device"] = "cpu (vllm_cpu_platform hooks)" if vllm_cpu_platform.install() else "the GPU's platform"
    cfg = _cfg(arch, checkpoint)
    t0 = time.perf_counter()
    backend = VllmOmniRollout(cfg, "cpu")
    FIGURES[f"{arch}_engine_start_s"] = round(time.perf_counter() - t0, 2)
    yield backend
    backend.close()
    backend.engine.close()
    _report(request.config, arch)


@pytest.fixture(scope="module")
def trainer(arch, checkpoint):
    """verl-digen's adapter on the same checkpoint, with LoRA adapters of the rollout's settings."""
    model = load_pretrained(arch, checkpoint, torch.float32, latent_size=LATENT,
                            num_frames=FRAMES if arch in VIDEO else None)
    return apply_lora(model, RANK, target_modules=default_lora_targets(model))


def _report(config, arch: str) -> None:
    """Write every architecture's figures so far, and print this one's past pytest's output capture."""
    path = Path(os.environ.get("VLLM_TIER_FIGURES", Path(tempfile.gettempdir()) / "verl-digen-vllm-tier.json"))
    path.write_text(json.dumps(FIGURES, indent=1))
    mine = {k[len(arch) + 1:]: v for k, v in FIGURES.items() if k.startswith(f"{arch}_")}
    line = f"\nvLLM tier figures, {arch} (all in {path}): {json.dumps(mine)}"
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print(line, flush=True)


def _generate(rollout, step: int, version: int, key: str):
    t0 = time.perf_counter()
    traj = rollout.generate(step, version, PIDS, SIDS, PROMPTS)
    FIGURES[f"{rollout.arch}_{key}_generate_s"] = round(time.perf_counter() - t0, 2)
    return traj


def _recompute_diff(trainer, traj) -> float:
    train_cfg = _sampler(trainer.arch).train_config(LossConfig())
    with torch.no_grad():
        ref = recompute_log_probs(trainer, traj, train_cfg)
    return float((ref.double() - traj.log_probs.double()).abs().max())


def test_the_text_encoders_are_built_once_per_generator(arch, rollout, checkpoint):
    """Starting ``VllmOmniRollout`` builds one copy of the checkpoint's text encoders (the engine's); the
    conditioning the trainer needs comes from them, equal to a separate ``TextConditioner``'s."""
    from vllm_engine_helpers import live_text_encoders, text_encoder_count

    from verl_digen.workers.vllm_backend import EngineConditioner

    assert isinstance(rollout.conditioner, EngineConditioner)
    live, one_copy = live_text_encoders(checkpoint), text_encoder_count(checkpoint)
    FIGURES[f"{arch}_text_encoders_live_after_start"] = live
    FIGURES[f"{arch}_text_encoders_in_one_copy"] = one_copy
    assert live == one_copy  # the engine's; the generator built none (before issue 43: twice as many)
    own = TextConditioner.from_checkpoint(arch, checkpoint, torch.float32, "cpu", guidance_distilled=_distilled(arch))
    got, want = rollout.conditioner(PROMPTS), own(PROMPTS)
    for a, b in ((got.tensors, want.tensors), (got.negative, want.negative)):
        assert (a is None) == (b is None)
        if a is not None:
            assert set(a) == set(b)
            diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
            FIGURES[f"{arch}_engine_cond_max_abs_diff_vs_own_encoders"] = diff
            assert diff < 1e-5


def test_engine_batches_a_micro_batch_and_its_log_probs_equal_the_trainers(arch, rollout, trainer, batches):
    before = len(batches)
    traj = _generate(rollout, step=3, version=0, key="base")
    assert batches[before:] == [len(PROMPTS)]  # the micro-batch ran as one request batch
    b, k = len(PROMPTS), 3
    assert traj.log_probs.shape == (b, k) and traj.states.shape == (b, k, *_latent(arch))
    assert torch.isfinite(traj.log_probs).all() and traj.images is not None
    if arch not in VIDEO:  # the decoded images, back through the stock post-processor (PIL)
        assert traj.images.shape == (b, 3, 2 * LATENT, 2 * LATENT)
    FIGURES[f"{arch}_images_shape"] = list(traj.images.shape)
    # x_T is each sample's own placement-invariant stream, exactly (the engine draws it in float32 as the sampler)
    x_t = initial_noise(_latent(arch), PIDS, SIDS, SEED, 3, torch.float32)
    assert torch.equal(traj.states[:, 0], x_t)
    # the trainer recomputes the engine's log-probs from the same transitions
    diff = _recompute_diff(trainer, traj)
    FIGURES[f"{arch}_base_logprob_max_abs_diff"] = diff
    FIGURES[f"{arch}_base_logprob_max_abs"] = float(traj.log_probs.abs().max())
    assert diff < LOGPROB_ATOL
    # and the diffusers sampler of the same model draws the same trajectories (same noise, same sigmas)
    with torch.no_grad():  # the trainer's adapters are still zero (peft's B init): the base model
        ref = sample_trajectories(trainer, traj.cond, PROMPTS, PIDS, SIDS, _sampler(arch), SEED, 3, version=0)
    FIGURES[f"{arch}_base_states_max_abs_diff_vs_diffusers"] = float((ref.states - traj.states).abs().max())
    assert torch.allclose(ref.states, traj.states, atol=STATES_ATOL)


def test_full_weights_reach_the_engine_through_the_worker_extension(arch, rollout, trainer):
    """A full fine-tune's update: the trainer's transformer weights (diffusers names) go through
    ``collective_rpc(digen_load_weights)`` into the pipeline's stock ``load_weights`` (fused q/k/v and all).
    Runs before any adapter is loaded (the LoRA manager then wraps the layers under new names)."""
    before = _generate(rollout, step=3, version=0, key="before_full")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in trainer.transformer.named_parameters():
            if "lora_" not in name:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    state = {k.replace(".base_layer.", "."): v for k, v in trainer.transformer.state_dict().items() if "lora_" not in k}
    assert rollout._rpc(LOAD_WEIGHTS, (state,)) == [[len(state)]]  # per stage, per worker: every tensor loaded
    traj = _generate(rollout, step=3, version=1, key="full")
    moved = float((traj.states[:, 1:] - before.states[:, 1:]).abs().max())
    FIGURES[f"{arch}_full_states_moved_max"] = moved
    assert moved > 1e-3
    diff = _recompute_diff(trainer, traj)
    FIGURES[f"{arch}_full_logprob_max_abs_diff"] = diff
    assert diff < LOGPROB_ATOL


def test_a_collective_pickup_lands_in_the_engine_bit_identical(arch, rollout, trainer):
    """``digen.sync.backend=collective`` with ``rollout.backend=vllm``: a trainer stand-in sends a full fine-tune's
    transformer over a real gloo ``SyncGroup`` in buckets; ``VllmOmniRollout.receive`` lands them through an
    ``EngineSink`` into the engine's parameters (the template from the checkpoint's config, on the meta device).
    Read back from the engine, every tensor equals the trainer's bit for bit (``torch.equal``; it did not before the
    pickup), and the engine's log-probs recompute."""
    from verl_digen.workers.sync import SyncGroup, new_secret
    from verl_digen.workers.vllm_backend import free_port, sync_layout

    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in trainer.transformer.named_parameters():
            if "lora_" not in name:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    state = {k.replace(".base_layer.", "."): v.detach().clone() for k, v in trainer.transformer.state_dict().items()
             if "lora_" not in k}
    full = replace(rollout.cfg, policy=replace(rollout.cfg.policy, lora_rank=0))
    template = sync_layout(full)
    assert [n for n, _, _ in template] == sorted(state)
    saved = rollout.slot, rollout.lora_config, rollout._template, rollout.bucket_bytes
    rollout.slot = rollout.lora_config = None  # a full fine-tune's engine (the adapters come in the next test)
    rollout._template, rollout.bucket_bytes = template, 16 << 10
    try:
        before = rollout.weights()
        assert not all(torch.equal(before[k], state[k]) for k in state)  # the check can fail
        port, secret, out = free_port(), new_secret(), {}

        def trainer_rank():
            out["sender"] = group = SyncGroup("127.0.0.1", port, 2, 0, timeout_s=120, secret=secret)
            group.send(1, 4, state, rollout.bucket_bytes)

        sender = threading.Thread(target=trainer_rank)
        sender.start()
        t0 = time.perf_counter()
        moved = rollout.receive(SyncGroup("127.0.0.1", port, 2, 1, timeout_s=120, secret=secret), 4, [0])
        FIGURES[f"{arch}_collective_pickup_s"] = round(time.perf_counter() - t0, 3)
        sender.join(120)
        back = rollout.weights()
        assert sorted(back) == sorted(state)
        differ = [k for k in state if not torch.equal(back[k], state[k])]
        FIGURES[f"{arch}_collective_pickup_tensors_differing"] = len(differ)
        assert differ == []
        model_bytes = sum(v.numel() * v.element_size() for v in state.values())
        FIGURES[f"{arch}_collective_pickup_sink_peak_over_model"] = round(moved["staging_peak"] / model_bytes, 3)
        traj = _generate(rollout, step=3, version=4, key="collective")
        assert _recompute_diff(trainer, traj) < LOGPROB_ATOL
    finally:
        rollout.slot, rollout.lora_config, rollout._template, rollout.bucket_bytes = saved


def test_two_engines_on_one_node_each_run(tmp_path, monkeypatch):
    """Two generator processes of one worker group on one node (the same MASTER_ADDR / MASTER_PORT, as verl sets
    them) each start their engine and generate: each engine on a rendezvous port of its own, neither the group's,
    and the worker's variables are back after the engine started."""
    import multiprocessing as mp

    from vllm_engine_helpers import SAVERS, serve_once

    from verl_digen.workers.vllm_backend import free_port

    checkpoint = SAVERS["sd3"](tmp_path / "sd3", seed=0)
    cfg = replace(_cfg("sd3", checkpoint), policy=replace(_cfg("sd3", checkpoint).policy, lora_rank=0),
                  vllm_max_batch=2)
    group_port = str(free_port())
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", group_port)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    t0 = time.perf_counter()
    procs = [ctx.Process(target=serve_once, args=(cfg, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(120)
    FIGURES["two_engines_s"] = round(time.perf_counter() - t0, 1)
    FIGURES["two_engines"] = results
    assert all("error" not in r for r in results), results
    ports = [r["port"] for r in results]
    assert len(set(ports)) == 2 and int(group_port) not in ports
    assert all(r["env_port"] == group_port and r["finite"] and r["log_probs"] == [2, 3] for r in results)


def test_lora_updates_move_samples_under_one_adapter_id(arch, rollout, trainer):
    base = _generate(rollout, step=3, version=0, key="base_again")
    seen_ids, previous = [], base
    for version in (1, 2):
        gen = torch.Generator().manual_seed(version)
        state = {k: 0.5 * torch.randn(v.shape, generator=gen) for k, v in lora_state_dict(trainer).items()}
        load_lora_state_dict(trainer, state)
        rollout.load_weights(version, state)
        if rollout.slot is not None:
            seen_ids.append(rollout.lora_request.lora_int_id)
        traj = _generate(rollout, step=3, version=version, key=f"lora_v{version}")
        moved = float((traj.states[:, 1:] - previous.states[:, 1:]).abs().max())
        FIGURES[f"{arch}_lora_v{version}_states_moved_max"] = moved
        assert moved > 1e-3  # the new adapters changed the velocity the engine steps on
        assert torch.equal(traj.states[:, 0], base.states[:, 0])  # same x_T: only the policy changed
        diff = _recompute_diff(trainer, traj)
        FIGURES[f"{arch}_lora_v{version}_logprob_max_abs_diff"] = diff
        assert diff < LOGPROB_ATOL  # the engine served exactly this version's adapters (not the last one's)
        with disable_adapters(trainer):  # the check can fail: without the adapters the trainer disagrees
            base_diff = _recompute_diff(trainer, traj)
        FIGURES[f"{arch}_lora_v{version}_logprob_diff_if_trainer_had_no_adapters"] = base_diff
        assert base_diff > 10 * LOGPROB_ATOL
        previous = traj
    if lora_through_extension(arch):  # no LoRARequest: the worker extension installs them in the pipeline
        assert rollout.slot is None and rollout.lora_request is None and seen_ids == []
    else:
        assert seen_ids == [ADAPTER_ID, ADAPTER_ID]  # one adapter id for every version
