"""The disaggregated rollout worker: a no-grad copy of the policy plus the reward model(s).

The driver calls individual actors (``wg.workers[i].generate.remote(...)``) so that each generator
works on its own micro-batch and picks up weights at its own boundary; only what every generator does
alike (``init_model``, weight and version queries) goes through the worker group's ``ONE_TO_ALL``.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register

from verl_digen.algo.trajectory import Trajectories
from verl_digen.rewards import build_reward
from verl_digen.schedule import ledger
from verl_digen.workers import policy as P
from verl_digen.workers.buckets import layout_of, plan_for
from verl_digen.workers.collective_probe import time_all_gather, time_sharded
from verl_digen.workers.config import WorkerConfig
from verl_digen.workers.sync import Packer, SyncGroup, SyncRefused


class VersionMismatchError(RuntimeError):
    """A micro-batch was requested for a policy version this worker does not hold."""


def check_version(held: int, requested: int, who: str) -> None:
    """A trajectory must be produced entirely by one policy version: refuse anything else."""
    if requested != held:
        raise VersionMismatchError(
            f"{who} holds policy version {held} but was asked to generate with version {requested}; "
            "sync weights first (a trajectory must never mix policy versions)"
        )


class GeneratorWorker(Worker):
    """Rollout + reward on the generator pool; weights arrive versioned from the trainer.

    ``@register`` marks what the worker group calls through verl's dispatch (``wg.init_model()``, one
    call to all); generation, scoring and validation are per-actor calls (``actor.generate.remote``),
    routed by the Ray backend, so they carry no dispatch label."""

    def __init__(self, cfg: WorkerConfig) -> None:
        super().__init__()
        P.setup_worker_process()
        self.cfg = cfg
        self.model = None
        self.backend = None  # a vLLM-Omni engine when cfg.rollout_backend == "vllm"
        self.reward = None
        self.version = 0
        self._sync: SyncGroup | None = None
        # a collective pickup writes into the live weights bucket by bucket: one that failed half-way leaves
        # them torn, and this worker then generates nothing until a pickup completes (the version it failed at)
        self._torn: int | None = None
        self._weights_lock = threading.Lock()  # a relay reads the weights while no pickup writes them
        self._relay_scratch: list[torch.Tensor] = []

    def _require_model(self) -> None:
        if self.model is None and self.backend is None:
            raise RuntimeError("GeneratorWorker.init_model() must be called first")

    def _require_weights(self) -> None:
        self._require_model()
        if self._torn is not None:
            raise RuntimeError(f"generator rank {self.rank}: its pickup of version {self._torn} failed half-way, so "
                               "its weights are torn; it generates nothing until a weight pickup completes")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the policy (version 0: the same initial weights as the trainer's) and the reward. With
        ``rollout_backend='vllm'`` the engine serves the policy and no diffusers copy is built beside it
        (docs/architecture.md, "The vLLM-Omni rollout")."""
        self.device = P.worker_device(self.cfg)
        if self.cfg.rollout_backend != "diffusers":
            from verl_digen.workers.vllm_backend import build_rollout_backend

            self.backend = build_rollout_backend(self.cfg, self.device)
        else:
            self.model = P.freeze(P.build_policy(self.cfg, self.device))
        self.reward = build_reward(self.cfg.reward)
        self.version = 0

    def generate(self, step: int, version: int, rows: list[tuple[int, int]], prompts: list[str]) -> Trajectories:
        """Trajectories for (prompt_id, sample_id) ``rows`` (``prompts[i]`` is row i's text), CPU tensors."""
        self._require_weights()
        check_version(self.version, version, f"generator rank {self.rank}")
        if self.backend is not None:
            prompt_ids, sample_ids = P.check_rows(rows, prompts)
            return self.backend.generate(step, version, prompt_ids, sample_ids, list(prompts))
        return P.generate_rows(self.model, self.cfg, step, version, rows, prompts)

    def generate_receipt(self, step: int, version: int, rows: list[tuple[int, int]],
                         prompts: list[str]) -> tuple[Trajectories, int]:
        """``generate`` plus a receipt (its row count), for ``num_returns=2``: the driver fetches only the
        receipt, which tells a finished call from a dead worker without moving the trajectories."""
        return self.generate(step, version, rows, prompts), len(rows)

    def score(self, traj: Trajectories) -> Trajectories:
        """Rewards (float64 (B,)) and reward components filled in; images dropped."""
        self._require_model()
        return P.score_trajectories(self.reward, traj)

    def score_rows(self, traj: Trajectories) -> tuple[Trajectories, dict[str, list]]:
        """``score`` split for the data plane (call with ``num_returns=2``): the scored trajectories
        stay in the object store, only ``policy.reward_rows`` (ids and rewards) reaches the driver."""
        scored = self.score(traj)
        return scored, P.reward_rows(scored)

    def validate(self, version: int, rows: list[tuple[int, int]], prompts: list[str], keep_images: int) -> dict:
        """This worker's share of a validation pass (``policy.validation_rows``) with the weights it
        holds, which must be ``version``."""
        self._require_weights()
        check_version(self.version, version, f"generator rank {self.rank} (validation)")
        if self.backend is not None:
            raise NotImplementedError("validation runs on the diffusers rollout; rollout.backend=vllm refuses "
                                      "data.val_files (config/validate.py)")
        return P.validation_rows(self.model, self.reward, self.cfg, version, rows, prompts, keep_images)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_weights(self, version: int, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Install the trainer's weights of ``version`` (object-store backend); returns the version and the
        byte ledger (the object Ray deserialized into host memory, and its copy onto the device)."""
        if self.model is None and self.backend is None:
            raise RuntimeError("GeneratorWorker.init_model() must be called first")
        if version < self.version:
            raise VersionMismatchError(f"refusing to go back from policy version {self.version} to {version}")
        with self._weights_lock:
            if self.backend is not None:
                self.backend.load_weights(version, state)
            else:
                P.load_policy_weights(self.model, state, self.cfg.policy.lora)
            self.version, self._torn = int(version), None
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        moved = {ledger.SERIALIZED: nbytes, ledger.HOST_COPIES: nbytes}
        if self.device.type != "cpu":
            moved[ledger.HOST_DEVICE] = nbytes
        return {"version": self.version, "moved": moved, "received": True}

    def _weights(self) -> dict[str, torch.Tensor]:
        """What weight sync moves, as this worker holds it (with vLLM-Omni: what it installed last)."""
        if self.backend is not None:
            return self.backend.weights()
        return P.policy_weights(self.model, self.cfg.policy.lora)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def runtime_info(self) -> dict[str, Any]:
        """Platform, threads and rank env this worker sees (diagnostics)."""
        return P.runtime_info()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_version(self) -> int:
        return self.version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_checksum(self) -> str:
        """sha256 of what weight sync moves (adapters only with LoRA)."""
        self._require_model()
        return P.weights_checksum(self._weights())

    def time_all_gather(self, host: str, port: int, rank: int, world: int, numels: list[int]) -> list:
        """The probe's all-gather timing with a trainer rank (``collective_probe.time_all_gather``)."""
        return time_all_gather(host, port, rank, world, numels)

    def time_sharded(self, host: str, port: int, rank: int, world: int, rows: list[int]) -> list:
        """The probe's sharded pass, switch gather and optimizer step with a trainer rank
        (``collective_probe.time_sharded``)."""
        return time_sharded(self.cfg, host, port, rank, world, rows)

    def join_sync_group(self, host: str, port: int, world: int, rank: int, backend: str = "gloo",
                        timeout_s: float = 300.0, secret: str = "") -> None:
        """Join the cross-pool weight-sync group as ``rank`` (after the trainer ranks), with the run's secret
        (sync.new_secret): nothing is sent to or installed from a member that cannot prove it holds it."""
        self._sync = SyncGroup(host, port, world, rank, backend, timeout_s, secret=secret,
                               node=P.node_id())

    def _sync_group(self) -> SyncGroup:
        if self._sync is None:
            raise RuntimeError("join_sync_group must be called before a collective weight pickup")
        return self._sync

    def recv_weights(self, version: int, sources: list[int]) -> dict[str, Any]:
        """Collective pickup: receive ``version`` from the group ranks ``sources`` (every trainer rank, or one
        generator relaying it) straight into the live weights, bucket by bucket; this worker is between
        trajectories. Returns the version and the byte ledger."""
        self._require_model()
        group = self._sync_group()
        if version < self.version:
            raise VersionMismatchError(f"refusing to go back from policy version {self.version} to {version}")
        with self._weights_lock:
            try:
                if self.backend is not None:
                    moved = self.backend.receive(group, version, sources, self.cfg.sync_verify_payload)
                else:
                    live = P.live_weights(self.model, self.cfg.policy.lora)
                    plan = plan_for(layout_of(live), self.cfg.sync_bucket_mb << 20, len(sources))
                    moved = group.receive(version, plan, live, sources, self.cfg.sync_verify_payload)
            except SyncRefused:
                raise  # refused before any byte was written: the weights are still the version held
            except BaseException:
                self._torn = version  # some buckets may have landed: refuse to generate until a pickup completes
                raise
            self.version, self._torn = int(version), None
        return {"version": self.version, "moved": moved, "received": True}

    def send_weights_to(self, dst: int, version: int) -> dict[str, Any]:
        """Relay: send the ``version`` this generator holds to sync rank ``dst`` (on the actor's second thread,
        beside generation, which only reads the weights). Returns the byte ledger."""
        group = self._sync_group()
        with self._weights_lock:
            check_version(self.version, version, f"generator rank {self.rank} (relay)")
            if self._torn is not None:
                raise RuntimeError(f"generator rank {self.rank} cannot relay: its weights are torn")
            held = self.backend.weights() if self.backend is not None else P.live_weights(self.model,
                                                                                          self.cfg.policy.lora)
            packer = Packer(held, self.cfg.sync_bucket_mb << 20, group.device, self._relay_scratch)
            self._relay_scratch = packer.scratch  # kept for the next relay: no new allocation
            moved = group.serve(dst, version, packer.plan, packer.bucket, verify_payload=self.cfg.sync_verify_payload)
            ledger.add(moved, ledger.STAGING_PEAK, packer.staging_bytes)
        return {"version": version, "moved": moved}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_counters(self) -> dict[str, int]:
        """Bytes this worker sent and received through the collective sync group so far (benchmarks)."""
        return dict(self._sync.counters) if self._sync is not None else {"sent": 0, "received": 0}
