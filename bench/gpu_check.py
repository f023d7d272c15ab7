"""The GPU check: what only a GPU can tell about the trainer's own code, in one short run.

Needs PyTorch with CUDA plus wheels that fit in 64 MiB (diffusers, peft, omegaconf and verl-digen's other
pure-Python dependencies): no Ray, no vLLM, no verl (the functions it calls import torch alone). On CPU
(``--device cpu --quick``) the same code runs in seconds on tiny models; the suite runs it that way
(tests/test_gpu_check.py) so it never rots. docs/benchmarks.md ("GPU check") says what each figure means.

    python bench/gpu_check.py --json                         # one CUDA GPU: a few minutes on an H200
    python bench/gpu_check.py --device cpu --quick --json    # seconds, tiny models
    python bench/gpu_check.py --vllm                         # one vLLM-Omni engine (bench/vllm_check.py), a GPU

It prints one line per check; ``--json`` then ends with one JSON list on the last line (one object: device,
torch, seconds, ``ok`` and the ``checks`` below), as the other benchmarks do.

Checks (each an object under ``checks`` with ``ok``; the process exits 1 if one is not ok):

- ``tsp``: K sequential passes vs one timestep-parallel pass over full-width FLUX blocks in bf16 (CPU: the
  tiny FLUX): times, speedup, achieved TFLOP/s (torch's FLOP counter), and the two gradients' relative gap.
- ``memory_plan``: the memory plan's activation estimate (``config/memory.activation_bytes``) against what
  one training pass adds to ``torch.cuda.max_memory_allocated``, with and without activation checkpointing
  (CPU: the estimate only; the caching allocator's figures exist on CUDA alone).
- ``logprob_batch``: the SDE log-probs of the same rows computed as one batch and one sample at a time in
  bf16, and against float32: the rollout-vs-trainer gap that ``actor.recompute_log_prob`` takes out of the
  ratio.
- ``fsdp_update``: a one-rank FSDP2 update (fp32 master weights, bf16 compute on CUDA) with the trainer's
  sharding, clipping and AdamW: loss and norm finite, weights moved.
- ``tag_switch``: TAG's context switch on that rank (``workers/switch.py``): memory freed, seconds each
  way, the training state back bit-identical.
- ``weight_buckets``: the collective weight sync's device-side copies (``workers/buckets.py``): a bf16
  DiT-shaped state (~1.2 GB; quick: ~6 MB) packed into 256 MiB buckets and unpacked into another copy, and
  device->host / host->device copies of the same bytes, in GB/s; the round trip bit-identical.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import replace
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ (its TSP helpers)

from tsp import count_flops, fullwidth_flux, synthetic_batch, time_paths  # noqa: E402

from verl_digen.algo.loss import LossConfig  # noqa: E402
from verl_digen.algo.sigmas import flow_sigmas  # noqa: E402
from verl_digen.algo.tsp import (  # noqa: E402
    TrainStepConfig,
    recompute_log_probs,
    sequential_backward,
    tsp_backward,
)
from verl_digen.config.memory import activation_bytes, measured_size  # noqa: E402
from verl_digen.models import build_tiny_model  # noqa: E402
from verl_digen.models.base import DiffusionModel  # noqa: E402
from verl_digen.workers import fsdp, switch  # noqa: E402

NUM_STEPS = 10
#: relative gradient gap TSP vs sequential allowed: bf16 reorders sums of bigger GEMMs (CUDA), float32 (CPU)
GRAD_GAP = {torch.bfloat16: 3e-2, torch.float32: 1e-4}
#: the plan may overestimate (it is a bound) but never undercount a pass's activations by more than this
PLAN_UNDERCOUNT = 1.25


def _train_config() -> TrainStepConfig:
    return TrainStepConfig(sde="flow_grpo", eta=0.7, sigma_max=float(flow_sigmas(NUM_STEPS, 3.0)[1]),
                           loss=LossConfig(clip_range=1e-4))


def _model(device: str, quick: bool, dtype: torch.dtype) -> DiffusionModel:
    if quick:
        return build_tiny_model("flux", dtype=dtype, latent_size=8, device=device)
    return fullwidth_flux(64, device=device, dtype=dtype)


def _grads(model: DiffusionModel) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().float().clone() for n, p in model.transformer.named_parameters() if p.grad is not None}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def check_tsp(device: str, quick: bool, dtype: torch.dtype) -> dict[str, Any]:
    model = _model(device, quick, dtype)
    model.transformer.train()
    k, batch = (3, 2) if quick else (4, 4)
    cfg, traj = _train_config(), synthetic_batch(model, batch, k, NUM_STEPS)
    seq, tsp = time_paths(model, traj, cfg, reps=2 if quick else 5, warmup=1, device=device)
    flops = count_flops(model, traj, cfg)
    scale = 1.0 / (batch * k)
    model.transformer.zero_grad(set_to_none=True)
    sequential_backward(model, traj, cfg, scale)
    want = _grads(model)
    model.transformer.zero_grad(set_to_none=True)
    tsp_backward(model, traj, cfg, scale)
    got = _grads(model)
    num = math.sqrt(sum(float((got[n] - want[n]).pow(2).sum()) for n in want))
    den = math.sqrt(sum(float(want[n].pow(2).sum()) for n in want)) or 1.0
    seq_s, tsp_s = sorted(seq)[len(seq) // 2], sorted(tsp)[len(tsp) // 2]
    gap = num / den
    return {"k": k, "batch": batch, "seq_ms": 1e3 * seq_s, "tsp_ms": 1e3 * tsp_s, "speedup": seq_s / tsp_s,
            "seq_tflops": flops / seq_s / 1e12, "tsp_tflops": flops / tsp_s / 1e12, "grad_rel_gap": gap,
            "ok": math.isfinite(gap) and gap <= GRAD_GAP[dtype]}


def check_memory_plan(device: str, quick: bool, dtype: torch.dtype) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": True}
    for checkpointing in (False, True):
        model = _model(device, quick, dtype)
        model.transformer.train()
        if checkpointing:
            fsdp.enable_activation_checkpointing(model.transformer)
        k, batch = (2, 2) if quick else (2, 4)
        cfg, traj = _train_config(), synthetic_batch(model, batch, k, NUM_STEPS)
        size = measured_size(model, "gpu check")
        rows = batch * k
        estimate = activation_bytes(rows, size.blocks, size.tokens, size.hidden, dtype.itemsize, checkpointing)
        tsp_backward(model, traj, cfg, 1.0)  # the gradients exist before the measured pass (they are not activations)
        row: dict[str, Any] = {"rows": rows, "estimate_mib": estimate / 2**20, "measured_mib": None}
        if device == "cuda":
            _sync(device)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            tsp_backward(model, traj, cfg, 1.0)
            _sync(device)
            measured = torch.cuda.max_memory_allocated() - base
            row.update(measured_mib=measured / 2**20, measured_over_estimate=measured / estimate)
            row["ok"] = measured <= PLAN_UNDERCOUNT * estimate
            out["ok"] = out["ok"] and row["ok"]
        out["checkpointing" if checkpointing else "plain"] = row
        del model
    return out


def check_logprob_batch(device: str, quick: bool) -> dict[str, Any]:
    model = _model(device, quick, torch.bfloat16)
    cfg = _train_config()
    traj = synthetic_batch(model, 4, 2, NUM_STEPS)
    with torch.no_grad():
        batched = recompute_log_probs(model, traj, cfg).double()
        alone = torch.cat([recompute_log_probs(model, traj.index([i]), cfg) for i in range(len(traj))]).double()
        model.transformer.float()
        full = recompute_log_probs(model, replace(traj, states=traj.states.float(),
                                                  next_states=traj.next_states.float(),
                                                  sigmas=traj.sigmas.float(), sigmas_next=traj.sigmas_next.float()),
                                   cfg).double()
    batch_gap = float((batched - alone).abs().max())
    return {"rows": batched.numel(), "max_abs_batch_vs_alone_bf16": batch_gap,
            "max_abs_bf16_vs_fp32": float((batched - full).abs().max()),
            "ok": math.isfinite(batch_gap)}


def check_fsdp_and_switch(device: str, quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    dev = torch.device(device)
    fsdp.init_distributed(dev, force=True)
    try:
        model = _model(device, quick, torch.float32)  # fp32 master weights
        model.transformer.train()
        fsdp.shard_transformer(model.transformer, 1, dev, param_dtype=torch.bfloat16 if device == "cuda" else None)
        params = [(n, p) for n, p in model.transformer.named_parameters() if p.requires_grad]
        opt = torch.optim.AdamW([p for _, p in params], lr=1e-4)
        cfg, traj = _train_config(), synthetic_batch(model, 2, 2, NUM_STEPS)
        before = {n: fsdp.full_tensor(p) for n, p in params}
        _sync(device)
        t0 = time.perf_counter()
        metrics = tsp_backward(model, traj, cfg, 0.25)
        norm = fsdp.clip_grad_norm([p for _, p in params], 1.0, dev)
        opt.step()
        _sync(device)
        step_s = time.perf_counter() - t0
        moved = max(float((fsdp.full_tensor(p) - before[n]).abs().max()) for n, p in params)
        update = {"step_s": step_s, "loss": metrics.loss, "grad_norm": norm, "max_weight_change": moved,
                  "ok": math.isfinite(metrics.loss) and math.isfinite(norm) and moved > 0}

        opt.zero_grad(set_to_none=True)
        tsp_backward(model, traj, cfg, 0.25)  # gradients of the next step, as a TAG switch finds them
        grads = {n: fsdp.full_tensor(p.grad) for n, p in params}
        state = {n: {k: fsdp.full_tensor(v) for k, v in opt.state[p].items() if torch.is_tensor(v)} for n, p in params}
        used = torch.cuda.memory_allocated() if device == "cuda" else None
        stashed = switch.TrainingStash()
        t0 = time.perf_counter()
        switch.stash(params, opt, dev, stashed)
        out_s = time.perf_counter() - t0
        freed = (used - torch.cuda.memory_allocated()) if device == "cuda" else None
        t0 = time.perf_counter()
        switch.restore(params, opt, dev, stashed)
        back_s = time.perf_counter() - t0
        same = all(torch.equal(fsdp.full_tensor(p.grad), grads[n]) for n, p in params) and all(
            torch.equal(fsdp.full_tensor(opt.state[p][k]), v) for n, p in params for k, v in state[n].items())
        tag = {"out_s": out_s, "back_s": back_s, "freed_mib": None if freed is None else freed / 2**20,
               "bit_identical": same, "ok": same and (freed is None or freed > 0)}
        return update, tag
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def check_weight_buckets(device: str, quick: bool) -> dict[str, Any]:
    """The collective weight sync's device-side work (``workers/buckets.py``): a DiT-shaped bf16 state packed
    into buckets and unpacked into another copy of it on the device (a publish's and a pickup's copies), and
    the host<->device copies the object-store path and the old TAG switch made, for scale. GB/s each; the
    round trip must be bit-identical."""
    from verl_digen.workers.buckets import BucketPlan, byte_view, layout_of, new_bucket, pack, unpack

    dev = torch.device(device)
    hidden, blocks = (256, 4) if quick else (3072, 8)  # quick: ~6 MB; else ~1.2 GB, FLUX-width blocks
    g = torch.Generator().manual_seed(0)
    state = {}
    for b in range(blocks):
        for name, shape in (("to_qkv", (3 * hidden, hidden)), ("to_out", (hidden, hidden)),
                            ("ff_up", (4 * hidden, hidden)), ("ff_down", (hidden, 4 * hidden)), ("norm", (hidden,))):
            state[f"blocks.{b}.{name}"] = torch.randn(*shape, generator=g).to(device=dev, dtype=torch.bfloat16)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    plan = BucketPlan.of(layout_of(state), (1 if quick else 256) << 20)
    buckets = [new_bucket(plan, k, dev) for k in range(len(plan))]
    into = {k: torch.zeros_like(v) for k, v in state.items()}

    def timed(fn) -> float:
        fn()  # warm: allocations, first touch
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        return time.perf_counter() - t0

    pack_s = timed(lambda: [pack(plan, k, state, buckets[k]) for k in range(len(plan))])
    unpack_s = timed(lambda: [unpack(plan, k, buckets[k], into) for k in range(len(plan))])
    flat = torch.cat([byte_view(t) for t in state.values()])
    host = torch.empty(flat.numel(), dtype=torch.uint8, pin_memory=device == "cuda")
    d2h_s = timed(lambda: host.copy_(flat))
    h2d_s = timed(lambda: flat.copy_(host))
    same = all(torch.equal(byte_view(into[k]), byte_view(state[k])) for k in state)
    gb = nbytes / 1e9
    return {"state_mib": nbytes / 2**20, "buckets": len(plan), "pack_gbps": gb / pack_s, "unpack_gbps": gb / unpack_s,
            "device_to_host_gbps": gb / d2h_s, "host_to_device_gbps": gb / h2d_s, "bit_identical": same, "ok": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="tiny models (seconds; what CI runs on CPU)")
    ap.add_argument("--json", action="store_true", help="end with the result as one JSON list on the last line")
    ap.add_argument("--vllm", action="store_true", help="only the vLLM-Omni engine check (bench/vllm_check.py; needs "
                    "vllm-omni): one JSON line")
    args = ap.parse_args()
    if args.vllm:
        if args.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--vllm --device cuda: torch sees no CUDA device (--device cpu: the tier's CPU hooks)")
        import vllm_check

        sys.argv = [vllm_check.__file__, "--device", args.device]
        vllm_check.main()  # one JSON object, the last line
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (run with --device cpu --quick on a CPU)")
    if args.device == "cpu":
        torch.set_num_threads(1)
    # bf16 compute where the GPU path trains in it; the CPU check keeps float32 (CPU bf16 kernels are slow)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    t0 = time.perf_counter()
    checks: dict[str, Any] = {}
    for name, run in (("tsp", lambda: check_tsp(args.device, args.quick, dtype)),
                      ("memory_plan", lambda: check_memory_plan(args.device, args.quick, dtype)),
                      ("logprob_batch", lambda: check_logprob_batch(args.device, args.quick)),
                      ("weight_buckets", lambda: check_weight_buckets(args.device, args.quick))):
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        checks[name] = run()
    print("gpu_check: fsdp_update, tag_switch ...", file=sys.stderr, flush=True)
    checks["fsdp_update"], checks["tag_switch"] = check_fsdp_and_switch(args.device, args.quick)
    ok = all(c["ok"] for c in checks.values())
    result = {"device": args.device,
              "gpu": torch.cuda.get_device_name() if args.device == "cuda" else platform.machine(),
              "torch": torch.__version__, "quick": args.quick, "seconds": time.perf_counter() - t0, "ok": ok,
              "checks": checks}
    for name, check in checks.items():
        figures = ", ".join(f"{k} {_shown(v)}" for k, v in check.items() if k != "ok")
        print(f"{name:<14} {'ok  ' if check['ok'] else 'FAIL'}  {figures}")
    print(f"{'all' if ok else 'NOT all'} checks ok on {result['gpu']} ({args.device}) in {result['seconds']:.1f} s")
    if args.json:
        print(json.dumps([result]))
    raise SystemExit(0 if ok else 1)


def _shown(v: Any) -> str:
    """A figure for the table: floats to 4 significant digits, a nested check (memory_plan's) inline."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} {_shown(x)}" for k, x in v.items()) + "}"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
