"""The trainer pool: ``TSPActorWorker`` (TSP gradient accumulation, optimizer step, weight export,
checkpoints) and ``HybridWorker`` (the TAG trainer that can also generate and score).

All trainer methods are ``ONE_TO_ALL``: every rank takes part (FSDP2 forwards/backwards and gathers
are collectives), rank-0-only results are documented per method (other ranks return ``None``).
A global step is: ``update`` once per micro-batch (gradients accumulate, no step), then
``optimizer_step`` (clip, step, zero, version += 1), then publishing the new version once (weight sync:
generators pick it up on their own). ``tag_generate`` is the exception: one rank alone (a TAG slot).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from typing import Any

import torch
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register

from verl_digen.algo.diffusion_nft import noised_rows
from verl_digen.algo.trajectory import Trajectories
from verl_digen.algo.tsp import tsp_backward
from verl_digen.models import disable_adapters, ulysses
from verl_digen.rewards import build_reward
from verl_digen.schedule import ledger
from verl_digen.workers import actor_memory, fsdp, switch
from verl_digen.workers import checkpoint as ckpt
from verl_digen.workers import policy as P
from verl_digen.workers.buckets import BucketPlan, layout_of, pack_owned, plan_for
from verl_digen.workers.collective_probe import time_all_gather, time_sharded
from verl_digen.workers.config import WorkerConfig
from verl_digen.workers.generator import check_version
from verl_digen.workers.sync import SyncGroup


def _holding_weights(method):
    """Run a method that reads or writes the trained tensors under the worker's ``_weights_lock`` (DiffusionNFT
    only: no other algorithm swaps values into them)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if getattr(self, "old", None) is None:
            return method(self, *args, **kwargs)
        with self._weights_lock:
            return method(self, *args, **kwargs)
    return run


def contiguous_share(n: int, rank: int, world: int, what: str) -> slice:
    """Rank ``rank``'s equal contiguous slice of ``n`` rows (equal shares keep collectives in step)."""
    if n % world:
        raise ValueError(f"{what}: {n} rows cannot be split evenly over {world} trainer ranks; "
                         f"make the batch a multiple of the trainer pool size")
    share = n // world
    return slice(rank * share, (rank + 1) * share)


class TSPActorWorker(Worker):
    """One rank of the trainer pool (FSDP2 across ranks, a plain module with one rank).

    ``@register(ONE_TO_ALL)`` marks the calls every rank takes together (through the worker group or
    its ``execute_all_async`` fan-out: collectives inside must run on all ranks); ``tag_generate`` is
    ``DP_COMPUTE`` (each rank its own rows: a colocated step's shares), and per-rank calls (a colocated
    rank's ``score_rows``, validation) carry no dispatch label."""

    def __init__(self, cfg: WorkerConfig) -> None:
        super().__init__()
        P.setup_worker_process()
        self.cfg = cfg
        self.model = None
        self.version = 0
        self._sync: SyncGroup | None = None
        # collective sync: the published version's plan and this rank's own buckets of it, on its device
        self._staged: tuple[int, BucketPlan, dict[int, torch.Tensor]] | None = None
        self._mode = "train"
        self._nonfinite: str | None = None  # what went non-finite in this step's updates (NaN guard)
        # the step's starting weights, kept from its first mini-batch's optimizer step to its last for the
        # old log-probs of later mini-batches (actor.recompute_log_prob with actor.ppo_mini_batch_size)
        self._behaviour: dict[str, torch.Tensor] | None = None

    # -- setup -------------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Process group, trainable policy (FSDP2 when the pool has >1 rank, or when mixed precision
        or parameter offload asks for FSDP2's policies), AdamW, KL reference (``actor_memory``)."""
        cfg = self.cfg
        self.device = P.worker_device(cfg)
        force = cfg.memory.needs_fsdp(cfg.policy.dtype)
        self.dist_rank, self.dist_world = fsdp.init_distributed(self.device, force=force)
        self.sharded = self.dist_world > 1 or force
        torch.manual_seed(cfg.seed)
        self.model = actor_memory.trainer_policy(cfg, self.device, self.dist_world, self.sharded)
        self.ref_model = actor_memory.reference_policy(cfg, self.device, self.dist_world, self.sharded)
        # Ulysses: the ranks of a group train the same rows, each with 1/size of every row's video tokens;
        # rows are shared over the groups (data-parallel rank and width)
        self.dp_rank, self.dp_world, self.sp_rank = self.dist_rank, self.dist_world, 0
        if cfg.sequence_parallel > 1:
            group, self.dp_rank, self.dp_world = ulysses.sequence_groups(cfg.sequence_parallel)
            self.sp_rank = self.dist_rank % cfg.sequence_parallel
            for model in (self.model, self.ref_model):
                if model is not None:
                    ulysses.enable_sequence_parallel(model, group)
        self.named_params = [(n, p) for n, p in self.model.transformer.named_parameters() if p.requires_grad]
        if not self.named_params:
            raise RuntimeError("the policy has no trainable parameters")
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self.named_params], lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay
        )
        self.train_cfg = cfg.sampler.train_config(cfg.loss)
        self.reward = None
        self.version = 0
        # the EMA of the trained parameters (LoRA: the adapters), sharded like them, in their dtype
        self.ema = ({n: p.detach().clone() for n, p in self.named_params} if o.ema_decay is not None else None)
        # DiffusionNFT's old policy: a copy of the trained parameters (sharded like them) that
        # ``optimizer_step`` moves towards them on its schedule (algo/diffusion_nft.py); v_old in the loss
        self.old = ({n: p.detach().clone() for n, p in self.named_params} if cfg.loss.nft is not None else None)
        self._ema_swapped: dict[str, torch.Tensor] | None = None
        # DiffusionNFT swaps the old copy into the trained tensors for a rollout's weights: an actor with a second
        # thread (weight pickups) must not do that while the first one trains or steps them
        self._weights_lock = threading.RLock()

    def _require(self, mode: str = "train") -> None:
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}.init_model() must be called first")
        if mode == "train" and self._mode != "train":
            raise RuntimeError("training state is switched out for generation: call switch_to_train() first")

    def _reference(self):
        """The KL reference velocity: base model (adapters off) with LoRA, frozen copy otherwise."""
        if self.cfg.loss.kl_coef <= 0:
            return None
        g = self.train_cfg.guidance_scale
        if self.cfg.policy.lora:
            def ref(x, s, c):
                with disable_adapters(self.model):
                    return self.model.velocity(x, s, c, g)
            return ref
        return lambda x, s, c: self.ref_model.velocity(x, s, c, g)

    # -- training ----------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @_holding_weights
    def update(self, traj: Trajectories | list | tuple, scale: float,
               advantages: dict[tuple[int, int], float] | None = None, subset: bool = False,
               *more: Trajectories) -> dict[str, float]:
        """Accumulate this rank's share of ``traj``'s (sample x step) rows' gradient with TSP (no optimizer step).

        ``traj``: Trajectories, or a list / tuple of them or of Ray object refs to scored Trajectories;
        ``more``: the update's further parts, in order. The driver passes each part's ref as an argument of
        its own (``driver/ray_backend.py``), which Ray resolves before the call (a large part from the
        object store, by this rank itself: the data plane stays off the driver). ``advantages`` maps
        (prompt_id, sample_id) to the row's advantage when ``traj`` carries none yet; ``subset``: train only
        the rows it names (a colocated mini-batch's update gets the whole step's trajectories).
        ``scale`` = 1 / (rows of the mini-batch x K: the global step's, with one); gradients are summed
        over ranks, so the accumulated gradient equals the single-process one. Returns this rank's TrainMetrics sums
        (merge the ranks' dicts with ``policy.merge_metrics``).
        """
        self._require()
        traj = P.resolve_trajectories((traj, *more) if more else traj)
        if subset:
            traj = P.rows_of(traj, advantages)
        if advantages is not None:
            traj = P.with_advantages(traj, advantages)
        if traj.advantages is None:
            raise ValueError("update needs trajectories with advantages set")
        if int(traj.versions.max()) > self.version:
            raise ValueError(f"trajectories of version {int(traj.versions.max())} are newer than the "
                             f"trainer's policy version {self.version}")
        if self.old is not None:  # DiffusionNFT: the rollout kept clean samples; the rows are built here
            traj = noised_rows(traj, self.cfg.seed)
        if self._nonfinite is None and advantages is not None and not all(map(math.isfinite, advantages.values())):
            self._nonfinite = "reward"  # advantages are finite unless a reward of the groups was not
        # this rank trains its share of the (sample x step) rows (``schedule.rows``: any number of ranks
        # works with any update size); rows sampled by an older version (TCSS) are reported apart
        metrics = tsp_backward(self.model, traj, self.train_cfg, scale, degree=self.cfg.tsp_degree,
                               reference=self._reference(), version=self.version, rank=self.dp_rank,
                               world=self.dp_world, cap=self.cfg.rows_per_pass, device=self.device,
                               behaviour=self._old_velocity() if self.old is not None else self._behaviour_velocity())
        out = P.metrics_dict(metrics)
        if self._nonfinite is None and not math.isfinite(float(out.get("loss", 0.0))):
            self._nonfinite = "loss"
        return out if self.sp_rank == 0 else {}  # a Ulysses group's ranks trained the same rows: counted once

    def _old_velocity(self):
        """DiffusionNFT's v_old: the old copy's velocity."""
        return self._velocity_of(self.old)

    def _velocity_of(self, copy):
        """The velocity of a kept copy of the trained tensors (no grad): its values put into the trained
        parameters for each call and taken out again."""
        g = self.train_cfg.guidance_scale

        def velocity(x, s, c):
            self._swap(copy)
            try:
                return self.model.velocity(x, s, c, g)
            finally:
                self._swap(copy)
        return velocity

    @contextlib.contextmanager
    def _rollout_weights(self):
        """The weights a rollout samples with: DiffusionNFT's old copy (verl-omni's ``rollout_adapter=old``), put
        into the trained tensors for the block and taken out after it; the trained weights otherwise. Every path
        that hands weights to a rollout (weight sync, TAG's generation copy, a colocated rank's own rollout)
        goes through it, so every mode samples from the same policy."""
        if self.old is None or self._ema_swapped is not None:
            yield
            return
        with self._weights_lock:  # never while the other thread trains or steps the tensors
            self._swap(self.old)
            try:
                yield
            finally:
                self._swap(self.old)

    def _behaviour_velocity(self):
        """The velocity of the step's starting weights (put in for each call) once a mini-batch's optimizer
        step has moved the trained ones; None before that, or without recompute or a loss that reads the old
        mean (GRPO-Guard, Flow-DPPO) (the loss pass's own log-prob and mean are then the old ones)."""
        if self._behaviour is None:
            return None
        return self._velocity_of(self._behaviour)

    @torch.no_grad()
    def _swap(self, values: dict[str, torch.Tensor]) -> None:
        """Exchange the trained parameters' values with ``values``', in place, one tensor at a time (no
        second copy of the weights): a second call puts both back."""
        for n, p in self.named_params:
            held = p.detach().clone()
            p.copy_(values[n])
            values[n].copy_(held)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @_holding_weights
    def optimizer_step(self, ends_step: bool = True) -> dict[str, Any]:
        """Clip the global gradient norm, step AdamW, zero gradients, bump the policy version.

        ``ends_step=False``: a mini-batch's optimizer step inside the global step (``actor.ppo_mini_batch_size``):
        the version stays (the step's trajectories are still trained), a generation copy is dropped, and
        with recompute (or GRPO-Guard's / Flow-DPPO's old mean) the step's starting weights are kept for the next
        mini-batches' old log-probs and means.

        NaN guard: when a reward, the loss or the gradient norm of this step is not finite (on any
        rank), the optimizer step is skipped -- gradients are dropped, weights and optimizer state
        stay as they were -- so non-finite values never reach the weights. The version still moves
        on, so the schedule's versioning is unchanged. Returns {"grad_norm", "version", "skipped",
        "nonfinite"} (same on every rank; "nonfinite" names the first bad quantity or is None)."""
        self._require()
        params = [p for _, p in self.named_params]
        keep = self.cfg.loss.recompute_old_log_prob or self.cfg.loss.needs_old_mean  # the old policy is read
        if not ends_step and self._behaviour is None and keep:
            self._behaviour = {n: p.detach().clone() for n, p in self.named_params}
        norm = fsdp.clip_grad_norm(params, self.cfg.optim.grad_clip, self.device)
        bad = self._nonfinite or (None if math.isfinite(norm) else "grad_norm")
        bad = _agree(bad, self.sharded, self.device)
        if bad is None:
            with self._optimizer_resident():
                self.optimizer.step()
            self._update_ema()
        self.optimizer.zero_grad(set_to_none=True)
        self._nonfinite = None
        if ends_step:
            self.version += 1
            self._behaviour = None
            self._update_old()
        else:
            self._weights_replaced()
        return {"grad_norm": norm, "version": self.version, "skipped": bad is not None, "nonfinite": bad}

    @torch.no_grad()
    def _update_old(self) -> None:
        """DiffusionNFT: old <- d old + (1 - d) theta after a global step (the version just reached, counted
        from 1 as verl-omni's trainer counts), when its schedule moves the old copy there; d = 0 copies."""
        if self.old is None:
            return
        decay = self.cfg.loss.nft.old_decay(self.version)
        if decay is None:
            return
        for name, p in self.named_params:
            if decay == 0:
                self.old[name].copy_(p.detach())
            else:
                self.old[name].lerp_(p.detach(), 1.0 - decay)

    @torch.no_grad()
    def _update_ema(self) -> None:
        """ema <- decay * ema + (1 - decay) * param, after an optimizer step that ran (a skipped one left
        the weights, and so the average, as they were)."""
        if self.ema is None:
            return
        weight = 1.0 - self.cfg.optim.ema_decay
        for name, p in self.named_params:
            self.ema[name].lerp_(p.detach(), weight)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def use_ema(self, on: bool) -> bool:
        """Put the EMA into the trained parameters (``on``), or the trained values back (validation with
        ``trainer.val_with_ema``); a generation copy made from the other set is dropped."""
        self._require(mode="any")
        if self.ema is None:
            raise RuntimeError("use_ema needs actor.ema_decay")
        if on == (self._ema_swapped is not None):
            return on
        if on:  # the EMA stays the EMA: a copy of it goes in, the trained values come out into the copy
            self._ema_swapped = {n: e.clone() for n, e in self.ema.items()}
            self._swap(self._ema_swapped)
        else:
            self._swap(self._ema_swapped)
            self._ema_swapped = None
        self._weights_replaced()
        return on

    def _weights_replaced(self) -> None:
        """The trained tensors changed without a new version (``use_ema``, a mini-batch's optimizer step);
        nothing is derived from them here (``HybridWorker`` drops its generation copy)."""

    @contextlib.contextmanager
    def _optimizer_resident(self):
        """``actor.optimizer_offload`` on a GPU pool: AdamW state is on the GPU only inside this block
        (the optimizer step, checkpoint reads and writes), in host memory the rest of the step."""
        offload = self.cfg.memory.optimizer_offload and self.device.type != "cpu"
        if offload:
            switch.move_optimizer_state(self.optimizer, self.device)
        try:
            yield
        finally:
            if offload:
                switch.move_optimizer_state(self.optimizer, "cpu")
                torch.cuda.synchronize()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def memory_report(self) -> dict[str, Any]:
        """Bytes this rank holds per kind (weights, grads, optimizer, reference, generation copy) and,
        on a GPU, the allocator's peak: what the dry run's memory plan estimates."""
        self._require(mode="any")
        out = actor_memory.memory_report(self.model, self.optimizer, self.ref_model, getattr(self, "_gen_model", None))
        if self.device.type == "cuda":
            out["max_allocated"] = torch.cuda.max_memory_allocated(self.device)
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def runtime_info(self) -> dict[str, Any]:
        """Platform, threads and rank env this worker sees (diagnostics)."""
        return P.runtime_info()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_version(self) -> int:
        return self.version

    # -- weights out -------------------------------------------------------------------------------
    def _gather_weights(self) -> dict[str, torch.Tensor] | None:
        """What weight sync moves, gathered to rank 0 (adapters only with LoRA); None elsewhere. An unsharded
        CPU rank hands out its own tensors, no copy: Ray copies a return value into its object store before
        the actor runs anything else, so nothing can change them first (a GPU rank copies to the host)."""
        if not self.sharded:
            with self._rollout_weights():  # the old copy's values leave as copies: the tensors are swapped back
                copy = (lambda v: v.detach().to("cpu").clone()) if self.old is not None else \
                    (lambda v: v.detach().to("cpu"))
                return {k: copy(v) for k, v in P.live_weights(self.model, self.cfg.policy.lora).items()}
        with self._rollout_weights():
            full = fsdp.gather_state_dict(self.model.transformer, sharded=True)
        if self.dist_rank != 0:
            return None
        return P.lora_from_full_state(self.model, full) if self.cfg.policy.lora else full

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_weights(self, version: int | None = None) -> dict[str, torch.Tensor] | None:
        """Full weights (adapter-only with LoRA) as CPU tensors on rank 0; ``None`` on other ranks.
        ``version``, when given, must be the trainer's current version."""
        self._require(mode="any")
        if version is not None:
            check_version(self.version, version, "trainer (export_weights)")
        return self._gather_weights()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_checksum(self) -> str | None:
        """sha256 of the exported weights on rank 0 (``None`` on other ranks)."""
        self._require(mode="any")
        state = self._gather_weights()
        return None if state is None else P.weights_checksum(state)

    def sharded_calls(self) -> dict[str, int]:
        """The collectives a trainer sharded over more ranks adds per call (``fsdp.sharded_calls``; the probe)."""
        return fsdp.sharded_calls(self.model.transformer)

    def time_all_gather(self, host: str, port: int, rank: int, world: int, numels: list[int]) -> list:
        """The probe's all-gather timing with a generator (``collective_probe.time_all_gather``)."""
        return time_all_gather(host, port, rank, world, numels)

    def time_sharded(self, host: str, port: int, rank: int, world: int, rows: list[int]) -> list:
        """The probe's sharded pass, switch gather and optimizer step with a generator
        (``collective_probe.time_sharded``)."""
        return time_sharded(self.cfg, host, port, rank, world, rows)

    def join_sync_group(self, host: str, port: int, world: int, rank: int, backend: str = "gloo",
                        timeout_s: float = 300.0, secret: str = "") -> None:
        """Every trainer rank joins the cross-pool weight-sync group, as its rank ``dist_rank`` (a pickup draws
        from all of them), with the run's secret (sync.new_secret)."""
        if rank != self.dist_rank:
            raise ValueError(f"trainer rank {self.dist_rank} joins the weight-sync group as its rank {self.dist_rank}, "
                             f"not {rank}")
        self._sync = SyncGroup(host, port, world, rank, backend, timeout_s, secret=secret, node=P.node_id())

    def _export_state(self) -> dict[str, torch.Tensor]:
        """What weight sync moves, as this rank's own (possibly sharded) tensors under the names the
        generators hold them by: the transformer state, or its adapters (peft's names) with LoRA."""
        state = self.model.transformer.state_dict()
        return P.lora_from_full_state(self.model, state) if self.cfg.policy.lora else state

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stage_weights(self, version: int) -> dict[str, Any]:
        """Collective backend, publish: every rank gathers the new version tensor by tensor (a collective per
        sharded tensor) and keeps, on its device, only the buckets it owns; returns the version and the ledger."""
        self._require(mode="any")
        check_version(self.version, version, "trainer (stage_weights)")
        with self._rollout_weights():
            return self._stage(version)

    def _stage(self, version: int) -> dict[str, Any]:
        state = self._export_state()
        plan = plan_for(layout_of(state), self.cfg.sync_bucket_mb << 20, self.dist_world)
        moved: dict[str, int] = {}

        def tensors():
            for name, _, _ in plan.layout:
                t = state[name]
                full = fsdp.full_on_device(t, self.device)
                if self.sharded:
                    ledger.add(moved, ledger.GATHERED, full.numel() * full.element_size() - fsdp.local_bytes([t]))
                yield name, full

        self._staged = None  # the old version's buckets go before the new ones are packed
        owned = plan.owned(self.dist_rank, self.dist_world)
        buckets = pack_owned(plan, owned, tensors(), self.device)
        self._staged = (version, plan, buckets)
        ledger.add(moved, ledger.STAGING_PEAK, sum(b.numel() for b in buckets.values()))
        return {"version": version, "moved": moved}

    def send_weights_to(self, dst: int, version: int) -> dict[str, Any]:
        """Collective backend, pickup: send this rank's staged buckets of ``version`` to sync rank ``dst`` (on
        the actor's second thread, alongside training). Returns the version and the ledger."""
        if self._sync is None:
            raise RuntimeError("join_sync_group must be called before send_weights_to")
        staged = self._staged
        if staged is None or staged[0] != version:
            raise RuntimeError(f"version {version} is not staged (staged: {None if staged is None else staged[0]})")
        _, plan, buckets = staged
        moved = self._sync.serve(dst, version, plan, lambda k, slot: buckets[k], source=self.dist_rank,
                                 sources=self.dist_world, verify_payload=self.cfg.sync_verify_payload)
        return {"version": version, "moved": moved}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_counters(self) -> dict[str, int]:
        """Bytes this rank sent and received through the collective sync group so far (benchmarks)."""
        return dict(self._sync.counters) if self._sync is not None else {"sent": 0, "received": 0}

    # -- exact state (tests) -----------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def full_state(self) -> dict[str, Any] | None:
        """Gathered CPU copies of trainable params, accumulated grads and optimizer state (keyed by
        parameter name) plus the version, on rank 0; ``None`` elsewhere. For bit-identity tests."""
        self._require()
        with self._optimizer_resident():
            return self._full_state()

    def _full_state(self) -> dict[str, Any] | None:
        params, grads, optim = {}, {}, {}
        for name, p in self.named_params:
            params[name] = fsdp.full_tensor(p)
            if p.grad is not None:
                grads[name] = fsdp.full_tensor(p.grad)
            state = self.optimizer.state.get(p, {})
            optim[name] = {k: fsdp.full_tensor(v) if torch.is_tensor(v) else v for k, v in sorted(state.items())}
        ema = {n: fsdp.full_tensor(e) for n, e in self.ema.items()} if self.ema is not None else None
        old = {n: fsdp.full_tensor(e) for n, e in self.old.items()} if self.old is not None else None
        if self.dist_rank != 0:
            return None
        return {"params": params, "grads": grads, "optim": optim, "version": self.version, "ema": ema,
                **({"old": old} if old is not None else {})}

    # -- checkpoints -------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None, keep: int | None = None,
                        export: bool = False) -> None:
        """Write weights, optimizer state, the EMA, version, RNG and the driver's ``extra`` at a step boundary
        (call after ``optimizer_step``, when no gradient is pending), atomically (see
        ``workers/checkpoint.py``); keep the ``keep`` newest checkpoints. ``export``
        (``trainer.export_on_save``): rank 0 then writes the diffusers / PEFT export into the checkpoint.
        Refuses (on every rank) to write weights or optimizer state that hold NaN/Inf."""
        self._require()
        state = self.full_state()

        def local(t: torch.Tensor) -> torch.Tensor:  # this rank's shard (a DTensor's local part)
            return t.to_local() if hasattr(t, "to_local") else t

        bad = ckpt.non_finite({n: local(p.detach()) for n, p in self.named_params}) or ckpt.non_finite(
            {f"{n}.{k}": local(v) for n, p in self.named_params for k, v in self.optimizer.state.get(p, {}).items()
             if torch.is_tensor(v)})
        if _agree(bad, self.sharded, self.device) is not None:
            raise ckpt.CheckpointError(f"refusing to write a non-finite checkpoint to {path!r}: "
                                       f"{bad or 'a tensor on another rank'} holds NaN/Inf")
        payload = None
        if state is not None:
            groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
            payload = {
                "params": state["params"], "optim": state["optim"], "param_groups": groups,
                "version": self.version, "lora": self.cfg.policy.lora,
                **({"ema": state["ema"]} if state["ema"] is not None else {}),
                **({"nft_old": state["old"]} if state.get("old") is not None else {}),
            }
        ckpt.save(path, self.dist_rank, payload, dict(extra or {}), lambda: fsdp.barrier(self.sharded), keep)
        if export and self.dist_rank == 0:
            from verl_digen.workers.export import export_into_checkpoint

            export_into_checkpoint(path, ema=self.ema is not None)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore what ``save_checkpoint`` wrote (any trainer pool size); returns the driver's ``extra``."""
        self._require()
        payload, rng = ckpt.read(path, self.dist_rank)
        names, saved_names = {n for n, _ in self.named_params}, set(payload["params"])
        if saved_names != names:
            missing, extra = sorted(names - saved_names)[:5], sorted(saved_names - names)[:5]
            raise ValueError(f"checkpoint at {path!r} does not match the policy: missing {missing}, unexpected {extra}")
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer.state.clear()
        for name, p in self.named_params:
            fsdp.copy_full_into(p, payload["params"][name])
            saved = payload["optim"].get(name, {})
            if saved:
                self.optimizer.state[p] = {
                    k: (fsdp.like(v, p) if torch.is_tensor(v) and v.shape == p.shape else
                        v.clone() if torch.is_tensor(v) else v)
                    for k, v in saved.items()
                }
        for group, saved in zip(self.optimizer.param_groups, payload["param_groups"], strict=True):
            group.update(saved)
            # this run's hyper-parameters: equal to the checkpoint's unless the driver allowed a change
            group["lr"], group["weight_decay"] = self.cfg.optim.lr, self.cfg.optim.weight_decay
        if self.ema is not None:  # a checkpoint without an EMA (turned on at resume) starts it from the weights
            saved_ema = payload.get("ema") or {}
            for name, e in self.ema.items():
                fsdp.copy_full_into(e, saved_ema.get(name, payload["params"][name]))
        if self.old is not None:  # DiffusionNFT's old copy; a checkpoint without one starts it from the weights
            saved_old = payload.get("nft_old") or {}
            for name, e in self.old.items():
                fsdp.copy_full_into(e, saved_old.get(name, payload["params"][name]))
        self.version = int(payload["version"])
        if rng is not None:
            ckpt.set_rng_state(rng)
        if self.cfg.memory.optimizer_offload and self.device.type != "cpu":
            switch.move_optimizer_state(self.optimizer, "cpu")  # restored next to the params; host until the next step
        fsdp.barrier(self.sharded)
        return payload["extra"]


def _agree(bad: str | None, sharded: bool, device: torch.device) -> str | None:
    """Every rank's verdict: non-None on all ranks when any rank saw a non-finite value (the skip
    must be collective, or the shards would drift apart). The local name, or 'another rank'."""
    if not sharded:
        return bad
    import torch.distributed as dist

    flag = torch.tensor([0.0 if bad is None else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bad if bad is not None else ("another rank" if float(flag.item()) > 0 else None)


class HybridWorker(TSPActorWorker):
    """The TAG trainer: after a real context switch, each rank is a generator slot of its own.

    ``switch_to_gen`` moves the training state out of the way and gives every rank the full current
    weights (gathered once from the FSDP shards into a generation copy, reused while the version is
    unchanged; an unsharded rank generates with its own model). ``tag_generate`` then samples whole
    micro-batches on one rank with no collective per forward; ``switch_to_train`` brings the
    training state back bit-identical."""

    def __init__(self, cfg: WorkerConfig) -> None:
        super().__init__(cfg)
        self._stash = switch.TrainingStash()
        self._gen_model = None
        self._gen_version: int | None = None
        self._gen_freed: dict[str, torch.Size] = {}  # shapes of a freed generation copy's tensors

    def _weights_replaced(self) -> None:
        self._gen_version = None  # re-gathered from the current tensors at the next switch

    def _materialize(self, moved: dict[str, int]) -> None:
        """Full weights of the current version on this rank (collective over the trainer ranks), gathered
        into the generation copy on the device, which is allocated only if it was not kept resident."""
        if not self.sharded or self._gen_version == self.version:
            return
        if self._gen_model is None:
            self._gen_model = P.freeze(P.build_policy(self.cfg, self.device))
        for name, t in self._gen_model.transformer.state_dict(keep_vars=True).items():  # a freed copy's storage
            if name in self._gen_freed:
                t.data = torch.empty(self._gen_freed[name], dtype=t.dtype, device=self.device)
        self._gen_freed = {}
        with self._rollout_weights():
            fsdp.copy_full_state(self.model.transformer, self._gen_model.transformer)
        ledger.add(moved, ledger.GATHERED, fsdp.gathered_bytes(self.model.transformer))
        self._gen_version = self.version

    def _generation_model(self):
        if not self.sharded:
            return self.model
        if self._mode != "gen" or self._gen_version != self.version:
            raise RuntimeError("a sharded trainer rank generates only after switch_to_gen()")
        return self._gen_model

    def _state_moved(self, moved: dict[str, int], nbytes: int) -> None:
        """Training state moved by a switch: across PCIe on a GPU, into host copies on a CPU rank."""
        ledger.add(moved, ledger.HOST_DEVICE if self.device.type != "cpu" else ledger.HOST_COPIES, nbytes)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def switch_to_gen(self) -> dict[str, Any]:
        """Move accumulated grads and optimizer state out of the way (GPU: offloaded to CPU; CPU: moved into a
        stash of detached copies, live tensors freed), then materialize the full generation weights on every
        rank. Returns the seconds taken and the byte ledger."""
        self._require(mode="any")
        t0 = time.perf_counter()
        moved: dict[str, int] = {}
        if self._mode == "gen":
            return {"seconds": 0.0, "moved": moved}
        self._state_moved(moved, switch.stash(self.named_params, self.optimizer, self.device, self._stash))
        self._materialize(moved)
        self._mode = "gen"
        return {"seconds": time.perf_counter() - t0, "moved": moved}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def switch_to_train(self) -> dict[str, Any]:
        """Bring grads and optimizer state back, bit-identical. The generation copy stays on the device when
        the memory plan has room for it beside the training state (``keep_generation_copy``), else it is
        freed; it never goes to host memory (the next switch overwrites every byte of it). Returns the seconds
        taken and the byte ledger."""
        self._require(mode="any")
        t0 = time.perf_counter()
        moved: dict[str, int] = {}
        if self._mode == "train":
            return {"seconds": 0.0, "moved": moved}
        if self._gen_model is not None and not self.cfg.keep_generation_copy and not self._gen_freed:
            self._free_generation_copy(moved)
        self._state_moved(moved, switch.restore(self.named_params, self.optimizer, self.device, self._stash,
                                                optimizer_on_host=self.cfg.memory.optimizer_offload))
        self._mode = "train"
        return {"seconds": time.perf_counter() - t0, "moved": moved}

    def _free_generation_copy(self, moved: dict[str, int]) -> None:
        """Release the generation copy's weights (the memory plan has no room for them beside the training
        state), keeping the module: the next switch gives each tensor new storage and gathers into it, with no
        rebuild and no load from disk."""
        seen: set[int] = set()
        for name, t in self._gen_model.transformer.state_dict(keep_vars=True).items():
            if id(t) not in seen:  # a tied tensor appears under two names: freed once
                seen.add(id(t))
                self._gen_freed[name] = t.shape
                ledger.add(moved, ledger.FREED, t.numel() * t.element_size())
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        self._gen_version = None  # gathered again at the next switch
        if self.device.type != "cpu":
            torch.cuda.empty_cache()

    @register(dispatch_mode=Dispatch.DP_COMPUTE)  # per-rank arguments: a colocated step's shares
    def tag_generate(self, step: int, version: int, rows: list[tuple[int, int]], prompts: list[str]) -> Trajectories:
        """Generate ``rows`` on this rank alone with the trainer's current weights (no grad, no
        collective; accumulated gradients and optimizer state untouched). Sampling is
        placement-invariant, so the rows equal what a generator produces for them."""
        self._require(mode="any")
        check_version(self.version, version, f"trainer rank {self.dist_rank} (TAG)")
        with self._own_rollout_weights():
            return P.generate_rows(self._generation_model(), self.cfg, step, version, list(rows), list(prompts))

    def _own_rollout_weights(self):
        """An unsharded rank samples with its own model (``_rollout_weights``); a sharded one's generation copy
        was gathered with them already."""
        return self._rollout_weights() if not self.sharded else contextlib.nullcontext()

    def _reward(self):
        if self.reward is None:  # the trainer's reward model is built on first use
            self.reward = build_reward(self.cfg.reward)
        return self.reward

    def score(self, traj: Trajectories) -> Trajectories:
        """Score on the trainer (colocated mode)."""
        self._require(mode="any")
        return P.score_trajectories(self._reward(), traj)

    def validate(self, version: int, rows: list[tuple[int, int]], prompts: list[str], keep_images: int) -> dict:
        """This rank's share of a validation pass (colocated mode; a sharded rank after
        ``switch_to_gen``), like ``GeneratorWorker.validate``."""
        self._require(mode="any")
        check_version(self.version, version, f"trainer rank {self.dist_rank} (validation)")
        with self._own_rollout_weights():
            return P.validation_rows(self._generation_model(), self._reward(), self.cfg, version, list(rows),
                                     list(prompts), keep_images)

    # Copied from verl_digen.workers.generator.GeneratorWorker.score_rows (a colocated rank scores its share)
    def score_rows(self, traj: Trajectories) -> tuple[Trajectories, dict[str, list]]:
        """``score`` split for the data plane (call with ``num_returns=2``): the scored trajectories
        stay in the object store, only ``policy.reward_rows`` (ids and rewards) reaches the driver."""
        scored = self.score(traj)
        return scored, P.reward_rows(scored)
