"""TSP benchmark: K sequential forward/backward passes vs one timestep-parallel pass.

CPU (default): every tiny architecture, K = 9 trained steps, batch 4, 32x32 latents, 1 thread. The two
paths are timed interleaved (seq, tsp, seq, tsp, ...) so machine noise hits both alike; the speedup is
median(seq) / median(tsp).

GPU (``--device cuda``): a realistically sized FLUX transformer (full-width blocks, bf16, 64x64
latents, random weights) with the achieved TFLOP/s of each path, counted with torch's FLOP counter.

    python bench/tsp.py            # table
    python bench/tsp.py --json     # table, then one JSON list on the last line
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from verl_digen.algo.loss import LossConfig
from verl_digen.algo.sigmas import flow_sigmas
from verl_digen.algo.trajectory import Trajectories
from verl_digen.algo.tsp import TrainStepConfig, sequential_backward, tsp_backward
from verl_digen.models import build_tiny_model, known_archs
from verl_digen.models.base import DiffusionModel


def synthetic_batch(model: DiffusionModel, batch: int, k: int, num_steps: int, seed: int = 0) -> Trajectories:
    """A micro-batch of B trajectories with K stored steps (random states; only shapes matter here)."""
    g = torch.Generator().manual_seed(seed)
    dtype, device = model.dtype, model.device
    shape = (batch, k, *model.latent_shape)
    sig = flow_sigmas(num_steps, shift=3.0, dtype=torch.float64)
    idx = torch.arange(k).expand(batch, k)
    prompts = [f"benchmark prompt {i}" for i in range(batch)]
    traj = Trajectories(
        prompts=prompts,
        prompt_ids=torch.arange(batch),
        sample_ids=torch.zeros(batch, dtype=torch.long),
        cond=model.encode_prompts(prompts).to(device),
        step_indices=idx,
        sigmas=sig[idx].to(device, dtype),
        sigmas_next=sig[idx + 1].to(device, dtype),
        states=torch.randn(shape, generator=g).to(device, dtype),
        next_states=torch.randn(shape, generator=g).to(device, dtype),
        log_probs=torch.zeros(batch, k, device=device, dtype=dtype),
        final_latents=torch.randn(batch, *model.latent_shape, generator=g).to(device, dtype),
        versions=torch.zeros(batch, dtype=torch.long),
        global_step=0,
    )
    traj.advantages = torch.linspace(-1, 1, batch, dtype=torch.float64).to(device)
    return traj


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_paths(model: DiffusionModel, traj: Trajectories, cfg: TrainStepConfig, reps: int, warmup: int,
               device: str) -> tuple[list[float], list[float]]:
    """Interleaved wall times of the sequential and the TSP backward of one micro-batch."""
    scale = 1.0 / (len(traj) * traj.num_trained_steps)
    seq, tsp = [], []
    for r in range(warmup + reps):
        for name, fn in (("seq", sequential_backward), ("tsp", tsp_backward)):
            model.transformer.zero_grad(set_to_none=True)
            _sync(device)
            t0 = time.perf_counter()
            fn(model, traj, cfg, scale)
            _sync(device)
            if r >= warmup:
                (seq if name == "seq" else tsp).append(time.perf_counter() - t0)
    return seq, tsp


def count_flops(model: DiffusionModel, traj: Trajectories, cfg: TrainStepConfig) -> float:
    """FLOPs of one TSP forward+backward (the sequential path does the same arithmetic)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        tsp_backward(model, traj, cfg, 1.0)
    model.transformer.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def fullwidth_flux(latent: int, device: str = "cuda", dtype: torch.dtype = torch.bfloat16) -> DiffusionModel:
    """A FLUX adapter around a few full-width FLUX.1 blocks (random weights, bf16, on cuda)."""
    from diffusers import FluxTransformer2DModel

    from verl_digen.models.conditioning.hashed import HashedPromptEncoder
    from verl_digen.models.flux import FluxModel

    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
        axes_dims_rope=(16, 56, 56),
    ).to(device, dtype)
    encoder = HashedPromptEncoder(256, 4096, 768, salt="bench")
    return FluxModel(transformer, None, encoder, (16, latent, latent))


def run(device: str, archs: list[str], reps: int, warmup: int, k: int, batch: int, latent: int) -> list[dict]:
    rows = []
    targets = ["flux-fullwidth"] if device == "cuda" else archs
    for arch in targets:
        if device == "cuda":
            model = fullwidth_flux(latent)
        else:
            model = build_tiny_model(arch, dtype=torch.float32, latent_size=latent if latent else None)
        model.transformer.train()
        cfg = TrainStepConfig(sde="flow_grpo", eta=0.7, sigma_max=float(flow_sigmas(10, 3.0)[1]),
                              loss=LossConfig(clip_range=1e-4))
        traj = synthetic_batch(model, batch, k, num_steps=10)
        seq, tsp = time_paths(model, traj, cfg, reps, warmup, device)
        row = {
            "arch": arch,
            "device": device,
            "k": k,
            "batch": batch,
            "seq_ms": 1e3 * statistics.median(seq),
            "tsp_ms": 1e3 * statistics.median(tsp),
            "speedup": statistics.median(seq) / statistics.median(tsp),
        }
        if device == "cuda":
            flops = count_flops(model, traj, cfg)
            row["seq_tflops"] = flops / statistics.median(seq) / 1e12
            row["tsp_tflops"] = flops / statistics.median(tsp) / 1e12
        rows.append(row)
        print(f"  {arch:<16} seq {row['seq_ms']:8.1f} ms   tsp {row['tsp_ms']:8.1f} ms   "
              f"speedup {row['speedup']:.2f}x", file=sys.stderr, flush=True)
    return rows


#: Keep freed large buffers in the process, as torch's CUDA caching allocator does on GPU. Without it,
#: glibc unmaps every large activation buffer on free and page-faults it back on the next pass, which
#: charges the big TSP pass a per-pass cost the sequential path's small buffers never pay.
CACHING_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}


def _reexec_with_caching_malloc() -> None:
    if all(os.environ.get(k) == v for k, v in CACHING_MALLOC_ENV.items()):
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **CACHING_MALLOC_ENV})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--archs", nargs="*", default=None, help="tiny architectures (cpu); default: all")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--k", type=int, default=9, help="trained steps per trajectory")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--latent", type=int, default=None, help="latent H=W (cpu default 32 images / 16 video; "
                    "cuda default 64)")
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON list on the last line")
    args = ap.parse_args()
    if args.device == "cpu":
        _reexec_with_caching_malloc()
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but torch sees no CUDA device")
    latent = args.latent or (64 if args.device == "cuda" else 0)
    archs = args.archs or known_archs()
    unknown = sorted(set(archs) - set(known_archs()))
    if unknown:
        raise SystemExit(f"unknown architectures {unknown}; known: {known_archs()}")
    print(f"TSP benchmark on {args.device}: K={args.k}, batch {args.batch}, {args.reps} interleaved reps"
          + (" (glibc malloc keeps large buffers, like a caching allocator)" if args.device == "cpu" else ""),
          file=sys.stderr, flush=True)
    rows = run(args.device, archs, args.reps, args.warmup, args.k, args.batch, latent)
    print(f"{'arch':<16}{'seq ms':>10}{'tsp ms':>10}{'speedup':>10}")
    for r in rows:
        print(f"{r['arch']:<16}{r['seq_ms']:>10.1f}{r['tsp_ms']:>10.1f}{r['speedup']:>9.2f}x")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
