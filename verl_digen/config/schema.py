"""The run configuration: typed dataclasses (the Hydra schema), loading and composing it, and its
resolution into what the workers (``WorkerConfig``) and the scheduler (``ScheduleConfig``) consume.
Checking a config is ``config/validate.py``'s job.
"""

from __future__ import annotations

import difflib
import functools
import os
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from verl_digen.algo.algorithms import ALGORITHMS, loss_mode
from verl_digen.config.errors import ConfigError
from verl_digen.defaults import CLIP_RANGE, DEFAULT_LEARNABLE_REWARD, LOG_FORMATS, NUM_STEPS, TRAIN_STEPS
from verl_digen.dtypes import BYTES
from verl_digen.schedule import ScheduleConfig
from verl_digen.schedule.config import COLOCATED, DIGEN, SEPARATE, ScheduleConfigError

if TYPE_CHECKING:  # the resolved configs live beside the torch code that reads them: imported where built
    from verl_digen.algo.advantages import AdvantageConfig
    from verl_digen.algo.sampling import SamplerSpec
    from verl_digen.algo.selection import StepSelection
    from verl_digen.rollout.sampler import SamplerConfig
    from verl_digen.workers.config import WorkerConfig

ROLLOUT_BACKENDS = ("diffusers", "vllm")
RECOMPUTE_CHOICES = ("auto", "true", "false")
LOG_FORMAT_CHOICES = ("auto", *LOG_FORMATS)
DEVICES = ("cpu", "cuda")
LOGGERS = ("console", "tensorboard", "wandb")


@dataclass
class ModelConfig:
    arch: str = "flux"
    path: str | None = None  # local path or hub id of a diffusers pipeline; None = tiny random weights
    dtype: str = "float32"
    latent_size: int | None = 16  # latent height (pixels / 8); null: the architecture's default size
    latent_width: int | None = None  # latent width when it differs from the height; null: square
    num_frames: int | None = None
    seed: int = 0
    lora_rank: int = 0
    lora_alpha: float | None = None
    target_modules: list[str] | None = None


@dataclass
class DataConfig:
    train_files: str | None = None  # .txt (one prompt per line), .jsonl or .parquet (a prompt_key field)
    train_batch_size: int = 4  # prompts per global step
    synthetic_prompts: int = 64  # built-in prompts when train_files is None
    prompt_key: str = "prompt"  # the prompt field / column of .jsonl and .parquet files (verl's name)
    val_files: str | None = None  # validation prompts (same formats); scored every trainer.test_freq steps


@dataclass
class RolloutConfig:
    n: int = 4  # samples per prompt (the GRPO group)
    micro_batch_size: int = 2  # samples per generation micro-batch (the pipeline unit)
    num_steps: int = NUM_STEPS
    noise_level: float = 0.7
    sde_type: str = "flow_grpo"
    cps_log_prob: str = "gaussian"  # sde_type=cps: gaussian density, or squared_error (flow_grpo / verl-omni)
    guidance_scale: float = 1.0
    shift: float = 1.0
    selection: str = "first_k"
    train_steps: int | None = TRAIN_STEPS  # K trained steps (or use timestep_fraction)
    timestep_fraction: float | None = None
    window_start: int | None = None
    window_range: list[int] | None = None  # [lo, hi]: a drawn window lies in steps [lo, hi) (sde_window_range)
    # algorithm.name=mix_grpo: how the SDE window of rollout.train_steps steps slides (verl-omni's names): random
    # (a start per global step from sde_window_seed) or progressive (+ its size every iters_per_group steps)
    sample_strategy: str = "random"
    iters_per_group: int = 1
    sde_window_seed: int = 0
    shared_group_noise: bool = False
    backend: str = "diffusers"  # rollout engine of the generator pool: diffusers | vllm (vLLM-Omni, GPU)
    # backend=vllm: the RL pipeline class the engine installs (custom_pipeline_args); null = verl-digen's own for
    # model.arch; another class (e.g. verl-omni's) is read in verl-omni's layout, one request per sample
    vllm_pipeline: str | None = None
    vllm_compile: bool = False  # backend=vllm: let the engine compile its transformer (vllm-omni's enforce_eager off)
    # the memory plan checks the engine's terms against this share (vLLM's gpu_memory_utilization)
    vllm_memory_fraction: float = 0.9  # backend=vllm: share of a generator GPU the engine may take


@dataclass
class ActorConfig:
    lr: float = 3e-3
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_ratio: float = CLIP_RANGE
    kl_coef: float = 0.0
    kl_dt_weighted: bool = False  # each row's KL x its |dt| (verl-omni's Flow-GRPO KL; set by the converter)
    kl_mask_threshold: float = 1e-5  # algorithm.name=flow_dppo: the per-element KL(new || old) past which ...
    add_kl_coefficient: bool = True  # ... an update moving away is dropped; the KL over 2 std^2 (false: over 2)
    # the ratio's old log-probs: the trainer's own (true), the rollout's (false), or auto: the trainer's when
    # the rollout engine or its dtype differs from the trainer's, outside TCSS (docs/config.md)
    recompute_log_prob: str = "auto"
    # memory and precision of the trainer (docs/config.md "Memory and precision"; verl's fsdp_config names)
    param_dtype: str | None = None  # trainer compute dtype (FSDP2 MixedPrecisionPolicy); null = model.dtype
    reduce_dtype: str | None = None  # gradient reduction dtype; null = the master dtype
    master_dtype: str | None = None  # stored params, grads, AdamW state; null = fp32 (full fine-tune) / model.dtype
    activation_checkpointing: bool = False  # recompute each transformer block in the backward
    param_offload: bool = False  # FSDP2 CPUOffloadPolicy (params, grads and the optimizer step on the host)
    optimizer_offload: bool = False  # AdamW state on the host between optimizer steps
    ema_decay: float | None = None  # an EMA of the trained weights (LoRA: adapters), decay per optimizer step
    # prompts per optimizer step (verl's name): the step's prompts are trained in that many mini-batches, each
    # followed by an optimizer step; null = the whole batch (one optimizer step per global step)
    ppo_mini_batch_size: int | None = None
    # Ulysses sequence parallelism (verl's name): each group of this many trainer ranks trains the same rows,
    # each rank holding 1/size of every row's video tokens (Wan2.1, HunyuanVideo); 1 = off (docs/config.md)
    ulysses_sequence_parallel_size: int = 1
    # algorithm.name=diffusion_nft (verl-omni's diffusion_loss names; actor.kl_coef is its ref_kl_coef): beta of
    # the implicit policies, the advantage clamp of the optimality probability, the adaptive weight's floor
    mix_beta: float = 0.5
    adv_clip_max: float = 5.0
    adaptive_weight_min: float = 1.0e-5


@dataclass
class AlgorithmConfig:
    name: str | None = None  # flow_grpo|dance_grpo|cps|grpo_guard|flow_dppo|mix_grpo|diffusion_nft; null: FlowGRPO
    adv_std: str = "group"
    std_estimator: str = "population"  # the std's divisor: n (population) or n - 1 (unbiased, verl-omni's)
    adv_eps: float = 1e-4
    adv_clip: float | None = 5.0
    drop_zero_groups: bool = False
    keep_extremes: int | None = None
    # algorithm.name=diffusion_nft (verl-omni's names): the advantage -> optimality probability map, and the old
    # policy copy: old <- d old + (1 - d) theta every old_policy_update_interval global steps, d from the
    # schedule (copy | linear_to_0_5 | delayed_linear_to_0_999) unless old_policy_decay fixes it
    adv_mode: str = "continuous"
    old_policy_decay_schedule: str = "copy"
    old_policy_decay: float | None = None
    old_policy_update_interval: int = 1


@dataclass
class ServedRewardConfig:
    model_path: str | None = None  # a reward model served over OpenAI's chat API (verl-omni's reward_model); null: none
    tensor_parallel_size: int = 1  # GPUs of one replica (vLLM's --tensor-parallel-size); replicas = judge GPUs / this
    gpu_memory_utilization: float = 0.5  # the share of a generator GPU vLLM may take
    command: list[str] | None = None  # replaces vLLM's server: argv with {port}, {model_path}
    startup_timeout_s: float = 600.0  # how long the server may take to answer /v1/models
    seconds_per_image: float | None = None  # one replica's time per image scored (measured): the plans price it
    startup_s: float | None = None  # one start of the judge, measured (the log's "started in N s"): the plans price it


@dataclass
class RewardConfig:
    name: str = DEFAULT_LEARNABLE_REWARD  # replaced by the custom function when custom_reward_function.path is set
    weights: dict[str, float] | None = None  # several rewards: {name: weight}; overrides name
    kwargs: dict[str, Any] | None = None  # options of the single reward `name` (e.g. a local weights path)
    functions: dict[str, Any] | None = None  # verl-omni's reward_functions: {key: {path, name, weight, required}}
    served: ServedRewardConfig = field(default_factory=ServedRewardConfig)  # a judge the functions call


@dataclass
class CustomRewardConfig:
    path: str | None = None  # a Python file defining the reward function (verl's custom_reward_function)
    name: str = "compute_score"  # the function in that file: fn(images, prompts, **reward_kwargs) -> scores
    reward_kwargs: dict[str, Any] | None = None  # keyword arguments passed to every call


@dataclass
class PoolConfig:
    workers: int = 1
    node_resource: str | None = None  # a Ray custom resource the pool's nodes advertise (GPU type)
    gpu_memory_gb: float | None = None  # memory of one GPU of the pool: the dry run's memory plan checks it


@dataclass
class RewardPoolConfig:
    workers: int = 0  # GPUs of the served judge's own pool; 0: served on the generator pool (DigenRL's placement)
    node_resource: str | None = None  # a Ray custom resource the judge pool's nodes advertise


@dataclass
class ResourcesConfig:
    generator: PoolConfig = field(default_factory=PoolConfig)
    trainer: PoolConfig = field(default_factory=PoolConfig)
    reward: RewardPoolConfig = field(default_factory=RewardPoolConfig)  # the served judge (reward.served)


@dataclass
class GapConfig:
    enable: bool = True


@dataclass
class TspConfig:
    degree: int | None = None  # trained steps per pass; None = all K in one pass
    rows_per_pass: int | None = None  # (sample x step) rows per trainer rank per pass, packed across samples
    # and micro-batches of an update; None = what degree gives (an update's samples x degree / ranks)


@dataclass
class TagConfig:
    policy: str = "bts"  # never | static:K | adaptive:R | bts


@dataclass
class TcssConfig:
    staleness: float = 0.0


@dataclass
class SyncConfig:
    backend: str = "object_store"
    bucket_mb: int = 2048  # collective: bucket size in MiB (verl's update_weights_bucket_megabytes default)
    verify_payload: bool = False  # collective: SHA-256 over every pickup's payload on both ends (costly)


@dataclass
class DigenConfig:
    gap: GapConfig = field(default_factory=GapConfig)
    tsp: TspConfig = field(default_factory=TspConfig)
    tag: TagConfig = field(default_factory=TagConfig)
    tcss: TcssConfig = field(default_factory=TcssConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    update: str = "unit"  # unit | micro_batch
    update_units: int = 1  # release units packed into one update (update=unit, trainer=digen)
    plan: str | None = None  # auto: the planner's best configuration for this config and cluster, at start
    profile: str | None = None  # cost estimates: a measured profile file or a simulator preset name


@dataclass
class TrainerConfig:
    mode: str = DIGEN
    total_steps: int = 10
    seed: int = 0
    device: str = "cpu"
    project_name: str = "verl-digen"
    experiment_name: str = "tiny"
    logger: list[str] = field(default_factory=lambda: ["console"])
    default_local_dir: str = "outputs/checkpoints"
    save_freq: int = -1  # save a checkpoint after every N-th step and after the last one; <= 0: never
    resume_from: str | None = None  # a checkpoint directory, or "auto": the latest complete one (or a fresh start)
    max_checkpoints: int | None = None  # keep only the N newest complete checkpoints; None keeps all
    resume_allow_changes: list[str] = field(default_factory=list)  # keys that may differ from the checkpoint's
    on_nonfinite: str = "skip"  # non-finite reward / loss / grad norm: skip the optimizer step, or stop the run
    max_nonfinite_steps: int = 3  # stop (exit non-zero) after this many consecutive non-finite steps
    stop_grace_s: float | None = 25.0  # the scheduler's grace between SIGTERM and SIGKILL; None: always finish
    stall_timeout_s: float | None = 1800.0  # stop when no action finishes for this long (a hung worker); None waits
    generator_max_restarts: int = 3  # Ray restarts per generator actor; its in-flight actions are retried on it
    action_timeout_factor: float | None = 10.0  # a generator action over this x its estimate is hung; None: off
    action_timeout_min_s: float = 300.0  # ... but never before this many seconds (cold starts, loaded hosts)
    trace_dir: str | None = "outputs/trace"
    progress: bool = True
    log_format: str = "auto"  # console per step: block (grouped metrics), line (one line), auto: line unless a terminal
    dry_run: bool = False  # print the resolved config and the resource plan, then exit
    test_freq: int = -1  # validate on data.val_files every N steps and after the last one; <= 0: never
    log_val_generations: int = 16  # validation samples drawn as an image grid (PNG, tensorboard, wandb); 0: none
    val_with_ema: bool = False  # validate the EMA of the weights (actor.ema_decay), not the weights
    export_on_save: bool = False  # every checkpoint also holds its diffusers / PEFT export (export/)


@dataclass
class RayConfig:
    address: str | None = None  # join this Ray cluster (host:port, ray://host:port, auto); unset: RAY_ADDRESS, else own
    # Ray task events for the run's worker calls (the dashboard's task view, `ray list tasks`); off by default: the
    # driver buffers one per call and grows by them (docs/benchmarks.md, "Soak"), and the run keeps its own timeline
    task_events: bool = False


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    custom_reward_function: CustomRewardConfig = field(default_factory=CustomRewardConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    digen: DigenConfig = field(default_factory=DigenConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    # -- derived -----------------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return self.data.train_batch_size * self.rollout.n

    def ray_address(self) -> tuple[str | None, str]:
        """(the Ray cluster this run joins, where that came from): ``ray.address`` wins over ``RAY_ADDRESS`` as
        an argument to ``ray.init`` wins over it; (None, "") means the run starts a head of its own."""
        if self.ray.address:
            return self.ray.address, "ray.address"
        given = os.environ.get("RAY_ADDRESS")
        return (given, "RAY_ADDRESS") if given else (None, "")

    @property
    def total_workers(self) -> int:
        return self.resources.generator.workers + self.resources.trainer.workers

    def step_selection(self) -> StepSelection:
        """Which steps are trained; ``algorithm.name=mix_grpo`` slides a window of them (``algo.mix_grpo``)."""
        from verl_digen.algo.mix_grpo import MixWindow
        from verl_digen.algo.selection import StepSelection

        r = self.rollout
        mix = None
        if self.algorithm.name == "mix_grpo":
            mix = MixWindow(r.sample_strategy, r.iters_per_group, r.sde_window_seed)
        kind = "window" if mix is not None else r.selection
        if self.algorithm.name == "diffusion_nft" and kind == "first_k":
            kind = "random_k"  # verl-omni trains a random subset of each sample's rollout timesteps
        return StepSelection(kind,
                             k=None if r.timestep_fraction is not None else r.train_steps,
                             timestep_fraction=r.timestep_fraction, window_start=r.window_start,
                             window_range=tuple(r.window_range) if r.window_range is not None else None, mix=mix)

    def sde_type(self) -> str:
        """The rollout's SDE: the one ``algorithm.name`` fixes (flow_grpo, dance_grpo, cps), else
        ``rollout.sde_type`` (``validate`` refuses the two disagreeing)."""
        algo = ALGORITHMS.get(self.algorithm.name) if isinstance(self.algorithm.name, str) else None
        return algo.sde if algo is not None and algo.sde is not None else self.rollout.sde_type

    def sampler_spec(self) -> SamplerSpec:
        """The rollout's sampling, as plain numbers (no torch: what the checks and plans read)."""
        from verl_digen.algo.sampling import SamplerSpec

        r = self.rollout
        sde = self.sde_type()
        return SamplerSpec(num_steps=r.num_steps, shift=r.shift, sde=sde, eta=r.noise_level,
                           guidance_scale=r.guidance_scale, selection=self.step_selection(),
                           shared_group_noise=r.shared_group_noise, decode=True,
                           log_prob=r.cps_log_prob if sde == "cps" else "gaussian",
                           clean_only=self.algorithm.name == "diffusion_nft")

    def sampler(self) -> SamplerConfig:
        from verl_digen.rollout.sampler import SamplerConfig

        return SamplerConfig.of(self.sampler_spec())

    def nft(self):
        """DiffusionNFT's settings (``algo.diffusion_nft.NFTConfig``), None under another algorithm."""
        if self.algorithm.name != "diffusion_nft":
            return None
        from verl_digen.algo.diffusion_nft import NFTConfig

        a, g = self.actor, self.algorithm
        return NFTConfig(mix_beta=a.mix_beta, adv_clip_max=a.adv_clip_max, adaptive_weight_min=a.adaptive_weight_min,
                         adv_mode=g.adv_mode, old_policy_decay_schedule=g.old_policy_decay_schedule,
                         old_policy_decay=g.old_policy_decay, old_policy_update_interval=g.old_policy_update_interval)

    def trained_steps(self) -> int:
        return self.sampler_spec().validate()

    def mini_batches(self) -> int:
        """Optimizer steps per global step: the batch's prompts over ``actor.ppo_mini_batch_size``."""
        size = self.actor.ppo_mini_batch_size
        return 1 if size is None else max(1, self.data.train_batch_size // size)

    def reward_spec(self) -> Any:
        """The workers' reward spec: the named reward or the weights, with the custom function put in, replaced
        by ``reward.functions`` when set, and the served judge's address given to every custom function."""
        if self.reward.weights:
            reward: Any = dict(self.reward.weights)
        elif self.reward.kwargs:
            reward = {"name": self.reward.name, **self.reward.kwargs}
        else:
            reward = self.reward.name
        from verl_digen.rewards.custom import with_custom_reward, with_served
        from verl_digen.rewards.functions import functions_spec

        files = {"train": self.data.train_files, "val": self.data.val_files}  # a per-sample function's rows
        reward = with_custom_reward(reward, self.custom_reward_function, files, self.data.prompt_key)
        if self.reward.functions:
            reward = functions_spec(dict(self.reward.functions), files, self.data.prompt_key)
        from verl_digen.config.judge import placement

        judge = placement(self)
        return with_served(reward, self.reward.served, judge.replicas if judge and judge.pooled else 0)

    def worker_config(self) -> WorkerConfig:
        from verl_digen.algo.loss import LossConfig
        from verl_digen.workers.config import ActorMemoryConfig, OptimConfig, PolicyConfig, WorkerConfig

        m, a = self.model, self.actor
        reward = self.reward_spec()
        return WorkerConfig(
            policy=PolicyConfig(arch=m.arch, pretrained=m.path, dtype=m.dtype, latent_size=m.latent_size,
                                latent_width=m.latent_width, num_frames=m.num_frames, seed=m.seed,
                                lora_rank=m.lora_rank, lora_alpha=m.lora_alpha,
                                lora_target_modules=tuple(m.target_modules) if m.target_modules else None),
            sampler=self.sampler(),
            loss=LossConfig(clip_range=a.clip_ratio, kl_coef=a.kl_coef, kl_dt_weighted=a.kl_dt_weighted,
                            recompute_old_log_prob=recompute_log_prob(self)[0], mode=loss_mode(self.algorithm.name),
                            kl_mask_threshold=a.kl_mask_threshold, add_kl_coefficient=a.add_kl_coefficient,
                            nft=self.nft()),
            optim=OptimConfig(lr=a.lr, weight_decay=a.weight_decay, grad_clip=a.grad_clip, ema_decay=a.ema_decay),
            memory=ActorMemoryConfig(param_dtype=a.param_dtype, reduce_dtype=a.reduce_dtype,
                                     master_dtype=master_dtype(self),
                                     activation_checkpointing=a.activation_checkpointing,
                                     param_offload=a.param_offload, optimizer_offload=a.optimizer_offload),
            reward=reward,
            tsp_degree=self.digen.tsp.degree,
            rows_per_pass=self.digen.tsp.rows_per_pass,
            sequence_parallel=a.ulysses_sequence_parallel_size,
            seed=self.trainer.seed,
            device=self.trainer.device,
            sync_backend=self.digen.sync.backend,
            sync_bucket_mb=self.digen.sync.bucket_mb,
            sync_verify_payload=self.digen.sync.verify_payload,
            rollout_backend=self.rollout.backend,
            vllm_pipeline=self.rollout.vllm_pipeline,
            vllm_max_batch=self.rollout.micro_batch_size,
            vllm_compile=self.rollout.vllm_compile,
            vllm_memory_fraction=self.rollout.vllm_memory_fraction,
        )

    def advantage(self) -> AdvantageConfig:
        from verl_digen.algo.advantages import AdvantageConfig

        g = self.algorithm
        return AdvantageConfig(std_scope=g.adv_std, std_estimator=g.std_estimator, eps=g.adv_eps, clip=g.adv_clip,
                               drop_zero_groups=g.drop_zero_groups, keep_extremes=g.keep_extremes)

    def schedule_config(self, steps: int | None = None) -> ScheduleConfig:
        d = self.digen
        return ScheduleConfig(
            prompts=self.data.train_batch_size, group_size=self.rollout.n,
            mb_size=self.rollout.micro_batch_size, steps=steps or self.trainer.total_steps,
            mode=self.trainer.mode,
            # colocated has no pipeline: its micro-batch layout is irrelevant, so never reject it
            partition="gap" if d.gap.enable or self.trainer.mode == COLOCATED else "batch",
            tsp_degree=d.tsp.degree or self.trained_steps(),
            rows_per_pass=d.tsp.rows_per_pass,
            policy=d.tag.policy if self.trainer.mode == DIGEN else "never",
            staleness=d.tcss.staleness,  # the scheduler refuses TCSS outside digen
            update=d.update,
            update_units=d.update_units,
            mini_batches=self.mini_batches(),
            recompute=behaviour_forward(self),
            row_forwards=row_forwards(self),
        )


#: what each mode's config group (``trainer=<mode>``) sets on top of the dataclass defaults above, which
#: are ``digen``'s. The dataclasses and this table are the only place a default is written: the YAML in
#: ``verl_digen/config/`` is generated from them (``python -m verl_digen.config.generate``).
MODE_DEFAULTS: dict[str, dict[str, Any]] = {
    DIGEN: {},
    COLOCATED: {"digen.gap.enable": False, "digen.tsp.degree": 1, "digen.tag.policy": "never"},
    SEPARATE: {"digen.tsp.degree": 1, "digen.tag.policy": "never"},
}


def master_dtype(cfg: RunConfig) -> str:
    """The dtype the trainer stores its weights, gradients and AdamW state in: ``actor.master_dtype``
    when set; else float32 for a full fine-tune of a 16-bit model (fp32 masters, 16-bit compute, as
    verl's FSDP actor keeps them), else ``model.dtype`` (LoRA: the frozen base stays in its dtype)."""
    a, m = cfg.actor, cfg.model
    if a.master_dtype is not None:
        return a.master_dtype
    if m.lora_rank == 0 and BYTES.get(m.dtype, 4) < 4:
        return "float32"
    return m.dtype


def behaviour_forward(cfg: RunConfig) -> bool:
    """Whether mini-batches after the first take a no-grad forward of the step's starting weights: for the
    recomputed old log-probs, or for GRPO-Guard's / Flow-DPPO's old transition mean."""
    return recompute_log_prob(cfg)[0] or loss_mode(cfg.algorithm.name) in ("grpo_guard", "flow_dppo")


def row_forwards(cfg: RunConfig) -> int:
    """No-grad forwards each trained row takes beside its training pass: DiffusionNFT's old copy's, and its
    reference's when ``actor.kl_coef`` > 0 (``tsp._nft_rows_loss``)."""
    if cfg.algorithm.name != "diffusion_nft":
        return 0
    return 1 + (cfg.actor.kl_coef > 0)


def recompute_log_prob(cfg: RunConfig) -> tuple[bool, str]:
    """Whether the trainer takes the ratio's old log-probs as its own (``actor.recompute_log_prob``), and why.

    ``auto`` turns it on where the rollout's numbers can differ from the trainer's for the same weights:
    another engine (vLLM-Omni) or another compute dtype (``actor.param_dtype``). Never under TCSS: a stale
    row's ratio against its rollout log-prob is its importance correction, which the trainer's own would drop.
    """
    choice = str(cfg.actor.recompute_log_prob).lower()
    if choice != "auto":
        return choice == "true", f"actor.recompute_log_prob={choice}"
    if cfg.algorithm.name == "diffusion_nft":
        return False, "auto: DiffusionNFT's rollout has no log-probs"
    if cfg.digen.tcss.staleness > 0:
        return False, "auto: off under TCSS (stale rows keep their rollout log-probs)"
    if cfg.rollout.backend != "diffusers":
        return True, f"auto: the rollout engine ({cfg.rollout.backend}) is not the trainer's"
    compute = cfg.actor.param_dtype or cfg.model.dtype
    if compute != cfg.model.dtype:
        return True, f"auto: the rollout computes in {cfg.model.dtype}, the trainer in {compute}"
    return False, "auto: rollout and trainer share engine and dtype"


def log_format(cfg: RunConfig) -> str:
    """The console's per-step format: ``trainer.log_format``, or for ``auto`` a block on a terminal and one
    line per step otherwise (a cluster job's log file)."""
    if cfg.trainer.log_format != "auto":
        return cfg.trainer.log_format
    return "block" if sys.stdout.isatty() else "line"


def get_key(cfg: Any, dotted: str) -> Any:
    """The value at a dotted config key (``get_key(cfg, "digen.tsp.degree")``)."""
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def defaults(mode: str = DIGEN) -> RunConfig:
    """The config ``trainer=<mode>`` composes to without overrides: ``RunConfig()`` plus ``MODE_DEFAULTS``."""
    if mode not in MODE_DEFAULTS:
        raise ConfigError("trainer.mode", mode, f"one of {', '.join(MODE_DEFAULTS)}")
    cfg = RunConfig()
    cfg.trainer.mode = mode
    for dotted, value in MODE_DEFAULTS[mode].items():
        parent, _, leaf = dotted.rpartition(".")
        node = get_key(cfg, parent)
        if not hasattr(node, leaf):
            raise AttributeError(f"MODE_DEFAULTS[{mode!r}] names {dotted}, which RunConfig lacks")
        setattr(node, leaf, value)
    return cfg


#: ``ScheduleConfig`` field -> the config key that sets it (``RunConfig.schedule_config``): a scheduler
#: error is reported under that key. ``digen.gap.enable`` picks the partition, whose layout errors are the
#: micro-batch size's; ``train_loop`` is not set from the config.
SCHEDULE_KEYS: dict[str, str] = {
    "prompts": "data.train_batch_size", "group_size": "rollout.n", "mb_size": "rollout.micro_batch_size",
    "steps": "trainer.total_steps", "mode": "trainer.mode", "partition": "digen.gap.enable",
    "tsp_degree": "digen.tsp.degree", "policy": "digen.tag.policy", "staleness": "digen.tcss.staleness",
    "update": "digen.update", "rows_per_pass": "digen.tsp.rows_per_pass", "update_units": "digen.update_units",
    "mini_batches": "actor.ppo_mini_batch_size", "recompute": "actor.recompute_log_prob",
    "row_forwards": "algorithm.name",
}


def checked_schedule_config(cfg: RunConfig) -> ScheduleConfig:
    """``cfg.schedule_config()``, with a scheduler error re-raised as a ``ConfigError`` naming the config key
    that set the bad field (``SCHEDULE_KEYS``) and its value there."""
    try:
        sched = cfg.schedule_config()
        if cfg.trainer.mode != COLOCATED:
            sched.check_update_units(cfg.resources.generator.workers)
        return sched
    except ScheduleConfigError as err:
        key = SCHEDULE_KEYS.get(err.field)
        if key is None:  # a field the config does not set: a bug here, not a user error
            raise
        raise ConfigError(key, get_key(cfg, key), err.expected) from None


#: verl's names of keys verl-digen calls otherwise: an override that uses one is answered with ours
VERL_NAMES = {"trainer.total_training_steps": "trainer.total_steps"}


def config_keys(node: Any = None, prefix: str = "") -> list[str]:
    """Every dotted key of the run config (``RunConfig`` by default)."""
    node = RunConfig() if node is None else node
    out = []
    for f in fields(node):
        value = getattr(node, f.name)
        key = f"{prefix}{f.name}"
        out += config_keys(value, key + ".") if is_dataclass(value) else [key]
    return out


def unknown_key(key: str) -> str:
    """What to say about ``key``, which the config does not have: verl's name for one of ours, or the
    nearest keys."""
    if key in VERL_NAMES:
        return f"verl-digen's name for it, {VERL_NAMES[key]} (verl's {key} is not read)"
    close = difflib.get_close_matches(key, config_keys(), n=2, cutoff=0.8)
    return "a key of the config (docs/config.md)" + (f"; did you mean {' or '.join(close)}?" if close else "")


@functools.cache
def _schema() -> DictConfig:
    """``RunConfig`` as an OmegaConf schema, built once per process: building it was two thirds of ``load`` (26 of
    38 ms), and ``OmegaConf.merge`` copies its first argument, so every merge starts from the same clean schema."""
    return OmegaConf.structured(RunConfig)


def load(cfg: DictConfig | dict) -> RunConfig:
    """Merge a Hydra/OmegaConf config onto the schema: unknown keys and wrong types name themselves."""
    try:
        merged = OmegaConf.merge(_schema(), cfg)
    except ConfigKeyError as err:  # a key the schema lacks: ours for verl's name, or the nearest keys
        key = getattr(err, "full_key", "?") or "?"
        value = OmegaConf.select(cfg, key, default=None) if isinstance(cfg, DictConfig) else None
        raise ConfigError(key, value, unknown_key(key)) from None
    except Exception as err:  # omegaconf's message names full_key, value and expected type
        raise ConfigError(getattr(err, "full_key", "?") or "?", getattr(err, "value", None),
                          f"a valid value ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    return OmegaConf.to_object(merged)


def compose(overrides: list[str] | None = None, config_name: str = "digen", config_dir: str | None = None) -> RunConfig:
    """The packaged Hydra config (or ``config_name`` in ``config_dir``, e.g. a recipe) with ``overrides``
    applied (for Python callers, tests, recipes and ``digen plan``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir, initialize_config_module

    init = (initialize_config_module("verl_digen.config", version_base=None) if config_dir is None
            else initialize_config_dir(str(config_dir), version_base=None))
    with init:
        return load(hydra_compose(config_name, overrides=list(overrides or [])))
