"""The dry run's memory plan (verl_digen/config/memory.py) against what a tiny trainer really holds.

For each tiny architecture, with and without activation checkpointing (full fine-tune, KL on):
weights / grads / optimizer / reference: the plan vs the bytes the trainer's tensors hold
(``actor_memory.memory_report``); activations: the plan vs the bytes autograd saves for the backward
of one TSP pass (a saved-tensors hook); process: the growth of the process's peak RSS over the
training step vs the plan's training total. Prints one row each and the relative error.

    python bench/memory_plan.py [--archs flux,qwen_image] [--json]

``--json``: the table, then one JSON line ``{"rows": [{arch, checkpointing, part, estimate_bytes,
measured_bytes, rel_error}, ...], "max_abs_rel_error": {part: ...}}`` (the last line of the output).
"""

from __future__ import annotations

import argparse
import json
import math
import resource

import torch

from verl_digen.algo.tsp import tsp_backward
from verl_digen.config import compose
from verl_digen.config.memory import memory_plan
from verl_digen.workers import actor_memory
from verl_digen.workers import policy as P


def saved_bytes(fn) -> int:
    """Bytes of the distinct tensors autograd saves while ``fn`` runs its forward (backward included)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if not isinstance(t, torch.nn.Parameter) and not t.requires_grad or t.grad_fn is not None:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(arch: str, ckpt: bool) -> list[tuple[str, float, float]]:
    cfg = compose([f"model.arch={arch}", "model.dtype=float32", "actor.kl_coef=0.04", "digen.tsp.degree=1",
                   f"actor.activation_checkpointing={str(ckpt).lower()}", "trainer.mode=separate",
                   "digen.tag.policy=never", "rollout.micro_batch_size=4", "digen.update=micro_batch"])
    plan = memory_plan(cfg).pools[-1]
    wcfg = cfg.worker_config()
    dev = torch.device("cpu")
    model = actor_memory.trainer_policy(wcfg, dev, 1, sharded=False)
    ref = actor_memory.reference_policy(wcfg, dev, 1, sharded=False)
    gen = P.build_policy(wcfg)
    rows = [(0, s) for s in range(cfg.rollout.n)]
    traj = P.generate_rows(gen, wcfg, 0, 0, rows, ["a red cube"] * len(rows))
    traj.rewards = torch.linspace(0, 1, len(rows), dtype=torch.float64)
    traj.advantages = traj.rewards - traj.rewards.mean()
    traj = traj.index(list(range(cfg.rollout.micro_batch_size)))
    opt = torch.optim.AdamW([p for p in model.transformer.parameters() if p.requires_grad], lr=1e-4)
    g = wcfg.sampler.guidance_scale

    def one_pass():
        tsp_backward(model, traj.index([0] * 1 + list(range(1, len(traj)))), wcfg.sampler.train_config(wcfg.loss),
                     1.0, degree=cfg.trained_steps(), reference=lambda x, s, c: ref.velocity(x, s, c, g))

    rss0 = peak_rss()
    act = saved_bytes(one_pass) / cfg.trained_steps()  # bytes per pass of one trained step (tsp degree 1)
    opt.step()
    rss = peak_rss() - rss0
    rep = actor_memory.memory_report(model, opt, ref, None)
    out = [(k, plan.parts.get(k, 0.0), float(rep[k])) for k in ("weights", "grads", "optimizer", "reference")]
    out.append(("activations", plan.parts["activations"], act))
    out.append(("process peak RSS growth", plan.train_total - plan.parts.get("gathered blocks", 0), float(rss)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", default="flux,qwen_image")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of every row")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'arch':<11}{'ckpt':<6}{'part':<25}{'estimate':>12}{'measured':>12}{'error':>9}")
    rows = []
    for arch in args.archs.split(","):
        for ckpt in (False, True):
            for part, est, got in measure(arch, ckpt):
                err = (est - got) / got if got else float("nan")
                print(f"{arch:<11}{str(ckpt):<6}{part:<25}{est / 1e6:>10.3f}MB{got / 1e6:>10.3f}MB{err:>+9.0%}")
                rows.append({"arch": arch, "checkpointing": ckpt, "part": part, "estimate_bytes": est,
                             "measured_bytes": got, "rel_error": None if math.isnan(err) else err})
    if args.json:
        worst: dict[str, float] = {}
        for r in rows:
            if r["rel_error"] is not None:
                worst[r["part"]] = max(worst.get(r["part"], 0.0), abs(r["rel_error"]))
        print(json.dumps({"rows": rows, "max_abs_rel_error": worst}))


if __name__ == "__main__":
    main()
