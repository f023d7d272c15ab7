"""The dry run's stopping lines (config/stop_plan.py): a checkpoint's save time and the Slurm ``--signal`` lead
time, which must cover the predicted step and the save (issue 49)."""

from __future__ import annotations

import math
import re
import time

import torch

from verl_digen.config import compose
from verl_digen.config import stop_plan as sp
from verl_digen.config.plan import resource_plan
from verl_digen.main import dry_run
from verl_digen.workers import checkpoint as ckpt

QWEN = ["model.arch=qwen_image", "model.path=some/hub-id", "digen.profile=qwen-image-20b-32", "model.dtype=bfloat16",
        "resources.generator.workers=16", "resources.trainer.workers=16", "data.train_batch_size=4",
        "rollout.n=32", "rollout.micro_batch_size=16"]
LEAD = re.compile(r"--signal   sbatch --signal=B:USR1@(\d+): \((\d+) s step \+ (\d+) s save\)")
SAVE = re.compile(r"  save       (\d+) s per checkpoint \(([\d.]+) GB; (.*)\)")


def _lead(text: str) -> tuple[int, float, float]:
    lead, step, save = LEAD.search(text).groups()
    return int(lead), float(step), float(save)


def test_the_dry_run_prints_the_save_time_and_a_lead_covering_the_step_and_the_save(tmp_path):
    cfg = compose([*QWEN, f"trainer.default_local_dir={tmp_path / 'none'}"])
    step_s = resource_plan(cfg).predicted_step_s
    text = dry_run(cfg)
    # a 20B full fine-tune with fp32 masters: weights + AdamW's two moments, 4 bytes each, at 1 GB/s
    save_s = 3 * 20e9 * 4 / 1e9
    secs, gb, source = SAVE.search(text).groups()
    assert float(secs) == round(save_s) and float(gb) == save_s and "assumed 1 GB/s" in source, text
    lead, printed_step, printed_save = _lead(text)
    assert (printed_step, printed_save) == (round(step_s), round(save_s))
    assert lead == math.ceil(((step_s + save_s) * 1.25 + 60) / 10) * 10, text
    assert lead >= step_s + save_s + 60
    # each term moves the lead: a slower step, a bigger checkpoint (an EMA is one more copy of the weights)
    slower = sp.stop_plan(cfg, step_s + 400).lead_s
    bigger = sp.stop_plan(compose([*QWEN, "actor.ema_decay=0.99", f"trainer.default_local_dir={tmp_path}"]), step_s)
    assert slower >= lead + 400 and bigger.save_s == 4 * 20e9 * 4 / 1e9 and bigger.lead_s >= lead + 80
    assert "trainer.stop_grace_s=25: a SIGTERM abandons the step in progress" in text


def test_a_lora_checkpoint_is_the_adapters_and_a_tiny_run_has_no_lead():
    lora = compose([*QWEN, "model.lora_rank=64"])
    from verl_digen.config.memory import model_size, trainable_params

    n = trainable_params(lora, model_size(lora))
    assert n < 1e9 and sp.checkpoint_bytes(lora) == 3 * n * 2  # bf16 masters for LoRA on a bf16 model
    text = dry_run(compose([]))  # tiny, no digen.profile: a save estimate, no step time to lead by
    assert "no lead time without a predicted step time" in text and SAVE.search(text), text


def test_the_runs_measured_save_time_replaces_the_assumption(tmp_path):
    root = tmp_path / "ckpt"
    began = time.time() - 7.0  # a save that took about 7 s
    ckpt.save(ckpt.step_dir(root, 3), 0, {"params": {"w": torch.zeros(1000)}, "optim": {}},
              {sp.SAVE_BEGAN_KEY: began}, lambda: None)
    cfg = compose([*QWEN, f"trainer.default_local_dir={root}"])
    text = dry_run(cfg)
    secs, gb, source = SAVE.search(text).groups()
    assert source.startswith("measured: the run's last checkpoint") and 7 <= float(secs) < 15, text
    assert float(gb) < 0.1  # the checkpoint's own files
    lead, step, save = _lead(text)
    assert save == float(secs) and lead == math.ceil(((resource_plan(cfg).predicted_step_s + 7) * 1.25 + 60) / 10) * 10
