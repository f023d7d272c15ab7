"""Worker-side policy helpers without Ray: identical policies per config, weight export/import."""

import dataclasses
import os

import pytest
import torch
from workers_helpers import rows_of, tiny_cfg

from verl_digen.workers import fsdp
from verl_digen.workers import policy as P


@pytest.mark.parametrize("lora", [0, 2])
def test_same_config_same_weights_whatever_the_global_rng(lora):
    cfg = tiny_cfg(lora_rank=lora)
    a = P.weights_checksum(P.policy_weights(P.build_policy(cfg), bool(lora)))
    torch.manual_seed(1234)
    torch.randn(100)
    b = P.weights_checksum(P.policy_weights(P.build_policy(cfg), bool(lora)))
    assert a == b


def test_lora_export_is_adapter_only_and_round_trips():
    cfg = tiny_cfg(lora_rank=2)
    src, dst = P.build_policy(cfg), P.build_policy(cfg)
    with torch.no_grad():
        for name, p in src.transformer.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)
    state = P.policy_weights(src, lora=True)
    assert state and all("lora_" in k for k in state)
    assert P.weights_checksum(state) != P.weights_checksum(P.policy_weights(dst, lora=True))
    P.load_policy_weights(dst, state, lora=True)
    assert P.weights_checksum(state) == P.weights_checksum(P.policy_weights(dst, lora=True))
    with pytest.raises(ValueError, match="missing"):
        P.load_policy_weights(dst, {k: v for k, v in list(state.items())[1:]}, lora=True)


def test_full_export_mismatch_is_an_error():
    model = P.build_policy(tiny_cfg())
    state = P.policy_weights(model, lora=False)
    state.pop(next(iter(state)))
    with pytest.raises(ValueError, match="do not match the policy"):
        P.load_policy_weights(model, state, lora=False)


def test_rows_need_one_prompt_each():
    with pytest.raises(ValueError, match="one prompt per row"):
        P.check_rows([(0, 0), (0, 1)], ["a"])
    with pytest.raises(ValueError, match="at least one"):
        P.check_rows([], [])


def test_rows_are_drawn_from_the_runs_seed_and_the_step():
    """The same row, step and seed give the same trajectory on any worker; another step or seed, another."""
    cfg = tiny_cfg()
    model = P.freeze(P.build_policy(cfg))
    rows, prompts = rows_of([0], 1)
    base = P.generate_rows(model, cfg, 3, 0, rows, prompts).states
    assert torch.equal(P.generate_rows(model, cfg, 3, 0, rows, prompts).states, base)
    assert not torch.equal(P.generate_rows(model, cfg, 4, 0, rows, prompts).states, base)
    assert not torch.equal(P.generate_rows(model, dataclasses.replace(cfg, seed=2), 3, 0, rows, prompts).states, base)


def test_vllm_backend_without_vllm_names_the_extra():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed here")
    from verl_digen.workers.vllm_backend import build_rollout_backend

    cfg = tiny_cfg(rollout_backend="vllm")
    with pytest.raises(ImportError, match=r"pip install verl-digen\[vllm\]"):
        build_rollout_backend(cfg)


@pytest.mark.slow
def test_bf16_wan_generator_generation_copy_and_synced_weights_sample_alike():
    """issue 44: a bf16 Wan generator as built, TAG's generation copy gathered from the float32 master, and a
    generator after a weight sync from that master hold the same weights (``_keep_in_fp32_modules`` keep their
    float32 values, unrounded) and so sample the same trajectories, bit for bit."""
    torch.set_num_threads(1)
    cfg = dataclasses.replace(tiny_cfg(dtype="bfloat16"), policy=dataclasses.replace(
        tiny_cfg().policy, arch="wan", dtype="bfloat16", latent_size=4, num_frames=2))
    master = P.build_policy(cfg, dtype="float32")
    generator = P.freeze(P.build_policy(cfg))
    copy = P.freeze(P.build_policy(cfg))
    fsdp.copy_full_state(master.transformer, copy.transformer)
    synced = P.freeze(P.build_policy(cfg))
    P.load_policy_weights(synced, P.policy_weights(master, lora=False), lora=False)
    kept = [n for n, t in generator.transformer.state_dict().items() if t.dtype == torch.float32]
    assert "condition_embedder.time_embedder.linear_1.weight" in kept and "scale_shift_table" in kept
    ref = P.weights_checksum(P.policy_weights(generator, lora=False))
    for other in (copy, synced):
        assert P.weights_checksum(P.policy_weights(other, lora=False)) == ref
    rows, prompts = [(0, 0), (0, 1), (1, 0)], ["a red cube", "a red cube", "a blue sphere"]
    a = P.generate_rows(generator, cfg, 1, 0, rows, prompts)
    for other in (copy, synced):
        assert torch.equal(P.generate_rows(other, cfg, 1, 0, rows, prompts).final_latents, a.final_latents)


def test_a_worker_process_gets_one_blas_thread(monkeypatch):
    """Several workers share the 2-core machine: one BLAS thread each, also for OpenMP code started later."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        P.setup_worker_process()
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    finally:
        torch.set_num_threads(before)


def test_build_policy_hands_every_policy_setting_to_the_model(monkeypatch):
    """What the config says reaches the model: its checkpoint, seed, latent width, frames and LoRA targets."""
    built, adapted = [], []
    monkeypatch.setattr(P, "build_model", lambda arch, **kw: built.append((arch, kw)) or "model")
    monkeypatch.setattr(P, "apply_lora", lambda model, **kw: adapted.append((model, kw)))
    policy = dataclasses.replace(tiny_cfg().policy, pretrained="/ckpt", seed=5, latent_width=6, num_frames=3,
                                 lora_rank=2, lora_alpha=4.0, lora_target_modules=("to_q",))
    assert P.build_policy(dataclasses.replace(tiny_cfg(), policy=policy), "meta", dtype="float32") == "model"
    assert built == [("flux", dict(pretrained="/ckpt", dtype=torch.float32, device="meta", seed=5, latent_size=8,
                                   latent_width=6, num_frames=3))]
    assert adapted == [("model", dict(rank=2, alpha=4.0, target_modules=("to_q",)))]
