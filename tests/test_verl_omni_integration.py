"""verl-omni integration: inert without verl-omni, and a registered ``digen`` trainer mode with it.

verl-omni is not installed here, so a minimal stand-in package is written to a temporary directory. It
has the module path and registry API of verl-omni's v1 diffusion trainer
(``verl_omni/trainer/diffusion/v1/trainer_base.py``: ``DIFFUSION_TRAINER_REGISTRY``,
``register_diffusion_trainer``, ``get_diffusion_trainer_cls``; re-exported by the package). Its
``__init__`` imports verl first, as the real package does. Checks that touch ``sys.path`` or
``import verl`` run in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_digen.integrations import verl_omni as vo

ROOT = Path(__file__).resolve().parents[1]

FAKE_TRAINER_BASE = '''
"""Stand-in for verl_omni/trainer/diffusion/v1/trainer_base.py (registry API only)."""
DIFFUSION_TRAINER_REGISTRY: dict = {}


def register_diffusion_trainer(name):
    def decorator(cls):
        DIFFUSION_TRAINER_REGISTRY[name] = cls
        return cls
    return decorator


def get_diffusion_trainer_cls(name):
    try:
        return DIFFUSION_TRAINER_REGISTRY[name]
    except KeyError:
        raise ValueError(f"Unknown diffusion trainer '{name}'.") from None


@register_diffusion_trainer("sync")
class PolicyGradientDiffusionTrainerV1Sync:
    pass
'''

FAKE_FILES = {
    "verl_omni/__init__.py": "import verl  # noqa: F401  (the real package imports verl while importing itself)\n",
    "verl_omni/trainer/__init__.py": "",
    "verl_omni/trainer/diffusion/__init__.py": "",
    "verl_omni/trainer/diffusion/v1/__init__.py": (
        "from verl_omni.trainer.diffusion.v1.trainer_base import (  # noqa: F401\n"
        "    DIFFUSION_TRAINER_REGISTRY, get_diffusion_trainer_cls, register_diffusion_trainer)\n"
    ),
    "verl_omni/trainer/diffusion/v1/trainer_base.py": FAKE_TRAINER_BASE,
    # a primary config shaped like verl_omni/trainer/config/diffusion_trainer.yaml's trainer section
    "verl_omni/trainer/config/diffusion_trainer.yaml": (
        "trainer:\n  use_v1: false\n  device: cuda\n  v1:\n    trainer_mode: sync\n"
    ),
}

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


def _fake_verl_omni(dest: Path) -> Path:
    for rel, text in FAKE_FILES.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return dest


def _run(code: str, extra_path: list[Path]) -> dict:
    """Run ``code`` in a fresh interpreter (verl plugins on); its last stdout line is a JSON object."""
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, extra_path), str(ROOT)])
    env["VERL_PLATFORM"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=180, cwd=extra_path[0] if extra_path else ROOT)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
    """, [])
    assert out["plugin"] is True  # `import verl` loaded our entry point, and it did not fail
    assert out == {**out, "omni": False, "register": False}
    assert "_AfterImport" not in out["hooks"]  # nothing was installed


def test_plugin_registers_digen_lazily_and_composes_trainer_digen(tmp_path):
    """The real path: `import verl` runs our plugin, verl-omni's TaskRunner later resolves trainer_mode=digen."""
    fake = _fake_verl_omni(tmp_path)
    out = _run(f"""
        import json, sys
        import verl_omni  # imports verl first, which loads verl-digen's verl.plugins entry point
        lazy = "{vo.REGISTRY_PACKAGE}" not in sys.modules  # our plugin did not import the registry itself
        from verl_omni.trainer.diffusion.v1 import get_diffusion_trainer_cls
        cls = get_diffusion_trainer_cls("digen")
        from hydra import compose, initialize_config_dir
        with initialize_config_dir(config_dir="{fake}/verl_omni/trainer/config", version_base=None):
            cfg = compose("diffusion_trainer", overrides=["+trainer=digen", "trainer.v1.trainer_mode=digen"])
        print(json.dumps({{"lazy": lazy, "cls": f"{{cls.__module__}}.{{cls.__qualname__}}",
                          "sync": get_diffusion_trainer_cls("sync").__name__,
                          "mode": cfg.trainer.mode, "trainer_mode": cfg.trainer.v1.trainer_mode,
                          "policy": cfg.digen.tag.policy, "device": cfg.trainer.device}}))
    """, [fake])
    assert out["lazy"] is True
    assert out["cls"] == "verl_digen.integrations.verl_omni.DigenVerlOmniTrainer"
    assert out["sync"] == "PolicyGradientDiffusionTrainerV1Sync"  # verl-omni's own modes untouched
    assert (out["mode"], out["trainer_mode"], out["policy"]) == ("digen", "digen", "bts")
    assert out["device"] == "cuda"  # verl-omni's keys keep their values


def test_register_eagerly_and_task_runner_protocol(tmp_path):
    """register() with verl-omni importable, then the calls verl-omni's DiffusionTaskRunnerV1.run makes."""
    fake = _fake_verl_omni(tmp_path)
    config = json.dumps(_runnable(tmp_path))
    out = _run(f"""
        import json
        from omegaconf import OmegaConf
        from verl.utils.import_utils import load_class_from_fqn
        from verl_digen.integrations import verl_omni as vo

        calls = []
        class FakeRuntime:
            def __init__(self, cfg):
                calls.append(("init", cfg.trainer.mode, cfg.rollout.micro_batch_size))
            def fit(self):
                calls.append(("fit",))
                return "result"
            def shutdown(self):
                calls.append(("shutdown",))
        vo.DigenVerlOmniTrainer.runtime_cls = FakeRuntime

        registered = vo.register()
        from verl_omni.trainer.diffusion.v1 import DIFFUSION_TRAINER_REGISTRY, get_diffusion_trainer_cls
        config = OmegaConf.create(json.loads({config!r}))
        OmegaConf.set_struct(config, True)  # Hydra hands the TaskRunner a struct config
        trainer = get_diffusion_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
        trainer.init()
        fqn = config.actor_rollout_ref.rollout.agent.agent_loop_manager_class
        manager = load_class_from_fqn(fqn, "AgentLoopManager").create(
            config=config, llm_client=trainer.get_llm_client(),
            reward_loop_worker_handles=trainer.get_reward_handles())
        result = trainer.fit(manager)
        print(json.dumps({{"registered": registered, "again": vo.register(),
                          "is_ours": DIFFUSION_TRAINER_REGISTRY["digen"] is vo.DigenVerlOmniTrainer,
                          "fqn": fqn, "result": result, "calls": calls}}))
    """, [fake])
    assert out["registered"] is True and out["again"] is True and out["is_ours"] is True
    assert out["fqn"] == "verl_digen.integrations.verl_omni.NullAgentLoopManager"
    assert out["result"] == "result"
    assert out["calls"] == [["init", "digen", 16], ["fit"], ["shutdown"]]  # 8 per GPU x 2 trainer workers


def test_from_verl_omni_config_maps_a_recipe():
    notes: list[str] = []
    flat = vo.from_verl_omni_config(VERL_OMNI_SD35, trainer_workers=2, notes=notes)
    assert flat == {
        "data.train_batch_size": 8, "rollout.n": 8, "rollout.micro_batch_size": 16,
        "rollout.num_steps": 10, "rollout.noise_level": 0.8, "rollout.sde_type": "cps",
        "rollout.selection": "window", "rollout.train_steps": 3, "rollout.timestep_fraction": None,
        "actor.clip_ratio": 1e-5, "algorithm.adv_clip": 5.0, "actor.kl_coef": 0.0, "algorithm.adv_std": "batch",
        "actor.lr": 1e-4, "actor.weight_decay": 1e-4, "actor.grad_clip": 1.0,
        "model.path": "stabilityai/stable-diffusion-3.5-medium", "model.arch": "sd3", "model.dtype": "bfloat16",
        "model.lora_rank": 32, "model.lora_alpha": 64.0,
        "model.target_modules": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                                 "to_add_out"],
        "model.latent_size": 48, "data.train_files": "/data/ocr/sd3/prompts.jsonl",
        "trainer.total_steps": 100, "trainer.seed": 42, "trainer.project_name": "flow_grpo",
        "trainer.experiment_name": "sd35_medium_ocr_lora_v1", "trainer.save_freq": 100,
        "trainer.default_local_dir": "checkpoints/flow_grpo/sd35", "trainer.logger": ["console", "wandb"],
        "trainer.device": "cuda",
    }
    joined = "\n".join(notes)
    for key in ("ppo_mini_batch_size=4", "log_prob_micro_batch_size_per_gpu", "sde_window_range=[0, 5]", "reward.*"):
        assert key in joined, f"no note about {key}"

    # the other SDE kinds, KL on, no window, fixed window, string LoRA targets
    alt = vo.from_verl_omni_config({"actor_rollout_ref": {
        "actor": {"use_kl_loss": True, "kl_loss_coef": 0.01},
        "model": {"lora_rank": 8, "target_modules": "all-linear", "path": "/ckpt/Qwen/Qwen-Image"},
        "rollout": {"pipeline": {"num_inference_steps": 20}, "algo": {"sde_type": "dance_sde"}}}})
    assert (alt["actor.kl_coef"], alt["rollout.sde_type"], alt["model.arch"]) == (0.01, "dance_grpo", "qwen_image")
    assert (alt["rollout.selection"], alt["rollout.train_steps"]) == ("first_k", 19)
    assert "model.target_modules" not in alt
    fixed = vo.from_verl_omni_config({"actor_rollout_ref": {"rollout": {"algo": {
        "sde_type": "sde", "sde_window_size": 2, "sde_window_range": [3, 5]}}}})
    assert (fixed["rollout.sde_type"], fixed["rollout.window_start"]) == ("flow_grpo", 3)


def test_converted_recipe_validates_and_names_what_it_cannot_take(tmp_path):
    from verl_digen.trainer.config import ConfigError

    good = _runnable(tmp_path)
    cfg = vo.to_run_config(OmegaConf.create(good), log=lambda _: None)
    assert (cfg.trainer.mode, cfg.model.arch, cfg.rollout.micro_batch_size, cfg.algorithm.adv_std) == (
        "digen", "sd3", 16, "group")
    assert cfg.step_selection().kind == "window" and cfg.trained_steps() == 3

    # verl-digen keys written into the verl-omni config (`+reward.name=...`, `+trainer=digen`'s digen.*)
    extra = _runnable(tmp_path, rollout={"guidance_scale": 4.5},
                      digen={"tsp": {"degree": 3}, "tag": {"policy": "never"}},
                      reward={**VERL_OMNI_SD35["reward"], "name": "jpeg_compressibility"})
    extra["trainer"] = {**extra["trainer"], "mode": "separate", "logger": ["console", "mlflow"]}
    cfg = vo.to_run_config(extra, log=lambda _: None)
    assert (cfg.rollout.guidance_scale, cfg.digen.tsp.degree, cfg.digen.tag.policy) == (4.5, 3, "never")
    assert (cfg.reward.name, cfg.trainer.mode, cfg.trainer.logger) == ("jpeg_compressibility", "separate", ["console"])

    with pytest.raises(ConfigError, match="resources"):  # the pool split has no verl-omni counterpart
        vo.to_run_config({k: v for k, v in good.items() if k != "resources"}, log=lambda _: None)
    with pytest.raises(ConfigError, match="algorithm.adv_std"):  # verl-omni's default global std vs trainer=digen
        vo.to_run_config({**good, "algorithm": VERL_OMNI_SD35["algorithm"]}, log=lambda _: None)
    parquet = {**good, "data": {**good["data"], "train_files": "/data/ocr/sd3/train.parquet"}}
    with pytest.raises(ConfigError, match="data.train_files"):
        vo.to_run_config(parquet, log=lambda _: None)
