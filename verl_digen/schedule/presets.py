"""Presets for the paper's settings, with stage times *derived* (not fitted) from public facts.

Each preset = a DiT (parameters, blocks, width, tokens), a workload (sampling steps T, trained
fraction, resolution, batch), a GPU type (dense BF16 TFLOP/s, collective and network bandwidth) and a
handful of efficiency assumptions (MFU of sampling and of training, FSDP overlap). The arithmetic is
in :func:`derive`; docs/simulator.md walks through it and lists every assumption. A preset is just a
:class:`CostModel` + :class:`Workload`; ``digen simulate --dump-profile`` writes it in the profile
format so measured numbers can replace the derived ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from verl_digen import archs

from . import ledger
from .costs import Affine, BaselineCosts, CostModel, Hardware, Pool, trained_steps
from .fabric import Fabric
from .profile_io import Workload, load


@dataclass(frozen=True)
class Gpu:
    """One GPU class: peak, host link, and the efficiency curve of a DiT forward on it.

    MFU as a function of the tokens one forward processes on one GPU: ``mfu_max * t / (t + tokens_half)``
    (small forwards are launch- and weight-read-bound). It makes a forward's time affine in its tokens,
    ``(t + tokens_half) * flops_per_token / (peak * mfu_max)``, which is the profile format's
    ``fixed + per_unit * units``. The two defaults are fit to two H200/H800 figures of verl-omni
    (:func:`.calibration.fit_efficiency`, docs/calibration.md) and assumed for the other GPU classes.
    """

    name: str
    dense_tflops: float  # BF16 dense peak
    host_gbs: float = 25.0  # PCIe host<->device (optimizer-state offload, rollout engine sleep/wake)
    mfu_max: float = 0.66  # large-forward MFU of a DiT (sampling and training alike); fit, see below
    tokens_half: float = 685.0  # tokens per forward at which MFU is half of mfu_max; fit, see below
    memory_gb: float | None = None  # memory of one GPU (datasheet GB, counted as GiB): the memory plan's capacity

    def mfu(self, tokens: float) -> float:
        return self.mfu_max * tokens / (tokens + self.tokens_half)


@dataclass(frozen=True)
class Testbed:
    """A GPU class in its nodes: what the pools of a preset are made of."""

    gpu: Gpu
    fabric: Fabric


# Paper testbeds (seeds text, section 5.1; public-numbers.md). One NIC per node as stated ("200 Gb/s",
# "400 Gb/s"); intra-node: A and C are PCIe cards, B is NVLink. The dense figures: docs/calibration.md.
# Memory per GPU as the testbeds state it (48 GB: L40S / L20 class; 80 GB: H100 / H800 SXM; 96 GB: H20 class):
# every dry run of a preset checks its memory plan against it (config/memory.py).
GPU_A = Gpu("A: 48GB, 155 TF dense", 154.9, memory_gb=48.0)  # quoted 309.7 TF is with sparsity
GPU_B = Gpu("B: 80GB, 990 TF dense", 989.5, memory_gb=80.0)  # quoted 1,979 TF is with sparsity
GPU_C = Gpu("C: 96GB, 504 TF", 503.8, memory_gb=96.0)
TESTBED_A = Testbed(GPU_A, Fabric(gpus_per_node=8, intra_gbs=12.0, nic_gbs=25.0))
TESTBED_B = Testbed(GPU_B, Fabric(gpus_per_node=8, intra_gbs=150.0, nic_gbs=50.0))
TESTBED_C = Testbed(GPU_C, Fabric(gpus_per_node=8, intra_gbs=25.0, nic_gbs=25.0))


@dataclass(frozen=True)
class DiT:
    name: str
    params_b: float  # billions
    blocks: int
    hidden: int
    text_tokens: int
    cfg_passes: int  # transformer passes per sampling step (2 with classifier-free guidance)
    video: bool

    @classmethod
    def of(cls, facts: archs.ArchFacts) -> DiT:
        """The released transformer of an architecture, as its facts size it (``ArchFacts.cost``)."""
        c = facts.cost
        if c is None:
            raise ValueError(f"architecture {facts.name!r} declares no cost-model sizes (ArchFacts.cost)")
        return cls(c.name, c.params_b, c.blocks, c.hidden, c.text_tokens, facts.cfg_passes, facts.video)


# the sizes are each architecture's facts (verl_digen/archs.py)
FLUX = DiT.of(archs.FLUX)  # guidance-distilled: one pass
QWEN_IMAGE = DiT.of(archs.QWEN_IMAGE)
WAN = DiT.of(archs.WAN)  # text enters by cross-attention only
HUNYUAN = DiT.of(archs.HUNYUAN_VIDEO)  # embedded guidance: one pass


@dataclass(frozen=True)
class Setting:
    """The workload of a preset: sampling, what is trained, and how."""

    sampling_steps: int = 20
    timestep_fraction: float = 0.6
    height: int = 512
    width: int = 512
    frames: int = 1
    keep_fraction: float = 1.0  # best-of-N: share of generated samples that are trained
    trained_k: int | None = None  # K trained steps when fixed (an SDE window, a set k); else int(T x fraction)
    train_cfg: bool = False  # the trained log-prob uses the guided velocity: CFG passes in training too
    activation_checkpointing: bool = True  # a training row re-runs its forward in the backward
    lora: bool = False  # LoRA: no weight gradients for the base (backward ~ one forward), tiny state
    reward_params_b: float = 8.0  # Qwen3-VL-8B-class scorer
    sequence_parallel: int = 1  # trainer GPUs per Ulysses group (actor.ulysses_sequence_parallel_size)

    def trained(self) -> int:
        return self.trained_k or trained_steps(self.sampling_steps, self.timestep_fraction)


# efficiency assumptions (docs/calibration.md)
MFU_SCORE = 0.30
CALL_OVERHEAD_S = {False: 0.5, True: 1.5}  # per sampling call: text encoding, scheduler setup
DECODE_SHARE = {False: 0.03, True: 0.10}  # VAE decode relative to the denoising loop
SCORE_DECODE_S = 0.1  # a short generated answer from the VLM scorer
PASS_LAUNCH_S = 0.05  # per training pass: optimizer hooks, launches, data movement
ALL_TO_ALLS = 4  # per attention with Ulysses: q, k and v to heads-sharded, the output back to tokens-sharded
STATE_BYTES = 12  # fp32 master weights + Adam moments per parameter
# the weight-sync backend the presets price: the one built for 12-20B weights (device to device, in buckets,
# relayed; workers/sync.py), which the recipes ship
SYNC_BACKEND = "collective"
# A rollout engine's wake / sleep beyond moving its weights (memory pools, graph capture, cache
# set-up): software time no transfer predicts. Fit to verl-omni's hybrid-lending switch and reclaim
# (:func:`.calibration.fit_engine_switch`, one 5B point), assumed the same for every model size; it is
# likely to grow with the model, so for the larger recipes it prices the verl-omni baseline low.
ENGINE_WAKE_S = 7.86
ENGINE_SLEEP_S = 2.10
# A generator's vLLM-Omni engine start-up (rollout.backend=vllm), paid once per generator and again per generator
# restart: assumptions, not yet measured on a GPU (docs/benchmarks.md has the CPU tier's figures): the process,
# device context and the engine's warm-up request; the checkpoint (transformer, text encoders, VAE) read from
# local disk; its copy onto the device over the host link; with rollout.vllm_compile, regional compilation of
# the transformer's block types (identical blocks share one compiled graph)
ENGINE_START_FIXED_S = 30.0
ENGINE_DISK_GBS = 2.0
ENGINE_COMPILE_S = 60.0


@dataclass(frozen=True)
class EngineStartup:
    """What one engine start costs (seconds) and what the run pays for it (GPU-seconds)."""

    fixed_s: float
    read_s: float
    copy_s: float
    compile_s: float

    @property
    def seconds(self) -> float:
        return self.fixed_s + self.read_s + self.copy_s + self.compile_s

    def price(self, generators: int, restarts: int = 0) -> float:
        """GPU-seconds of engine starts: once per generator, again per generator restart."""
        if generators < 0 or restarts < 0:
            raise ValueError(f"generators ({generators}) and restarts ({restarts}) must be >= 0")
        return self.seconds * (generators + restarts)


def engine_startup(weight_bytes: float, host_gbs: float, compile: bool) -> EngineStartup:
    """The start-up of an engine that loads ``weight_bytes`` (transformer, text encoders and VAE): see the
    ``ENGINE_*`` assumptions above."""
    return EngineStartup(ENGINE_START_FIXED_S, weight_bytes / (ENGINE_DISK_GBS * 1e9), weight_bytes / (host_gbs * 1e9),
                         ENGINE_COMPILE_S if compile else 0.0)


def tokens(model: DiT, s: Setting) -> int:
    lat_t = 1 + (s.frames - 1) // 4 if model.video else 1  # causal 4x temporal VAE
    return lat_t * (s.height // 16) * (s.width // 16) + model.text_tokens  # 8x VAE, 2x2 patches


def forward_flops(model: DiT, s: Setting) -> float:
    L = tokens(model, s)
    return 2 * model.params_b * 1e9 * L + 4 * model.blocks * L * L * model.hidden


def hardware(model: DiT, s: Setting, bed: Testbed, fsdp_ranks: int, fabric: Fabric | None = None) -> Hardware:
    """Per-GPU costs of ``model`` under ``s`` on ``bed`` (training sharded over ``fsdp_ranks`` GPUs
    connected by ``fabric``, by default the testbed's)."""
    gpu, fabric = bed.gpu, fabric or bed.fabric
    L = tokens(model, s)
    per_token = forward_flops(model, s) / L / (gpu.dense_tflops * 1e12 * gpu.mfu_max)  # seconds at mfu_max
    decode = 1 + DECODE_SHARE[model.video]
    forwards = s.sampling_steps * model.cfg_passes  # CFG passes run as one forward of twice the tokens
    sample = Affine(CALL_OVERHEAD_S[model.video] + forwards * per_token * gpu.tokens_half * decode,
                    forwards * per_token * L * decode)
    frames = s.frames if model.video else 1
    score_tokens = 1300 * (min(frames, 8) if model.video else 1)  # image tokens + prompt per sample
    score = 2 * s.reward_params_b * 1e9 * score_tokens / (gpu.dense_tflops * 1e12 * MFU_SCORE) + SCORE_DECODE_S
    backward = 1 if s.lora else 2  # activation gradients only vs activation + weight gradients
    branches = model.cfg_passes if s.train_cfg else 1
    row_forwards = (1 + backward + s.activation_checkpointing) * branches
    comm = fabric.fsdp_pass(model.params_b * 1e9, fsdp_ranks, trainable=0.0 if s.lora else None)
    exposed = comm * 2 / model.blocks  # the first all-gather and the last reduce-scatter are not hidden
    # Ulysses (sequence_parallel P): a rank computes 1/P of each row's tokens, and every attention of the forward,
    # the backward and the recompute waits for its all-to-alls (4: q, k, v in, the output back) of its tokens
    sp = s.sequence_parallel
    a2a = ALL_TO_ALLS * model.blocks * (2 + s.activation_checkpointing) * branches * \
        fabric.all_to_all(L / sp * model.hidden * fabric.param_bytes, sp)
    train = Affine(PASS_LAUNCH_S + exposed + row_forwards * per_token * gpu.tokens_half,
                   row_forwards * per_token * L / sp + a2a, floor=comm + exposed + PASS_LAUNCH_S)
    return Hardware(name=gpu.name, generate=sample, score=Affine(0.2, score), train_pass=train)


def _slower(a: Fabric, b: Fabric) -> Fabric:
    return a if a.link_gbs(a.gpus_per_node + 1) <= b.link_gbs(b.gpus_per_node + 1) else b


def derive(model: DiT, s: Setting, gen: Testbed, train: Testbed, gen_workers: int, train_workers: int,
           fsdp_ranks: int | None = None) -> CostModel:
    """The cluster cost model of one preset (see module docstring). ``fsdp_ranks`` (default: the trainer
    pool) is the FSDP group training shards over: the whole cluster for the colocated baselines."""
    n = model.params_b * 1e9
    w = gen_workers + train_workers
    shard = fsdp_ranks or train_workers
    colo = _slower(gen.fabric, train.fabric)  # a ring over both pools crosses the slower network
    fab_t = train.fabric if fsdp_ranks is None else colo
    fab_g = gen.fabric if fsdp_ranks is None else colo
    engine_weights = fab_t.param_bytes * n / (train.gpu.host_gbs * 1e9)
    # publish, pickup and TAG switch are priced from the bytes the runtime's code moves (schedule/ledger.py,
    # the same formulas the workers' ledgers are tested against), over this cluster's links
    slower = _slower(gen.fabric, train.fabric)
    group = fab_t.shard_group(shard)
    links = ledger.Links(intra_gbs=slower.intra_gbs, inter_gbs=slower.nic_gbs, host_gbs=train.gpu.host_gbs,
                         gather_gbs=fab_t.link_gbs(group))
    weights = fab_t.param_bytes * n
    state = 0.0 if s.lora else STATE_BYTES * n / shard

    def switch(to_gen: bool) -> float:
        return ledger.price(ledger.switch_ledger(weights, state, group, to_gen, resident=True, on_gpu=True), links)
    return CostModel(
        generator=Pool(hardware(model, s, gen, fsdp_ranks or gen_workers, fab_g), gen_workers),
        trainer=Pool(hardware(model, s, train, shard, fab_t), train_workers),
        steps_trained=s.trained(),
        keep_fraction=s.keep_fraction,
        sequence_parallel=s.sequence_parallel,
        switch_to_gen=switch(True),
        switch_to_train=switch(False),
        optimizer_step=0.2 + 16 * n / shard / 1e12,  # sharded Adam at ~1 TB/s memory traffic
        # a generator on another node than the trainer ranks: the model once over the network
        weight_sync=ledger.price(ledger.pickup_ledger(weights, SYNC_BACKEND, inter_node=True, on_gpu=True), links),
        publish=ledger.price(ledger.publish_ledger(weights, group, SYNC_BACKEND, on_gpu=True), links),
        baselines=BaselineCosts(
            shard_gather=colo.gather_full(n, w),
            sampling_forwards=s.sampling_steps * model.cfg_passes,
            rollout_wake=engine_weights + ENGINE_WAKE_S,
            rollout_sleep=engine_weights + ENGINE_SLEEP_S,
        ),
        resize=lambda g, r, f=None: derive(model, s, gen, train, g, r, f),
    )


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    model: CostModel
    workload: Workload
    spec: PresetSpec | None = None  # what it was derived from (to vary the setting: :meth:`PresetSpec.build`)


@dataclass(frozen=True)
class PresetSpec:
    """The facts a preset is derived from; ``build`` varies the setting (sampling steps, fraction, ...)."""

    name: str
    description: str
    model: DiT
    setting: Setting
    gen: Testbed
    train: Testbed
    gen_workers: int
    train_workers: int
    tsp_degree: int

    def build(self, fabric: dict | None = None, **setting: object) -> Preset:
        """The preset, with ``setting`` fields (``sampling_steps=30``, ...) and ``fabric`` fields
        (``nics_per_node=8``, ``sharding="hybrid"``, ...) of both pools' testbeds replaced."""
        s = replace(self.setting, **setting)
        gen, train = self.gen, self.train
        if fabric:
            gen = replace(gen, fabric=replace(gen.fabric, **fabric))
            train = replace(train, fabric=replace(train.fabric, **fabric))
        tsp = min(self.tsp_degree, s.trained())
        wl = Workload(prompts=4, group_size=8, mb_size=1, tsp_degree=tsp, staleness=0.25, steps=4, policy="bts")
        model = derive(self.model, s, gen, train, self.gen_workers, self.train_workers)
        return Preset(self.name, self.description, model, wl, replace(self, setting=s, gen=gen, train=train))

    @property
    def heterogeneous(self) -> bool:
        return self.gen != self.train


IMAGE = Setting(sampling_steps=16, timestep_fraction=0.6)  # DanceGRPO FLUX
QWEN = Setting(sampling_steps=10, timestep_fraction=0.6, train_cfg=True)  # FlowGRPO, CFG in the trained log-prob
VIDEO_WAN = Setting(sampling_steps=20, timestep_fraction=0.6, height=352, width=352, frames=25, train_cfg=True)
VIDEO_HUNYUAN = Setting(sampling_steps=20, timestep_fraction=0.6, height=352, width=352, frames=25)
# Wan2.1 at its release resolution, 1280x720x81 (75,600 tokens a sample): one trained row's activations are
# ~80 GiB, so the trainer cuts every row over 4 GPUs (Ulysses); 2 of 20 steps trained, as SDE-window recipes do
VIDEO_WAN_720P = Setting(sampling_steps=20, timestep_fraction=0.1, height=720, width=1280, frames=81, train_cfg=True,
                         sequence_parallel=4)


def _specs() -> dict[str, PresetSpec]:  # pragma: no mutate block (constant table)
    out: dict[str, PresetSpec] = {}

    def add(name: str, desc: str, model: DiT, s: Setting, gg: Testbed, tg: Testbed, g: int, r: int,
            tsp: int) -> None:
        out[name] = PresetSpec(name, desc, model, s, gg, tg, g, r, tsp)

    for gpus in (16, 32):
        half = gpus // 2
        add(f"flux-12b-{gpus}", f"FLUX.1-12B DanceGRPO 512px, T=16, fraction 0.6, {gpus} x testbed A",
            FLUX, IMAGE, TESTBED_A, TESTBED_A, half, half, 10)
        add(f"qwen-image-20b-{gpus}", f"Qwen-Image-20B FlowGRPO 512px, T=10, CFG, {gpus} x testbed B",
            QWEN_IMAGE, QWEN, TESTBED_B, TESTBED_B, half, half, 6)
        add(f"wan2.1-14b-{gpus}", f"Wan2.1-14B FlowGRPO 352x352x25, T=20, fraction 0.6, {gpus} x testbed B",
            WAN, VIDEO_WAN, TESTBED_B, TESTBED_B, half, half, 4)
        add(f"hunyuanvideo-13b-{gpus}", f"HunyuanVideo-13B DanceGRPO 352x352x25, T=20, fraction 0.6, {gpus} x A",
            HUNYUAN, VIDEO_HUNYUAN, TESTBED_A, TESTBED_A, half, half, 4)
    add("wan2.1-14b-720p-32", "Wan2.1-14B FlowGRPO 1280x720x81, T=20, 2 trained steps, Ulysses 4, 32 x testbed B",
        WAN, VIDEO_WAN_720P, TESTBED_B, TESTBED_B, 8, 24, 2)
    add("hunyuanvideo-13b-hetero", "HunyuanVideo-13B, 8 x A (48 GB) generate + 8 x C (96 GB) train",
        HUNYUAN, VIDEO_HUNYUAN, TESTBED_A, TESTBED_C, 8, 8, 4)
    return out


SPECS = _specs()
PRESETS = {name: spec.build() for name, spec in SPECS.items()}


def names() -> list[str]:
    return sorted(PRESETS)


def get(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(names())}") from None


def resolve(spec: str) -> tuple[str, CostModel, Workload | None, PresetSpec | None]:
    """A preset name or a profile file -> (name, cost model, workload, preset spec or None); the one
    place both spellings are understood (``digen simulate/plan``, ``digen.profile``)."""
    if spec in PRESETS:
        p = PRESETS[spec]
        return p.name, p.model, p.workload, p.spec
    if Path(spec).is_file():
        model, wl = load(spec)
        return spec, model, wl, None
    raise ValueError(f"{spec!r} is neither a preset ({', '.join(names())}) nor a profile file")
