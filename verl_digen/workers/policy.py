"""What every worker kind shares: building the policy, moving its weights, rollout and scoring.

The generator, the trainer and the TAG path must hold bit-identical policies and sample the same way,
so they all build, export, load, generate and score through these functions and nothing else.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, fields, replace

import torch

from verl_digen.algo.trajectory import Trajectories
from verl_digen.algo.tsp import TrainMetrics
from verl_digen.models import (
    apply_lora,
    build_model,
    has_lora,
    load_lora_state_dict,
    parse_dtype,
)
from verl_digen.models.base import DiffusionModel
from verl_digen.models.lora import ADAPTER_NAME
from verl_digen.rewards import MultiReward, Reward, Rows
from verl_digen.rollout.sampler import sample_trajectories
from verl_digen.workers.config import WorkerConfig


def setup_worker_process(threads: int = 1) -> None:
    """One BLAS thread per worker: the 2-core CI machine runs several workers at once."""
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def runtime_info() -> dict[str, object]:
    """What this worker process sees (platform, threads, verl's rank env): for diagnostics and tests."""
    from verl.utils.device import get_device_name, get_nccl_backend

    keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "VERL_PLATFORM", "OMP_NUM_THREADS")
    return {
        "pid": os.getpid(),
        "device_name": get_device_name(),
        "comm_backend": get_nccl_backend(),
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in keys},
    }


def node_id() -> str | None:
    """The Ray node this worker runs on (None outside Ray): peers on one node count as intra-node."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def worker_device(cfg: WorkerConfig) -> torch.device:
    """The torch device of this worker: CPU, or the one GPU Ray made visible to it."""
    if cfg.device == "cpu":
        return torch.device("cpu")
    if cfg.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("WorkerConfig.device='cuda' but this worker sees no CUDA device")
        return torch.device("cuda", torch.cuda.current_device())
    raise ValueError(f"unknown WorkerConfig.device {cfg.device!r}; expected 'cpu' or 'cuda'")


def build_policy(cfg: WorkerConfig, device: torch.device | str = "cpu", dtype: str | None = None) -> DiffusionModel:
    """The policy every worker starts from: same config -> bit-identical weights on every worker
    (tiny models are seeded by ``cfg.policy.seed``; LoRA starts with B = 0, i.e. the base model).
    ``dtype`` overrides ``cfg.policy.dtype`` (the trainer's fp32 master copy of a bf16 run)."""
    p = cfg.policy
    model = build_model(
        p.arch, pretrained=p.pretrained, dtype=parse_dtype(dtype or p.dtype), device=device, seed=p.seed,
        latent_size=p.latent_size, latent_width=p.latent_width, num_frames=p.num_frames,
    )
    if p.lora:
        # peft draws the A matrices from the global RNG: seed it so every worker gets the same adapters
        devices = [device] if torch.device(device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(p.seed)
            apply_lora(model, rank=p.lora_rank, alpha=p.lora_alpha, target_modules=p.lora_target_modules)
    return model


def freeze(model: DiffusionModel) -> DiffusionModel:
    """A no-grad eval copy (the generator's): nothing in it can accumulate a gradient."""
    model.transformer.requires_grad_(False).eval()
    return model


def lora_from_full_state(model: DiffusionModel, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a full transformer state dict, keyed as ``models.lora_state_dict`` keys
    them (peft's naming), so a sharded trainer exports what an unsharded generator loads."""
    from peft import get_peft_model_state_dict

    return dict(get_peft_model_state_dict(model.transformer, state_dict=state, adapter_name=ADAPTER_NAME))


def live_weights(model: DiffusionModel, lora: bool) -> dict[str, torch.Tensor]:
    """What weight sync moves, as the model's own tensors (no copy: a collective pickup writes into them,
    a relay reads them): the adapters only with LoRA (peft's names), else the transformer state dict."""
    if lora:
        if not has_lora(model):
            raise ValueError("LoRA weights asked for but the model has no adapters")
        from peft import get_peft_model_state_dict

        return dict(get_peft_model_state_dict(model.transformer, adapter_name=ADAPTER_NAME))
    return model.transformer.state_dict()


def policy_weights(model: DiffusionModel, lora: bool) -> dict[str, torch.Tensor]:
    """What weight sync moves, as detached CPU copies (see :func:`live_weights`). (Unsharded models; a
    sharded trainer gathers first, see ``actor``.)"""
    return {k: v.detach().to("cpu", copy=True) for k, v in live_weights(model, lora).items()}


@torch.no_grad()
def load_policy_weights(model: DiffusionModel, state: dict[str, torch.Tensor], lora: bool) -> None:
    """Load what ``policy_weights`` exported; any key mismatch is an error (a partial load would
    silently desynchronize generator and trainer)."""
    if lora:
        if not has_lora(model):
            raise ValueError("LoRA weights given but the model has no adapters")
        load_lora_state_dict(model, state)
        return
    expected = set(model.transformer.state_dict())
    if set(state) != expected:
        missing, extra = sorted(expected - set(state))[:5], sorted(set(state) - expected)[:5]
        raise ValueError(f"weights do not match the policy: missing {missing}, unexpected {extra}")
    model.transformer.load_state_dict(state, strict=True)


def weights_checksum(state: dict[str, torch.Tensor]) -> str:
    """sha256 over sorted names, dtypes, shapes and raw bytes: equal iff bit-identical weights."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def to_device(traj: Trajectories, device: torch.device | str) -> Trajectories:
    """The same trajectories with every tensor on ``device`` (CPU is what crosses Ray's object store)."""
    device = torch.device(device)
    if traj.final_latents.device == device:
        return traj
    changes = {
        f.name: getattr(traj, f.name).to(device)
        for f in fields(traj)
        if isinstance(getattr(traj, f.name), torch.Tensor)
    }
    changes["cond"] = traj.cond.to(device=device)
    changes["reward_components"] = {k: v.to(device) for k, v in traj.reward_components.items()}
    return replace(traj, **changes)


def check_rows(rows: list[tuple[int, int]], prompts: list[str]) -> tuple[list[int], list[int]]:
    """Split (prompt_id, sample_id) rows; ``prompts[i]`` is the text of ``rows[i]``."""
    if len(rows) == 0:
        raise ValueError("generate needs at least one (prompt_id, sample_id) row")
    if len(prompts) != len(rows):
        raise ValueError(
            f"one prompt per row expected (prompts[i] is the text of rows[i]): {len(rows)} rows, "
            f"{len(prompts)} prompts"
        )
    return [int(r[0]) for r in rows], [int(r[1]) for r in rows]


def generate_rows(
    model: DiffusionModel, cfg: WorkerConfig, step: int, version: int, rows: list[tuple[int, int]],
    prompts: list[str],
) -> Trajectories:
    """Roll out one trajectory per row with the placement-invariant sampler; CPU tensors out.

    Prompts are encoded once per distinct text and gathered per row, so a row's conditioning is the
    same whichever batch it is generated in.
    """
    prompt_ids, sample_ids = check_rows(rows, prompts)
    unique = list(dict.fromkeys(prompts))
    where = {p: i for i, p in enumerate(unique)}
    cond = model.encode_prompts(unique).index([where[p] for p in prompts])
    was_training = model.transformer.training
    model.transformer.eval()
    try:
        traj = sample_trajectories(
            model, cond, list(prompts), prompt_ids, sample_ids, cfg.sampler, cfg.seed, step, version
        )
    finally:
        model.transformer.train(was_training)
    return to_device(traj, "cpu")


@torch.no_grad()
def score_trajectories(reward: Reward, traj: Trajectories, split: str = "train") -> Trajectories:
    """Fill float64 rewards (and per-component scores) and drop the images, which the trainer never
    needs and which dominate the transfer size. ``split``: the prompt file the rows' prompt ids index
    (``"val"`` in a validation pass), for a reward that reads each sample's row."""
    if traj.images is None:
        raise ValueError(
            "trajectories carry no decoded images to score: sample with sampler.decode=True "
            "(or score before the images are dropped)"
        )
    rows = Rows(split, tuple(traj.prompt_ids.tolist()))
    if isinstance(reward, MultiReward):
        parts = reward.components(traj.images, traj.prompts, traj.final_latents, rows=rows)
        rewards = reward.weighted_sum(parts)
    else:
        rewards = reward(traj.images, traj.prompts, traj.final_latents, rows=rows)
        parts = {getattr(reward, "name", "reward"): rewards}
    traj.rewards = rewards.to(device="cpu", dtype=torch.float64)
    traj.reward_components = {k: v.to(device="cpu", dtype=torch.float64) for k, v in parts.items()}
    traj.images = None
    return traj


#: the global step of the validation samples' seed stream: fixed (the same noise at every validation, so
#: validations differ only by the weights) and never a training step's (those count from 0)
VALIDATION_STEP = -1


@torch.no_grad()
def validation_rows(model: DiffusionModel, reward: Reward, cfg: WorkerConfig, version: int,
                    rows: list[tuple[int, int]], prompts: list[str], keep_images: int) -> dict:
    """One worker's share of a validation pass: sample ``rows`` (on the validation seed stream, with
    the rollout's sampler), score them, and return rewards per row, the per-component rewards and
    the first ``keep_images`` images as uint8 (N, H, W, 3) (a video's first frame)."""
    traj = generate_rows(model, cfg, VALIDATION_STEP, version, rows, prompts)
    images = traj.images[: max(keep_images, 0)]
    if images is not None and images.dim() == 5:  # (B, 3, F, H, W): the first frame
        images = images[:, :, 0]
    pixels = (None if images is None or images.shape[0] == 0 else
              (images.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().cpu())
    scored = score_trajectories(reward, traj, split="val")
    return {"prompt_ids": scored.prompt_ids.tolist(), "rewards": scored.rewards.tolist(),
            "components": {k: v.tolist() for k, v in scored.reward_components.items()}, "images": pixels}


def metrics_dict(metrics: TrainMetrics) -> dict[str, float]:
    """TrainMetrics as a plain dict of its running sums (merge with ``merge_metrics``)."""
    return asdict(metrics)


def merge_metrics(parts: list[dict[str, float] | None]) -> TrainMetrics:
    """Fold the per-rank (or per-micro-batch) sums returned by ``update`` into one TrainMetrics."""
    total = TrainMetrics()
    for part in parts:
        if part:
            total.merge(TrainMetrics(**part))
    return total


def reward_rows(traj: Trajectories) -> dict[str, list]:
    """The few numbers the driver needs from a scored batch: ids and rewards of its rows."""
    return {"prompt_ids": traj.prompt_ids.tolist(), "sample_ids": traj.sample_ids.tolist(),
            "rewards": traj.rewards.tolist()}


def resolve_trajectories(parts) -> Trajectories:
    """Trajectories, or a list or tuple of them / of Ray object refs to them, as one batch (in order)."""
    if isinstance(parts, Trajectories):
        return parts
    import ray

    items = [ray.get(p) if isinstance(p, ray.ObjectRef) else p for p in parts]
    return items[0] if len(items) == 1 else Trajectories.cat(items)


def rows_of(traj: Trajectories, keys: dict[tuple[int, int], float]) -> Trajectories:
    """The rows of ``traj`` whose (prompt_id, sample_id) is in ``keys`` (all of them: ``traj`` itself)."""
    rows = [i for i, k in enumerate(zip(traj.prompt_ids.tolist(), traj.sample_ids.tolist())) if k in keys]
    return traj if len(rows) == len(traj) else traj.index(rows)


def with_advantages(traj: Trajectories, advantages: dict[tuple[int, int], float]) -> Trajectories:
    """Set each row's advantage from a (prompt_id, sample_id) -> advantage map."""
    keys = list(zip(traj.prompt_ids.tolist(), traj.sample_ids.tolist()))
    missing = [k for k in keys if k not in advantages]
    if missing:
        raise ValueError(f"no advantage for rows {missing[:4]}")
    traj.advantages = torch.tensor([advantages[k] for k in keys], dtype=torch.float64)
    return traj
