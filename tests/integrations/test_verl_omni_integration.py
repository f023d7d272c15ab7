"""verl-omni integration without verl-omni: the plugin is inert, and the config conversion (no silent drift).

The checks against the real verl-omni package (registration, lazy import, Hydra composition, the v0-entry
refusal, the dry run, two training steps through verl-omni's v1 entry point with both verl versions, every
example script) are in tests/integrations/test_verl_omni_real.py. Checks that ``import verl`` run in a fresh
interpreter.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_digen.config import checks
from verl_digen.integrations import verl_omni as vo

# the converted configs are verl-omni's GPU scripts, validated as on the GPU machine that holds their weights
pytestmark = pytest.mark.usefixtures("weights_on_this_machine")

ROOT = Path(__file__).resolve().parents[2]

# keys and values as in verl-omni's examples/flowgrpo_trainer/sd35/run_sd35_medium_ocr_lora_v1.sh, on top of
# the defaults of verl_omni/trainer/config/diffusion_trainer.yaml and its diffusion/* groups
VERL_OMNI_SD35 = {
    "data": {"train_files": "/data/ocr/sd3/prompts.jsonl", "train_batch_size": 8, "max_prompt_length": 512},
    "actor_rollout_ref": {
        "model": {
            "path": "stabilityai/stable-diffusion-3.5-medium", "algorithm": "flow_grpo",
            "lora_rank": 32, "lora_alpha": 64,
            "target_modules": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                               "to_add_out"],
        },
        "actor": {
            "strategy": "fsdp2", "ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 8,
            "use_kl_loss": False, "kl_loss_coef": 0.0, "grad_clip": 1.0,
            "diffusion_loss": {"clip_ratio": 1e-5, "adv_clip_max": 5.0, "ref_kl_coef": 0.0},
            "optim": {"lr": 1e-4, "weight_decay": 0.0001},
            "fsdp_config": {"model_dtype": "bfloat16", "param_offload": False},
        },
        "rollout": {
            "name": "vllm_omni", "n": 8, "seed": 42, "log_prob_micro_batch_size_per_gpu": 8,
            "pipeline": {"height": 384, "width": 384, "num_inference_steps": 10, "guidance_scale": 1.0},
            "algo": {"noise_level": 0.8, "sde_type": "cps", "sde_window_size": 3, "sde_window_range": [0, 5]},
        },
    },
    "algorithm": {"adv_estimator": "flow_grpo", "norm_adv_by_std_in_grpo": True, "global_std": True},
    "reward": {"reward_model": {"enable": True, "model_path": "Qwen/Qwen2.5-VL-3B-Instruct"}},
    "trainer": {
        "total_epochs": 15, "total_training_steps": 100, "project_name": "flow_grpo",
        "experiment_name": "sd35_medium_ocr_lora_v1", "logger": ["console", "wandb"], "save_freq": 100,
        "default_local_dir": "checkpoints/flow_grpo/sd35", "device": "cuda", "nnodes": 1, "n_gpus_per_node": 2,
        "use_v1": True, "v1": {"trainer_mode": "digen"},
    },
}


def _runnable(tmp_path: Path, **changes) -> dict:
    """The SD3.5 recipe plus what the migration guide tells a user to add, with a real prompt file."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red cube"}\n{"prompt": "a blue sphere"}\n')
    return {**VERL_OMNI_SD35, "data": {**VERL_OMNI_SD35["data"], "train_files": str(prompts)},
            "resources": {"generator": {"workers": 2}, "trainer": {"workers": 2}},
            "algorithm": {**VERL_OMNI_SD35["algorithm"], "global_std": False}, **changes}


def _run(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (verl plugins on); its last stdout line is a JSON object."""
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT)
    env["VERL_PLATFORM"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=180, cwd=ROOT)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_inert_without_verl_omni():
    if vo.is_available():
        pytest.skip("verl-omni is installed here")
    assert vo.register() is False
    assert vo.install() is False
    out = _run("""
        import json, sys, verl
        from importlib.metadata import entry_points
        from verl_digen.integrations import verl_omni as vo
        print(json.dumps({"plugin": "verl_digen.plugin" in sys.modules, "omni": "verl_omni" in sys.modules,
                          "register": vo.register(), "hooks": [type(f).__name__ for f in sys.meta_path]}))
    """)
    assert out["plugin"] is True  # `import verl` loaded our entry point, and it did not fail
    assert out == {**out, "omni": False, "register": False}
    assert "_AfterImport" not in out["hooks"]  # nothing was installed


def test_from_verl_omni_config_maps_a_recipe():
    notes: list[str] = []
    flat = vo.from_verl_omni_config(VERL_OMNI_SD35, trainer_workers=2, notes=notes)
    assert flat == {
        "data.train_batch_size": 8, "rollout.n": 8, "rollout.micro_batch_size": 16,
        "rollout.num_steps": 10, "rollout.noise_level": 0.8, "rollout.sde_type": "cps",
        "rollout.cps_log_prob": "squared_error", "rollout.selection": "window", "rollout.train_steps": 3,
        "rollout.timestep_fraction": None,
        "rollout.window_range": [0, 5], "rollout.guidance_scale": 1.0,
        "actor.clip_ratio": 1e-5, "algorithm.adv_clip": 5.0, "actor.kl_coef": 0.0, "algorithm.adv_std": "batch",
        "actor.lr": 1e-4, "actor.weight_decay": 1e-4, "actor.grad_clip": 1.0, "actor.ppo_mini_batch_size": 4,
        "model.path": "stabilityai/stable-diffusion-3.5-medium", "model.arch": "sd3", "model.dtype": "bfloat16",
        "model.lora_rank": 32, "model.lora_alpha": 64.0,
        "model.target_modules": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                                 "to_add_out"],
        "model.latent_size": 48, "data.train_files": "/data/ocr/sd3/prompts.jsonl",
        "trainer.total_steps": 100, "trainer.seed": 42, "trainer.project_name": "flow_grpo",
        "trainer.experiment_name": "sd35_medium_ocr_lora_v1", "trainer.save_freq": 100,
        "trainer.default_local_dir": "checkpoints/flow_grpo/sd35", "trainer.logger": ["console", "wandb"],
        "trainer.device": "cuda", "actor.param_offload": False, "algorithm.std_estimator": "unbiased",
    }
    joined = "\n".join(notes)
    for key in ("sde_window_range=[0, 5]", "sde_type=cps", "no scheduler config found"):
        assert key in joined, f"no note about {key}"
    assert "ppo_mini_batch_size" not in joined  # carried, not noted


def test_guidance_scale_takes_the_key_the_architecture_uses():
    """Qwen-Image's pipelines take true_cfg_scale, SD3 / Wan take guidance_scale: neither becomes 1.0 silently."""
    def cfg(path: str, **pipeline) -> tuple[float | None, str]:
        notes: list[str] = []
        out = vo.from_verl_omni_config({"actor_rollout_ref": {"model": {"path": path},
                                                              "rollout": {"pipeline": pipeline}}}, notes=notes)
        return out.get("rollout.guidance_scale"), "\n".join(notes)

    assert cfg("Qwen/Qwen-Image", true_cfg_scale=4.0, guidance_scale=1.0)[0] == 4.0
    assert cfg("Qwen/Qwen-Image", true_cfg_scale=4.0)[0] == 4.0
    assert cfg("Wan-AI/Wan2.2-TI2V-5B-Diffusers", true_cfg_scale=5.0, guidance_scale=5.0)[0] == 5.0
    assert cfg("stabilityai/stable-diffusion-3.5-medium", guidance_scale=4.5, true_cfg_scale=1.0)[0] == 4.5
    assert cfg("stabilityai/stable-diffusion-3.5-medium", guidance_scale=None, true_cfg_scale=4.0)[0] == 4.0
    scale, notes = cfg("Qwen/Qwen-Image", true_cfg_scale=4.0, guidance_scale=2.5)
    assert scale == 4.0 and "guidance_scale=2.5: not used" in notes


def test_sigma_shift_from_the_models_scheduler_config(tmp_path):
    def shift(sched: dict, size: int = 512) -> float:
        (tmp_path / "scheduler").mkdir(exist_ok=True)
        (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(sched))
        out = vo.from_verl_omni_config({"actor_rollout_ref": {"model": {"path": str(tmp_path)}, "rollout": {
            "pipeline": {"height": size, "width": size}}}})
        return out["rollout.shift"]

    assert shift({"shift": 3.0, "use_dynamic_shifting": False}) == 3.0  # SD3.5
    # Qwen-Image: dynamic shift, mu linear in the image tokens (512px: 32 x 32 = 1024 tokens)
    qwen = {"use_dynamic_shifting": True, "base_image_seq_len": 256, "max_image_seq_len": 8192,
            "base_shift": 0.5, "max_shift": 0.9, "shift_terminal": 0.02}
    mu = 0.5 + (0.9 - 0.5) / (8192 - 256) * (1024 - 256)
    assert shift(qwen) == pytest.approx(math.exp(mu))
    assert shift(qwen, size=1024) > shift(qwen, size=512)  # more tokens, more shift


def test_dtype_device_grad_clip_and_window_range_defaults():
    out = vo.from_verl_omni_config({
        "actor_rollout_ref": {
            "actor": {"fsdp_config": {"model_dtype": "fp32"}, "optim": {"clip_grad": 0.5}, "grad_clip": 1.0},
            "rollout": {"pipeline": {"num_inference_steps": 10}, "algo": {"sde_type": "sde", "sde_window_size": 2}}},
        "trainer": {"device": "gpu"}})
    assert (out["model.dtype"], out["trainer.device"], out["actor.grad_clip"]) == ("float32", "cuda", 0.5)
    assert (out["rollout.selection"], out["rollout.train_steps"], out["rollout.window_range"]) == ("window", 2, [0, 5])
    fixed = vo.from_verl_omni_config({"actor_rollout_ref": {"rollout": {"algo": {
        "sde_type": "sde", "sde_window_size": 2, "sde_window_range": [3, 5]}}}})
    assert (fixed["rollout.sde_type"], fixed["rollout.window_start"]) == ("flow_grpo", 3)
    assert "rollout.window_range" not in fixed


def test_ulysses_size_carries_over_from_verl_omnis_fsdp_config_or_verls_actor_key():
    def size(actor: dict, path: str | None = None, notes: list | None = None) -> int | None:
        return vo.from_verl_omni_config({"actor_rollout_ref": {"actor": actor, "model": {"path": path}}},
                                        notes=notes).get("actor.ulysses_sequence_parallel_size")

    assert size({"fsdp_config": {"ulysses_sequence_parallel_size": 4}}) == 4  # verl-omni's examples
    assert size({"ulysses_sequence_parallel_size": 2}) == 2  # verl's actor key
    assert size({"fsdp_config": {"ulysses_sequence_parallel_size": 4}, "ulysses_sequence_parallel_size": 2}) == 4
    assert size({}) is None
    assert size({"fsdp_config": {"ulysses_sequence_parallel_size": 2}}, "Wan-AI/Wan2.1-T2V-14B-Diffusers") == 2
    notes: list[str] = []  # verl-omni's Qwen-Image sp2 example: an image model trains without it, said so
    assert size({"fsdp_config": {"ulysses_sequence_parallel_size": 2}}, "Qwen/Qwen-Image", notes) is None
    assert any("ulysses_sequence_parallel_size=2" in n and "qwen_image trains without it" in n for n in notes)


def test_window_range_bounds_the_drawn_window():
    from verl_digen.algo.selection import StepSelection

    sel = StepSelection("window", k=2, window_range=(1, 5))
    starts = {sel.window(10, seed=0, step=s)[0] for s in range(200)}
    assert starts == {1, 2, 3}  # verl-omni: start in [lo, hi - k]
    with pytest.raises(ValueError, match="window_range"):
        StepSelection("window", k=2, window_range=(4, 5)).num_trained(10)


def test_kl_coefficient_is_converted_to_verl_omnis_convention():
    """verl-omni's sde KL is verl-digen's times each row's |dt|: the coefficient carries as it is, with the
    per-row weighting on (tests/algo: the weighted KL equals verl-omni's formula at shift 3)."""
    notes: list[str] = []
    out = vo.from_verl_omni_config({"actor_rollout_ref": {
        "actor": {"use_kl_loss": True, "kl_loss_coef": 0.04},
        "rollout": {"pipeline": {"num_inference_steps": 10}, "algo": {"sde_type": "sde"}}}}, notes=notes)
    assert out["actor.kl_coef"] == 0.04 and out["actor.kl_dt_weighted"] is True
    assert "actor.kl_dt_weighted=true weights each row's KL by its own |dt|" in "\n".join(notes)
    for sde in ("cps", "dance_sde"):  # the same convention as verl-digen's: copied, unweighted
        other = vo.from_verl_omni_config({"actor_rollout_ref": {
            "actor": {"use_kl_loss": True, "kl_loss_coef": 0.04},
            "rollout": {"pipeline": {"num_inference_steps": 10}, "algo": {"sde_type": sde}}}})
        assert other["actor.kl_coef"] == 0.04 and "actor.kl_dt_weighted" not in other
    off = vo.from_verl_omni_config({"actor_rollout_ref": {"actor": {"use_kl_loss": False, "kl_loss_coef": 0.04}}})
    assert off["actor.kl_coef"] == 0.0 and "actor.kl_dt_weighted" not in off


@pytest.mark.parametrize("bypass", [False, True])
def test_old_log_prob_recompute_is_carried_from_bypass_mode(bypass, tmp_path):
    """verl-omni recomputes the old log-probs unless bypass_mode=True; the converted run does the same."""
    out = vo.from_verl_omni_config({"algorithm": {"rollout_correction": {"bypass_mode": bypass}}})
    assert out["actor.recompute_log_prob"] == ("false" if bypass else "true")
    raw = _runnable(tmp_path)
    raw["algorithm"] = {**raw.get("algorithm", {}), "rollout_correction": {"bypass_mode": bypass}}
    cfg = vo.to_run_config(raw, log=lambda _: None)
    assert cfg.worker_config().loss.recompute_old_log_prob is (not bypass)


@pytest.mark.parametrize("mode", ["grpo_guard", "flow_dppo"])
def test_grpo_guard_and_flow_dppo_carry_to_algorithm_name(mode, tmp_path):
    """verl-omni's examples/{grpoguard,flowdppo}_trainer keys: the loss mode becomes algorithm.name, Flow-DPPO's
    mask keys carry, the converted recipe validates and trains that loss; with CPS the mode is refused by name."""
    from verl_digen.config import ConfigError

    loss = {"loss_mode": mode, "kl_mask_threshold": 2e-5, "add_kl_coefficient": False}
    raw = _runnable(tmp_path)
    arr = raw["actor_rollout_ref"]
    raw["actor_rollout_ref"] = {**arr, "actor": {**arr["actor"], "diffusion_loss": {
        **arr["actor"]["diffusion_loss"], **loss}},
        "rollout": {**arr["rollout"], "algo": {**arr["rollout"]["algo"], "sde_type": "sde"}}}
    out = vo.from_verl_omni_config(raw)
    assert out["algorithm.name"] == mode
    assert (out.get("actor.kl_mask_threshold"), out.get("actor.add_kl_coefficient")) == (
        (2e-5, False) if mode == "flow_dppo" else (None, None))
    loss_cfg = vo.to_run_config(raw, log=lambda _: None).worker_config().loss
    assert loss_cfg.mode == mode and loss_cfg.kl_mask_threshold == (2e-5 if mode == "flow_dppo" else 1e-5)
    raw["actor_rollout_ref"]["rollout"]["algo"]["sde_type"] = "cps"
    with pytest.raises(ConfigError, match=re.escape("'actor_rollout_ref.rollout.algo.sde_type' = 'cps'")):
        vo.from_verl_omni_config(raw)


@pytest.mark.parametrize("strategy", ["random", "progressive"])
def test_mix_grpo_carries_its_sliding_window(strategy, tmp_path):
    """verl-omni's examples/mixgrpo_trainer keys: model.algorithm=mix_grpo (loss pinned to flow_grpo) becomes
    algorithm.name=mix_grpo with the window's size, range and schedule; the converted recipe validates and
    slides the window as verl-omni's adapter does; another loss, or no window (FlowGRPO), is said by name."""
    from verl_digen.algo.mix_grpo import MixWindow
    from verl_digen.config import ConfigError

    raw = _runnable(tmp_path)
    arr = raw["actor_rollout_ref"]
    algo = {"noise_level": 1.2, "sde_type": "sde", "sde_window_size": 2, "sde_window_range": [0, 5],
            "sample_strategy": strategy, "sde_window_seed": 42, "iters_per_group": 2}
    raw["actor_rollout_ref"] = {**arr, "model": {**arr["model"], "algorithm": "mix_grpo"},
                                "rollout": {**arr["rollout"], "algo": {**arr["rollout"]["algo"], **algo}}}
    out = vo.from_verl_omni_config(raw)
    assert out["algorithm.name"] == "mix_grpo"
    assert (out["rollout.selection"], out["rollout.train_steps"], out["rollout.window_range"]) == ("window", 2, [0, 5])
    assert "rollout.window_start" not in out
    assert (out["rollout.sample_strategy"], out["rollout.iters_per_group"], out["rollout.sde_window_seed"]) == (
        strategy, 2, 42)
    cfg = vo.to_run_config(raw, log=lambda _: None)
    sel = cfg.sampler().selection
    assert sel.mix == MixWindow(strategy, 2, 42) and cfg.worker_config().loss.mode == "flow_grpo"
    assert [sel.window(10, 0, s)[0] for s in range(4)] == [MixWindow(strategy, 2, 42).start(2, 0, 5, s)
                                                           for s in range(4)]
    raw["actor_rollout_ref"]["actor"]["diffusion_loss"]["loss_mode"] = "grpo_guard"
    with pytest.raises(ConfigError, match=re.escape("'actor_rollout_ref.actor.diffusion_loss.loss_mode' = "
                                                    "'grpo_guard'")):
        vo.from_verl_omni_config(raw)
    raw["actor_rollout_ref"]["actor"]["diffusion_loss"]["loss_mode"] = "flow_grpo"
    del raw["actor_rollout_ref"]["rollout"]["algo"]["sde_window_size"]
    notes: list[str] = []
    out = vo.from_verl_omni_config(raw, notes=notes)
    assert "algorithm.name" not in out and "rollout.sample_strategy" not in out
    assert any("mix_grpo without rollout.algo.sde_window_size" in n for n in notes)


def test_diffusion_nft_carries_its_loss_and_old_policy_options(tmp_path):
    """verl-omni's examples/diffusionnft_trainer keys: loss_mode=diffusion_nft with the direct_preference trainer
    becomes algorithm.name=diffusion_nft with its options (ref_kl_coef as actor.kl_coef, K = int(T x
    timestep_fraction) random steps); SDE keys and clip_ratio are logged; the converted recipe validates; a pair
    trainer, or an old adapter missing, is refused by name."""
    from verl_digen.config import ConfigError

    raw = _runnable(tmp_path)
    arr = raw["actor_rollout_ref"]
    loss = {**arr["actor"].get("diffusion_loss", {}), "loss_mode": "diffusion_nft", "mix_beta": 0.1,
            "ref_kl_coef": 1e-4, "adv_clip_max": 4.0, "clip_ratio": 1e-5}
    raw["actor_rollout_ref"] = {
        **arr, "model": {**arr["model"], "algorithm": "diffusion_nft", "policy_state_adapters": ["default", "old"]},
        "actor": {**arr["actor"], "diffusion_loss": loss},
        "rollout": {**arr["rollout"], "calculate_log_probs": False, "rollout_adapter": "old"}}
    raw["algorithm"] = {**raw["algorithm"], "trainer_type": "direct_preference", "timestep_fraction": 0.5,
                        "old_policy_decay_schedule": "delayed_linear_to_0_999", "old_policy_update_interval": 2,
                        "adv_mode": "continuous"}
    notes: list[str] = []
    out = vo.from_verl_omni_config(raw, notes=notes)
    steps = out["rollout.num_steps"]
    assert out["algorithm.name"] == "diffusion_nft" and out["algorithm.adv_clip"] is None
    assert (out["actor.mix_beta"], out["actor.kl_coef"], out["actor.adv_clip_max"]) == (0.1, 1e-4, 4.0)
    assert (out["algorithm.old_policy_decay_schedule"], out["algorithm.old_policy_update_interval"]) == (
        "delayed_linear_to_0_999", 2)
    assert (out["rollout.selection"], out["rollout.train_steps"]) == ("random_k", max(1, int(steps * 0.5)))
    assert "actor.clip_ratio" not in out and "rollout.sde_type" not in out and "rollout.noise_level" not in out
    assert any("clip_ratio=1e-05: not used" in n for n in notes)
    cfg = vo.to_run_config(raw, log=lambda _: None)
    assert cfg.worker_config().loss.nft.mix_beta == 0.1 and cfg.sampler().clean_only
    raw["actor_rollout_ref"]["model"]["policy_state_adapters"] = ["default"]
    with pytest.raises(ConfigError, match=re.escape("'actor_rollout_ref.model.policy_state_adapters'")):
        vo.from_verl_omni_config(raw)
    raw["actor_rollout_ref"]["model"]["policy_state_adapters"] = ["default", "old"]
    raw["actor_rollout_ref"]["rollout"]["rollout_adapter"] = "default"
    with pytest.raises(ConfigError, match=re.escape("'actor_rollout_ref.rollout.rollout_adapter' = 'default'")):
        vo.from_verl_omni_config(raw)
    raw["actor_rollout_ref"]["rollout"]["rollout_adapter"] = "old"
    raw["algorithm"]["paired_preference"] = True
    with pytest.raises(ConfigError, match=re.escape("'algorithm.paired_preference' = True")):
        vo.from_verl_omni_config(raw)


@pytest.mark.parametrize("key,value", [
    ("actor_rollout_ref.actor.diffusion_loss.loss_mode", "dpo"),
    ("actor_rollout_ref.model.algorithm", "awm"),
    ("algorithm.trainer_type", "direct_preference"),
    ("actor_rollout_ref.actor.fsdp_config.model_dtype", "fp8"),
    ("trainer.device", "npu"),
    ("actor_rollout_ref.actor.ppo_epochs", 2),
    ("actor_rollout_ref.teacher.enabled", True),  # verl-omni 0.3's online policy distillation
])
def test_unsupported_settings_are_refused_naming_the_key(key, value):
    from verl_digen.config import ConfigError

    cfg = vo._nested({key: value})
    with pytest.raises(ConfigError, match=re.escape(f"'{key}' = {value!r}")):
        vo.from_verl_omni_config(cfg)


def test_every_unconverted_key_is_named():
    defaults = {"actor_rollout_ref": {"rollout": {"temperature": 1.0, "top_k": 0, "mirror": "${data.seed}"},
                                      "actor": {"optim": {"lr": 1e-6}}},
                "data": {"seed": None}, "trainer": {"test_freq": -1}}
    raw = {"actor_rollout_ref": {"rollout": {"temperature": 0.5, "top_k": 0, "mirror": 7},
                                 "actor": {"optim": {"lr": 1e-4}}},
           "data": {"seed": 7}, "trainer": {"test_freq": -1, "brand_new": 1, "dry_run": True},
           "digen": {"tag": {"policy": "bts"}}, "transfer_queue": {"enable": True}}
    used: set[str] = set()
    vo.from_verl_omni_config(raw, used=used)
    changed, at_default = vo.unmapped_keys(raw, used, defaults)
    # set by the recipe and not converted: named with their values; at defaults: named too
    assert changed == {"actor_rollout_ref.rollout.temperature": 0.5, "data.seed": 7, "trainer.brand_new": 1}
    assert sorted(at_default) == ["actor_rollout_ref.rollout.top_k"]  # test_freq is read: validation carries


def test_keys_at_verl_omnis_defaults_are_counted_in_one_short_line_and_named_at_debug(tmp_path, monkeypatch, caplog):
    """verl-omni's few hundred keys at their defaults: one short line counts them (one 8,000-character line
    listing them buried the notes that change results); the list goes to DEBUG."""
    import logging

    from verl_digen.integrations.verl_omni import convert

    good = _runnable(tmp_path)
    good["trainer"]["brand_new_a"] = good["trainer"]["brand_new_b"] = 3  # keys verl-digen does not read
    monkeypatch.setattr(convert, "verl_omni_defaults", lambda: {"trainer": {"brand_new_a": 3, "brand_new_b": 3}})
    logged: list[str] = []
    with caplog.at_level(logging.DEBUG, logger=convert.__name__):
        vo.to_run_config(OmegaConf.create(good), log=logged.append)
    (line,) = [line for line in logged if "at their defaults" in line]
    assert line.startswith("verl-omni -> verl-digen: 2 verl-omni keys at their defaults") and len(line) < 200
    assert "brand_new_a" not in line and "hydra.verbose=" in line
    assert "trainer.brand_new_a, trainer.brand_new_b" in caplog.text


def test_converted_recipe_validates_and_logs_every_note(tmp_path):
    from verl_digen.config import ConfigError

    good = _runnable(tmp_path)
    logged: list[str] = []
    cfg = vo.to_run_config(OmegaConf.create(good), log=logged.append)
    assert (cfg.trainer.mode, cfg.model.arch, cfg.rollout.micro_batch_size, cfg.algorithm.adv_std) == (
        "digen", "sd3", 16, "group")
    assert cfg.step_selection().kind == "window" and cfg.trained_steps() == 3
    assert cfg.rollout.window_range == [0, 5]
    joined = "\n".join(logged)
    assert "actor_rollout_ref.actor.strategy='fsdp2' is not converted" in joined  # no verl-omni defaults here
    assert "reward.reward_model.model_path='Qwen/Qwen2.5-VL-3B-Instruct' is not converted" in joined

    # verl-digen keys written into the verl-omni config (`+reward.name=...`, `+trainer=digen`'s digen.*);
    # in verl-digen-only sections they win over the conversion (+rollout.shift replaces the model's shift)
    extra = _runnable(tmp_path, rollout={"guidance_scale": 4.5, "shift": 3.0},
                      digen={"tsp": {"degree": 3}, "tag": {"policy": "never"}},
                      reward={**VERL_OMNI_SD35["reward"], "name": "jpeg_compressibility"})
    extra["trainer"] = {**extra["trainer"], "mode": "separate", "logger": ["console", "mlflow"], "device": "gpu"}
    cfg = vo.to_run_config(extra, log=lambda _: None)
    assert (cfg.rollout.guidance_scale, cfg.rollout.shift, cfg.digen.tsp.degree) == (4.5, 3.0, 3)
    assert (cfg.reward.name, cfg.trainer.mode, cfg.trainer.logger) == ("jpeg_compressibility", "separate", ["console"])
    assert cfg.trainer.device == "cuda"  # verl-omni's `gpu`, converted; the same-named key does not override it
    # validation and resume carry over: val_files every test_freq steps, resume_mode=auto (verl-omni's default)
    val = _runnable(tmp_path)
    val_file = val["data"]["train_files"]
    val["data"] = {**val["data"], "val_files": [val_file]}
    val["trainer"] = {**val["trainer"], "test_freq": 5, "log_val_generations": 4, "val_before_train": True,
                      "resume_mode": "auto"}
    notes: list[str] = []
    cfg = vo.to_run_config(val, log=notes.append)
    assert (cfg.data.val_files, cfg.trainer.test_freq, cfg.trainer.log_val_generations) == (val_file, 5, 4)
    assert cfg.trainer.resume_from == "auto"
    assert any("trainer.val_before_train=True: verl-digen validates after every" in n for n in notes)
    own = {**val, "trainer": {**val["trainer"], "resume_from": str(tmp_path / "nowhere")}}  # +trainer.resume_from wins
    with pytest.raises(ConfigError, match=r"config key 'trainer.resume_from' = '.*nowhere'"):
        vo.to_run_config(own, log=lambda _: None)
    off = {**val, "trainer": {**val["trainer"], "test_freq": -1, "resume_mode": "disable"}}
    cfg = vo.to_run_config(off, log=lambda _: None)  # verl-omni's placeholder val_files stay unused
    assert (cfg.data.val_files, cfg.trainer.test_freq, cfg.trainer.resume_from) == (None, -1, None)
    for trainer, data, key in (({"resume_mode": "resume_path"}, {}, "trainer.resume_from_path"),
                               ({"resume_mode": "latest"}, {}, "trainer.resume_mode"),
                               ({}, {"val_files": [val_file, val_file]}, "data.val_files"),
                               ({}, {"val_files": "/nonexistent/test.parquet"}, "data.val_files")):
        bad = {**val, "trainer": {**val["trainer"], **trainer}, "data": {**val["data"], **data}}
        with pytest.raises(ConfigError, match=f"config key '{re.escape(key)}'"):
            vo.to_run_config(bad, log=lambda _: None)
    ckpt = tmp_path / "ckpt" / "global_step_3"
    path = {**val, "trainer": {**val["trainer"], "resume_mode": "resume_path", "resume_from_path": str(ckpt)}}
    with pytest.raises(ConfigError, match="config key 'trainer.resume_from_path'"):  # no such checkpoint yet
        vo.to_run_config(path, log=lambda _: None)

    with pytest.raises(ConfigError, match="resources"):  # the pool split has no verl-omni counterpart
        vo.to_run_config({k: v for k, v in good.items() if k != "resources"}, log=lambda _: None)
    # a converted value that validate refuses is named by the verl-omni key the user set, with its value
    with pytest.raises(ConfigError, match=r"config key 'algorithm.global_std' = True .*'group' with trainer=digen.*"
                                          r"verl-digen's algorithm.adv_std = 'batch' is converted from it"):
        vo.to_run_config({**good, "algorithm": VERL_OMNI_SD35["algorithm"]}, log=lambda _: None)
    arr = {**good["actor_rollout_ref"], "actor": {**good["actor_rollout_ref"]["actor"], "optim": {"lr": -1.0}}}
    with pytest.raises(ConfigError, match=r"config key 'actor_rollout_ref.actor.optim.lr' = -1.0 .*actor.lr"):
        vo.to_run_config({**good, "actor_rollout_ref": arr}, log=lambda _: None)
    with pytest.raises(ConfigError, match=r"config key 'actor.lr' = -1.0"):  # set in verl-digen's own section
        vo.to_run_config({**good, "actor": {"lr": -1.0}}, log=lambda _: None)
    for path in ("ByteDance-Seed/BAGEL-7B-MoT", "Qwen/Qwen-Image-Edit-2509"):  # no adapter: refused, not run as FLUX
        arr = {**good["actor_rollout_ref"], "model": {**good["actor_rollout_ref"]["model"], "path": path}}
        with pytest.raises(ConfigError, match="actor_rollout_ref.model.path"):
            vo.to_run_config({**good, "actor_rollout_ref": arr}, log=lambda _: None)
    listed = {**good, "data": {**good["data"], "train_files": ["a.parquet", "b.parquet"]}}
    with pytest.raises(ConfigError, match="one .txt, .jsonl or .parquet prompt file"):
        vo.to_run_config(listed, log=lambda _: None)


def test_wandb_is_left_out_with_a_line_where_it_cannot_start(tmp_path, monkeypatch):
    from verl_digen.integrations import verl_omni as vo

    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    logged: list[str] = []
    cfg = vo.to_run_config(_runnable(tmp_path), log=logged.append)  # the script logs to console and wandb
    assert cfg.trainer.logger == ["console"]
    assert any("trainer.logger: wandb left out: it has no credentials" in x for x in logged), logged
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert vo.to_run_config(_runnable(tmp_path), log=lambda _: None).trainer.logger == ["console", "wandb"]


def test_separate_asyncs_standalone_rollout_pool_becomes_the_generator_pool(tmp_path):
    """verl-omni's separate_async script gives the rollout GPUs of its own (rollout.nnodes x
    rollout.n_gpus_per_node); without +resources they become the generator pool and the actor's GPUs the
    trainer pool, in one log line; with +resources the line says what replaced them."""
    from verl_digen.integrations import verl_omni as vo

    good = _runnable(tmp_path)
    arr = {**good["actor_rollout_ref"], "rollout": {**good["actor_rollout_ref"]["rollout"], "nnodes": 1,
                                                     "n_gpus_per_node": 3}}
    trainer = {**good["trainer"], "v1": {"trainer_mode": "separate_async"}, "n_gpus_per_node": 2, "nnodes": 1}
    recipe = {k: v for k, v in good.items() if k != "resources"} | {"actor_rollout_ref": arr, "trainer": trainer}
    logged: list[str] = []
    cfg = vo.to_run_config(recipe, log=logged.append)
    assert (cfg.resources.generator.workers, cfg.resources.trainer.workers) == (3, 2)
    line = next(x for x in logged if "standalone rollout pool" in x)
    assert "rollout.nnodes x actor_rollout_ref.rollout.n_gpus_per_node=3" in line
    assert "resources.trainer.workers=2" in line
    assert not any("rollout.n_gpus_per_node" in x and "not converted" in x for x in logged)
    logged.clear()
    cfg = vo.to_run_config({**recipe, "resources": good["resources"]}, log=logged.append)
    assert cfg.resources.generator.workers == 2
    assert any("standalone rollout pool is replaced by resources.generator.workers=2" in x for x in logged), logged


def test_verl_omni_parquet_memory_and_precision_keys_carry_over(tmp_path):
    """A verl-omni script's own data (a parquet of chat messages, as its data_process scripts write) is
    read; its offload flags, gradient checkpointing and mixed precision reach verl-digen's keys."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl_digen.config import ConfigError
    from verl_digen.data import load_prompts

    path = tmp_path / "train.parquet"
    chats = [[{"role": "user", "content": f"a sign that says {w}"}] for w in ("hello", "world")]
    pq.write_table(pa.table({"prompt": chats, "data_source": ["ocr", "ocr"]}), path)
    raw = copy.deepcopy(_runnable(tmp_path))  # its sections are shared with the module's recipes
    raw["data"] = {**raw["data"], "train_files": str(path), "prompt_key": "prompt"}
    arr = raw["actor_rollout_ref"]
    arr["model"] = {**arr["model"], "enable_gradient_checkpointing": True}
    arr["actor"] = {**arr["actor"], "fsdp_config": {
        "model_dtype": "fp32", "param_offload": True, "optimizer_offload": True,
        "mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}}}
    cfg = vo.to_run_config(raw, log=lambda _: None)
    assert (cfg.data.train_files, load_prompts(cfg.data.train_files, cfg.data.prompt_key)) == (
        str(path), ["a sign that says hello", "a sign that says world"])
    a = cfg.actor
    assert (a.activation_checkpointing, a.param_offload, a.optimizer_offload) == (True, True, True)
    assert (cfg.model.dtype, a.reduce_dtype, a.master_dtype) == ("bfloat16", "float32", None)  # fp32 masters
    with pytest.raises(ConfigError, match="mixed_precision.param_dtype"):
        arr["actor"]["fsdp_config"]["mixed_precision"]["param_dtype"] = "fp8"
        vo.to_run_config(raw, log=lambda _: None)


def test_task_runner_protocol_and_dry_run(tmp_path, capsys):
    """The calls verl-omni's DiffusionTaskRunnerV1.run makes, on a fake runtime; a dry run builds nothing."""
    from verl.utils.import_utils import load_class_from_fqn

    calls = []

    class FakeRuntime:
        def __init__(self, cfg):
            calls.append(("init", cfg.trainer.mode, cfg.rollout.micro_batch_size))

        def fit(self):
            calls.append(("fit",))
            return "result"

        def shutdown(self):
            calls.append(("shutdown",))

    class Trainer(vo.DigenVerlOmniTrainer):
        runtime_cls = FakeRuntime

    config = OmegaConf.create(_runnable(tmp_path))
    OmegaConf.set_struct(config, True)  # Hydra hands the TaskRunner a struct config
    trainer = Trainer(config=config)
    trainer.init()
    fqn = config.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    manager = load_class_from_fqn(fqn, "AgentLoopManager").create(
        config=config, llm_client=trainer.get_llm_client(), reward_loop_worker_handles=trainer.get_reward_handles())
    assert trainer.fit(manager) == "result"
    assert fqn == "verl_digen.integrations.verl_omni.NullAgentLoopManager"
    assert calls == [("init", "digen", 16), ("fit",), ("shutdown",)]  # 8 per GPU x 2 trainer workers

    calls.clear()
    dry = OmegaConf.create(_runnable(tmp_path, trainer={**VERL_OMNI_SD35["trainer"], "dry_run": True}))
    trainer = Trainer(config=dry)
    trainer.init()
    assert trainer.fit(None) is None and calls == []
    assert "resource plan:" in capsys.readouterr().out


def test_entry_check_refuses_the_v0_paths():
    v1 = {"trainer": {"use_v1": True, "v1": {"trainer_mode": "digen"}}, "digen": {}}
    assert vo.check_entry(OmegaConf.create(v1), main_module=vo.V1_ENTRY) is None
    assert vo.check_entry(OmegaConf.create({"trainer": {"use_v1": False, "v1": {"trainer_mode": "sync"}}}),
                          main_module=vo.V0_ENTRY) is None  # not a digen run: none of our business
    off = {"trainer": {"use_v1": False, "v1": {"trainer_mode": "digen"}}, "digen": {}}
    assert "trainer.use_v1=False" in vo.check_entry(OmegaConf.create(off), main_module=vo.V1_ENTRY)
    sync = {"trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}}, "digen": {}}  # +trainer=digen alone
    assert "trainer.v1.trainer_mode=sync runs verl-omni's own trainer" in vo.check_entry(
        OmegaConf.create(sync), main_module=vo.V1_ENTRY)
    message = vo.check_entry(OmegaConf.create(v1), main_module=vo.V0_ENTRY)
    assert f"python -m {vo.V0_ENTRY}" in message and f"python -m {vo.V1_ENTRY} trainer.use_v1=true" in message


def test_a_local_cpu_run_that_would_wait_forever_for_ray_cpus_is_named(tmp_path, monkeypatch):
    """verl-omni's TaskRunner, TransferQueue's controller and storage units, and verl-digen's workers each hold
    a Ray CPU: on a 2-core machine with verl-omni's 8 storage units Ray waits forever."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(checks, "hub_cached", lambda _: True)  # the SD3.5 pipeline is not what is counted here
    good = _runnable(tmp_path, trainer={**VERL_OMNI_SD35["trainer"], "device": "cpu"})
    tq = {"backend": {"SimpleStorage": {"num_data_storage_units": 8}}}
    run = vo.to_run_config(good, log=lambda _: None)  # 2 + 2 workers
    message = vo.ray_cpu_shortfall({**good, "transfer_queue": tq, "ray_kwargs": {"ray_init": {"num_cpus": None}}}, run)
    assert "Ray will have 2 CPUs" in message and "hold 14" in message and "+verl_omni=small" in message
    small = {"transfer_queue": {"backend": {"SimpleStorage": {"num_data_storage_units": 1}}},
             "ray_kwargs": {"ray_init": {"num_cpus": 8}}}  # what +verl_omni=small sets
    assert vo.ray_cpu_shortfall({**good, **small}, run) is None
    gpu = vo.to_run_config(_runnable(tmp_path), log=lambda _: None)
    assert vo.ray_cpu_shortfall({**good, "transfer_queue": tq}, gpu) is None  # only CPU runs are counted


def test_latent_size_uses_the_architectures_vae_compression():
    """verl-omni's 8 px per latent cell is its default; Wan2.2's VAE compresses 16x, so an unset
    vae_scale_factor must not double the latent side (704 px -> 44, not 88). An explicit value wins."""
    def latent(path: str, **model) -> tuple[int, str]:
        out = vo.from_verl_omni_config({"actor_rollout_ref": {
            "model": {"path": path, **model}, "rollout": {"pipeline": {"height": 704, "width": 704}}}}, notes=[])
        return out["model.latent_size"], out["model.arch"]

    assert latent("Wan-AI/Wan2.2-TI2V-5B-Diffusers") == (44, "wan2_2")
    assert latent("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") == (88, "wan")
    assert latent("/ckpt/wan2_2_ti2v") == (44, "wan2_2")
    assert latent("Wan-AI/Wan2.2-TI2V-5B-Diffusers", vae_scale_factor=8) == (88, "wan2_2")
    assert latent("stabilityai/stable-diffusion-3.5-medium") == (88, "sd3")


def test_video_sizes_and_frames_carry_over_as_diffusers_generates_them(tmp_path):
    """Wan2.2 DanceGRPO's 704x1280, 8 frames: a non-square latent (44 x 80 with the 16x VAE) and the 9 frames
    diffusers' pipeline really generates (it rounds 8 to 4k + 1); a side off the packing grid is rounded
    down as the pipeline does; frames on an image model are noted, not carried."""
    from verl_digen.config import ConfigError

    def convert(path: str, **pipeline) -> tuple[dict, list[str]]:
        notes: list[str] = []
        out = vo.from_verl_omni_config({"actor_rollout_ref": {"model": {"path": path},
                                                              "rollout": {"pipeline": pipeline}}}, notes=notes)
        return out, notes

    out, notes = convert("Wan-AI/Wan2.2-TI2V-5B-Diffusers", height=704, width=1280, num_frames=8)
    assert (out["model.latent_size"], out["model.latent_width"], out["model.num_frames"]) == (44, 80, 9)
    assert any("num_frames=8: diffusers' wan2_2 pipeline generates 9 frames" in n for n in notes)
    out, notes = convert("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", height=480, width=480, num_frames=33)
    assert (out["model.latent_size"], out["model.num_frames"]) == (60, 33) and "model.latent_width" not in out
    assert not any("num_frames" in n or "rounded" in n for n in notes)
    out, notes = convert("black-forest-labs/FLUX.1-dev", height=520, width=1024, num_frames=4)
    assert (out["model.latent_size"], out["model.latent_width"]) == (64, 128) and "model.num_frames" not in out
    assert any("height=520: rounded down to 512 px" in n for n in notes)
    assert any("num_frames=4: not used by the image model flux" in n for n in notes)
    with pytest.raises(ConfigError, match=r"config key 'actor_rollout_ref.rollout.pipeline.width' = 8 .*at least 16"):
        convert("black-forest-labs/FLUX.1-dev", height=512, width=8)
    # the converted Wan2.2 recipe validates (it used to fail on model.num_frames, a key the user never set)
    wan = _runnable(tmp_path)
    wan["actor_rollout_ref"] = copy.deepcopy(wan["actor_rollout_ref"])
    wan["actor_rollout_ref"]["model"]["path"] = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
    wan["actor_rollout_ref"]["rollout"]["pipeline"].update(height=704, width=1280, num_frames=8)
    wan["actor_rollout_ref"]["rollout"]["algo"]["sde_type"] = "dance_sde"
    cfg = vo.to_run_config(wan, log=lambda _: None)
    assert (cfg.model.arch, cfg.model.latent_size, cfg.model.latent_width, cfg.model.num_frames) == (
        "wan2_2", 44, 80, 9)


def test_verl_omnis_custom_reward_function_carries_and_hpsv3_without_its_package_is_refused(tmp_path):
    """reward.custom_reward_function.{path,name,reward_kwargs} become verl-digen's custom_reward_function (its
    per-sample signature is taken as it is); HPSv3's file imports the hpsv3 package: without it, a refusal
    before Ray naming verl-omni's key and the missing module."""
    from verl_digen.config import ConfigError

    scorer = tmp_path / "my_scorer.py"
    scorer.write_text("def compute_score_ocr(data_source, solution_image, ground_truth, extra_info, scale=1.0):\n"
                      "    return scale\n")
    good = _runnable(tmp_path, reward={"custom_reward_function": {
        "path": str(scorer), "name": "compute_score_ocr", "reward_kwargs": {"scale": 2.0}}})
    cfg = vo.to_run_config(good, log=lambda _: None)
    crf = cfg.custom_reward_function
    assert (crf.path, crf.name, dict(crf.reward_kwargs)) == (str(scorer), "compute_score_ocr", {"scale": 2.0})
    # verl-digen's own reward written into the config (the guide's +reward.name=ocr) replaces the function
    notes: list[str] = []
    own = _runnable(tmp_path, reward={**good["reward"], "name": "brightness"})
    cfg = vo.to_run_config(own, log=notes.append)
    assert cfg.custom_reward_function.path is None and cfg.reward.name == "brightness"
    assert any("not used; reward.name (verl-digen's reward) replaces it" in n for n in notes)
    hps = tmp_path / "hpsv3_reward.py"
    hps.write_text("import hpsv3\ndef compute_score_hpsv3(data_source, solution_image, ground_truth, extra_info):\n"
                   "    return 0.0\n")
    bad = _runnable(tmp_path, reward={"custom_reward_function": {"path": str(hps), "name": "compute_score_hpsv3"}})
    with pytest.raises(ConfigError, match=r"config key 'reward.custom_reward_function.path' .*No module named "
                                          r"'hpsv3'"):
        vo.to_run_config(bad, log=lambda _: None)


def test_a_cpu_run_through_verl_omnis_entry_sets_the_cpu_platform_before_verl_detects_one():
    """verl's auto_set_device turns trainer.device=cpu into cuda unless VERL_PLATFORM=cpu; the plugin sets
    it at ``import verl`` for a digen run through the v1 entry that asked for the CPU, and only then."""
    flags = ["trainer.use_v1=true", "trainer.v1.trainer_mode=digen", "+trainer=digen", "trainer.device=cpu"]
    digen = ["python", "-m", "verl_omni.trainer.main_diffusion_v1", *flags]
    for argv in (digen, ["python", "/x/site-packages/verl_omni/trainer/main_diffusion_v1.py", *flags]):
        env: dict[str, str] = {}
        assert vo.keep_cpu_on_cpu(argv, env) and env == {"VERL_PLATFORM": "cpu"}
    for argv, environ in [
        (digen, {"VERL_PLATFORM": "nvidia"}),  # the user's own choice stays
        ([*digen[:-1], "trainer.device=cuda"], {}),  # a GPU run
        ([*digen[:3], "trainer.use_v1=true", "trainer.device=cpu"], {}),  # verl-omni's own trainer: not ours
        (["python", "-m", "verl_digen.main", *flags], {}),  # another entry point
    ]:
        before = dict(environ)
        assert not vo.keep_cpu_on_cpu(argv, environ) and environ == before


# what verl-omni's multi-reward manager sums: functions that each declare only some keywords
MULTI_FILE = '''
def from_row(ground_truth, extra_info, scale=1.0):
    return {"score": float(ground_truth) * scale + extra_info["index"], "detail": "kept out of the sum"}

def flaky(solution_image):
    raise ValueError("down")

async def needs_data_source(data_source, **kwargs):
    assert set(kwargs) == {"solution_image", "ground_truth", "extra_info", "tag"}, kwargs
    return 100.0 if data_source == "ocr" else -1.0
'''


def _multi(tmp_path: Path, functions: dict) -> dict:
    """The Qwen-Image multi-reward script's reward keys (its placeholder, its manager) on the runnable recipe,
    with a prompt file that repeats a prompt in two rows."""
    rows = tmp_path / "ocr.jsonl"
    rows.write_text("".join(json.dumps({"prompt": p, "data_source": "ocr", "reward_model": {"ground_truth": g},
                                        "extra_info": {"index": i}}) + "\n"
                            for i, (p, g) in enumerate([("a sign", "2"), ("a cat", "3"), ("a sign", "5")])))
    raw = _runnable(tmp_path)
    raw["data"] = {**raw["data"], "train_files": str(rows)}
    raw["reward"] = {"reward_model": {"enable": False}, "reward_manager": {"name": "MultiVisualRewardManager",
                                                         "module": {"path": "pkg://verl_omni.reward_loop.reward_manager"}},
                     "custom_reward_function": {"path": "pkg://verl_omni.reward_loop.reward_manager.multi",
                                                "name": "_multi_reward_placeholder"},
                     "reward_functions": functions, "aggregation": "weighted_sum"}
    return raw


def test_multi_reward_manager_converts_to_weighted_functions_with_keyword_filtering(tmp_path):
    """reward.reward_manager.name=MultiVisualRewardManager: each reward.reward_functions entry is called per
    sample with the keywords its signature declares (verl-omni's jpeg_compressibility.compute_score takes only
    solution_image), its extra keys as keywords, weighted; one that is not required scores 0 where it raises."""
    import torch
    from verl_omni_helpers import snapshot_file, tarballs_present

    from verl_digen.rewards import MultiReward, Rows, build_reward

    f = tmp_path / "multi_fns.py"
    f.write_text(MULTI_FILE)
    jpeg = (snapshot_file("verl_omni/utils/reward_score/jpeg_compressibility.py", tmp_path / "omni")
            if tarballs_present() else None)
    functions = {"row": {"path": str(f), "name": "from_row", "weight": 0.5, "required": "True", "scale": 2.0},
                 "flaky": {"path": str(f), "name": "flaky", "weight": 3.0},
                 "source": {"path": str(f), "name": "needs_data_source", "weight": 0.25, "tag": "x"}}
    if jpeg is not None:  # verl-omni's own function, which refuses any keyword but solution_image
        functions["jpeg"] = {"path": str(jpeg), "name": "compute_score", "weight": 0.5}
    logged: list[str] = []
    cfg = vo.to_run_config(_multi(tmp_path, functions), log=logged.append)
    assert not [line for line in logged if "reward_functions" in line or "reward_manager" in line], logged
    reward = build_reward(cfg.worker_config().reward)
    assert isinstance(reward, MultiReward) and set(reward.rewards) == set(functions)
    images = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    parts = reward.components(images, ["a sign", "a cat", "a sign"], rows=Rows("train", (2, 1, 0)))
    assert parts["row"].tolist() == [12.0, 7.0, 4.0]  # ground truth x 2 + extra_info.index, from each own row
    assert parts["flaky"].tolist() == [0.0, 0.0, 0.0] and parts["source"].tolist() == [100.0] * 3
    want = 0.5 * parts["row"] + 25.0
    if jpeg is not None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("jpeg_ref", jpeg)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8)
        assert parts["jpeg"].tolist() == [mod.compute_score(p) for p in pixels]
        want = want + 0.5 * parts["jpeg"]
    assert torch.allclose(reward.weighted_sum(parts), want, rtol=0, atol=1e-12)
    # required: its failure stops the run, named
    required = {**functions, "flaky": {**functions["flaky"], "required": True}}
    strict = build_reward(vo.to_run_config(_multi(tmp_path, required), log=lambda _: None).worker_config().reward)
    with pytest.raises(RuntimeError, match="custom reward flaky in .*multi_fns.py raised ValueError: down"):
        strict(images, ["a sign"] * 3, rows=Rows("train", (0, 0, 0)))


@pytest.mark.parametrize("case", ["undeclared-required-keyword", "weights-sum-zero", "required-not-bool",
                                  "no-functions", "other-aggregation"])
def test_multi_reward_manager_refusals_before_ray(case, tmp_path):
    from verl_digen.config import ConfigError

    f = tmp_path / "fns.py"
    f.write_text("def judge(solution_image, reward_router_address):\n    return 1.0\n"
                 "def ok(solution_image):\n    return 1.0\n")
    functions = {"a": {"path": str(f), "name": "ok", "weight": 1.0}}
    key, part = {
        "undeclared-required-keyword": ("reward.reward_functions.j.path", "missing a required argument: "
                                        "'reward_router_address'"),
        "weights-sum-zero": ("reward.reward_functions", "weights that sum to more than 0 (they sum to 0.0)"),
        "required-not-bool": ("reward.reward_functions.a.required", "true or false (got 'maybe')"),
        "no-functions": ("reward.reward_functions", "one entry or more"),
        "other-aggregation": ("reward.aggregation", "weighted_sum"),
    }[case]
    if case == "undeclared-required-keyword":
        functions["j"] = {"path": str(f), "name": "judge", "weight": 1.0}
    elif case == "weights-sum-zero":
        functions["b"] = {"path": str(f), "name": "ok", "weight": -1.0}
    elif case == "required-not-bool":
        functions["a"]["required"] = "maybe"
    elif case == "no-functions":
        functions = {}
    raw = _multi(tmp_path, functions)
    if case == "other-aggregation":
        raw["reward"]["aggregation"] = "max"
    with pytest.raises(ConfigError) as err:
        vo.to_run_config(raw, log=lambda _: None)
    assert err.value.key == key and part in str(err.value), str(err.value)


def test_a_finished_run_says_nothing_to_do_before_ray_through_verl_omnis_entry(tmp_path, capsys):
    """verl-omni's driver calls the entry guard before ray.init: a run resuming a checkpoint already at
    trainer.total_training_steps stops there, as verl-digen's own entry does (it used to start Ray and both
    pools first)."""
    import torch

    from verl_digen.config import checks
    from verl_digen.workers import checkpoint as ckpt

    raw = _runnable(tmp_path)
    ck = ckpt.step_dir(tmp_path / "ckpt", 2)  # written by this recipe's own run
    mine = checks.fingerprint(vo.to_run_config(raw, log=lambda _: None))
    ckpt.save(ck, 0, {"params": {"w": torch.arange(2.0)}, "optim": {}, "param_groups": [], "version": 2,
                      "lora": False}, {"step": 2, "run_id": "old", "config": mine}, barrier=lambda: None)
    raw["trainer"] = {**raw["trainer"], "resume_mode": "resume_path", "resume_from_path": str(ck),
                      "total_training_steps": 2}
    with pytest.raises(SystemExit) as stop:
        vo.entry_guard(OmegaConf.create(raw))
    out, err = capsys.readouterr()
    assert stop.value.code == 0 and f"nothing to do: the checkpoint resumed ({ck}) is at step 2" in out, err
    raw["trainer"]["total_training_steps"] = 3
    vo.entry_guard(OmegaConf.create(raw))  # steps left: the guard lets verl-omni go on


# -- verl-omni 0.3 (v1 trainer by default, verl pinned at c4b389a): its new keys convert, are refused or named ----

def _separate_async(tmp_path: Path, **separate) -> dict:
    """The runnable recipe as a separate_async script: a standalone rollout pool and trainer.v1.separate_async.*"""
    raw = _runnable(tmp_path)
    raw["actor_rollout_ref"] = {**raw["actor_rollout_ref"], "rollout": {
        **raw["actor_rollout_ref"]["rollout"], "nnodes": 1, "n_gpus_per_node": 2}}
    raw["trainer"] = {**raw["trainer"], "v1": {"trainer_mode": "digen", "separate_async": separate}}
    return raw


def test_verl_omni_03_separate_async_keys_convert_or_are_named(tmp_path):
    """parameter_sync_step=N with train_batch_size = N x ppo_mini_batch_size (verl-omni 0.3's identity) is
    verl-digen's step with the mini-batch carried: read, no line. Another product is named with what verl-digen
    does. Lending (hybrid_rollout.enable_switch) is named as TAG's, with its thresholds; the checkpoint engine
    (omni_delta_sharded included) is named as replaced by verl-digen's own sync."""
    logged: list[str] = []
    cfg = vo.to_run_config(_separate_async(tmp_path, parameter_sync_step=2), log=logged.append)  # 8 = 2 x 4
    assert (cfg.data.train_batch_size, cfg.actor.ppo_mini_batch_size) == (8, 4)
    assert not [x for x in logged if "parameter_sync_step" in x], logged
    logged.clear()
    raw = _separate_async(tmp_path, parameter_sync_step=4,
                          hybrid_rollout={"enable_switch": True, "switch_threshold_ratio": 0.4})
    raw["actor_rollout_ref"]["rollout"]["checkpoint_engine"] = {"backend": "omni_delta_sharded"}
    vo.to_run_config(raw, log=logged.append)
    joined = "\n".join(logged)
    assert ("trainer.v1.separate_async.parameter_sync_step=4: verl-digen syncs the generators' weights once per "
            "global step, after its data.train_batch_size / ppo_mini_batch_size = 8 / 4 optimizer steps") in joined
    assert "trainer.v1.separate_async.hybrid_rollout.enable_switch=True: lending the trainer's GPUs" in joined
    assert "actor_rollout_ref.rollout.checkpoint_engine.backend='omni_delta_sharded': not used" in joined
    assert not [x for x in logged if "not converted" in x and ("separate_async" in x or "checkpoint_engine" in x)]


def test_verl_omni_03_memory_only_actor_options_are_named(tmp_path):
    """enable_timestep_staging and use_no_sync_for_gradient_accumulation (both spellings) change memory or
    communication, not the numbers: one line each, naming the key, and not reported as unconverted."""
    raw = _runnable(tmp_path)
    actor = raw["actor_rollout_ref"]["actor"]
    raw["actor_rollout_ref"] = {**raw["actor_rollout_ref"], "actor": {
        **actor, "enable_timestep_staging": True, "use_no_sync_for_gradient_accumulation": True,
        "fsdp_config": {**actor["fsdp_config"], "use_no_sync_for_gradient_accumulation": True}}}
    logged: list[str] = []
    vo.to_run_config(raw, log=logged.append)
    for key in ("actor.enable_timestep_staging", "actor.use_no_sync_for_gradient_accumulation",
                "actor.fsdp_config.use_no_sync_for_gradient_accumulation"):
        lines = [x for x in logged if f"actor_rollout_ref.{key}=True: not used" in x]
        assert len(lines) == 1, (key, logged)
    assert not [x for x in logged if "not converted" in x and ("staging" in x or "no_sync" in x)], logged


def test_verl_omni_03_nested_lora_rank_is_refused_without_the_flat_key():
    """A nested model.lora.rank (a newer verl's default tree) without the flat lora_rank would train every
    weight: refused naming the key, as verl-omni 0.3 refuses it; the same rank in both spellings converts."""
    from verl_digen.config import ConfigError

    key = "actor_rollout_ref.model.lora.rank"
    with pytest.raises(ConfigError, match=re.escape(f"'{key}' = 32")) as err:
        vo.from_verl_omni_config(vo._nested({key: 32, "actor_rollout_ref.model.lora_rank": 0}))
    assert "actor_rollout_ref.model.lora_rank" in str(err.value)
    with pytest.raises(ConfigError, match=re.escape(f"'{key}' = 16")):
        vo.from_verl_omni_config(vo._nested({key: 16, "actor_rollout_ref.model.lora_rank": 32}))
    used: set[str] = set()
    out = vo.from_verl_omni_config(vo._nested({key: 32, "actor_rollout_ref.model.lora_rank": 32}), used=used)
    assert out["model.lora_rank"] == 32 and key in used


def test_verl_omni_03_reward_accelerator_keys_are_named(tmp_path):
    """reward.accelerator_workers.enabled and its deprecated alias custom_reward_function.use_accelerator: named
    (verl-digen's reward functions run on the generator pool anyway)."""
    raw = _runnable(tmp_path, reward={"reward_model": {"enable": False}, "accelerator_workers": {"enabled": True},
                                      "custom_reward_function": {"use_accelerator": True}, "name": "ocr"})
    logged: list[str] = []
    vo.to_run_config(raw, log=logged.append)
    for key in ("reward.accelerator_workers.enabled", "reward.custom_reward_function.use_accelerator"):
        assert any(x.startswith(f"verl-omni -> verl-digen: {key}=True: not used") for x in logged), (key, logged)
    assert not [x for x in logged if "not converted" in x and "accelerator" in x], logged


JUDGE_FILE = "def judge(solution_image, reward_router_address, model_name):\n    return 1.0\n"


@pytest.mark.parametrize("case", ["one-engine", "native", "two", "with-reward-model"])
def test_verl_omni_03_named_reward_model_is_the_served_judge(case, tmp_path):
    """reward.models (verl-omni 0.3's named reward models): one engine model is the judge verl-digen serves, its
    own model_path and rollout keys over reward.reward_model's; a native model, several models, or both
    reward.models and reward.reward_model.enable are refused naming the key."""
    from verl_digen.config import ConfigError

    f = tmp_path / "judge.py"
    f.write_text(JUDGE_FILE)
    raw = _multi(tmp_path, {"ocr": {"path": str(f), "name": "judge", "weight": 1.0}})
    raw["reward"]["reward_model"] = {"enable": False, "model_path": "/models/common",
                                     "rollout": {"name": "vllm", "gpu_memory_utilization": 0.3,
                                                 "tensor_model_parallel_size": 2}}
    judge_dir = tmp_path / "Qwen3-VL-8B-Instruct"  # a checkpoint on this machine (a hub id must be cached)
    judge_dir.mkdir()
    ocr = {"backend": "engine", "model_path": str(judge_dir), "offload": True,
           "rollout": {"name": "vllm", "tensor_model_parallel_size": 1}}
    raw["reward"]["models"] = {"ocr": ocr}
    raw["reward"]["served"] = {"command": ["python", "stub.py", "--port", "{port}"]}  # a stand-in for vLLM
    if case == "one-engine":
        logged: list[str] = []
        cfg = vo.to_run_config(raw, log=logged.append)
        served = cfg.reward.served
        assert (served.model_path, served.tensor_parallel_size, served.gpu_memory_utilization) == (
            str(judge_dir), 1, 0.3)
        assert any("reward.models.ocr.{offload}: not used" in x for x in logged), logged
        assert not [x for x in logged if "not converted" in x and "reward.models" in x], logged
        return
    key = {"native": "reward.models.ocr.backend", "two": "reward.models",
           "with-reward-model": "reward.reward_model.enable"}[case]
    if case == "native":
        ocr["backend"] = "native"
    elif case == "two":
        raw["reward"]["models"]["quality"] = dict(ocr)
    else:
        raw["reward"]["reward_model"]["enable"] = True
    with pytest.raises(ConfigError) as err:
        vo.to_run_config(raw, log=lambda _: None)
    assert err.value.key == key, str(err.value)


def test_digen_registers_through_trainer_base_when_the_package_does_not_re_export_it(monkeypatch):
    """verl-omni 0.3's v1 entry imports get_diffusion_trainer_cls from verl_omni.trainer.diffusion.v1; the hook
    registers into the package's re-exported registry (0.2.0rc1), else into the trainer_base module defining it."""
    import types

    from verl_digen.integrations.verl_omni import hook

    registry: dict[str, type] = {}

    def register_diffusion_trainer(name):
        def decorator(cls):
            registry[name] = cls
            return cls
        return decorator

    base = types.ModuleType(vo.REGISTRY_MODULE)
    base.DIFFUSION_TRAINER_REGISTRY, base.register_diffusion_trainer = registry, register_diffusion_trainer
    package = types.ModuleType(vo.REGISTRY_PACKAGE)  # re-exports only get_diffusion_trainer_cls
    package.get_diffusion_trainer_cls = registry.__getitem__
    monkeypatch.setitem(sys.modules, vo.REGISTRY_MODULE, base)
    assert hook._register_into(package) is True
    assert package.get_diffusion_trainer_cls("digen") is vo.DigenVerlOmniTrainer
