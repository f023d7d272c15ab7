"""Presets for the paper's settings, with stage times *derived* (not fitted) from public facts.

Each preset = a DiT (parameters, blocks, width, tokens), a workload (sampling steps T, trained
fraction, resolution, batch), a GPU type (dense BF16 TFLOP/s, collective and network bandwidth) and a
handful of efficiency assumptions (MFU of sampling and of training, FSDP overlap). The arithmetic is
in :func:`derive`; docs/simulator.md walks through it and lists every assumption. A preset is just a
:class:`CostModel` + :class:`Workload`; ``digen simulate --dump-profile`` writes it in the profile
format so measured numbers can replace the derived ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from .costs import Affine, CostModel, Hardware, Pool
from .profile_io import Workload


@dataclass(frozen=True)
class Gpu:
    name: str
    dense_tflops: float  # BF16 dense peak
    collective_gbs: float  # effective per-GPU all-gather/reduce-scatter bandwidth inside a pool (GB/s)
    host_gbs: float = 25.0  # PCIe host<->device (optimizer-state offload for the TAG switch)


# Paper testbeds (seeds text, section 5.1; see docs/simulator.md for the dense figures)
TESTBED_A = Gpu("A: 48GB, 155 TF dense", 154.9, collective_gbs=12.0)  # quoted 309.7 TF is with sparsity
TESTBED_B = Gpu("B: 80GB, 990 TF dense", 989.5, collective_gbs=150.0)  # quoted 1,979 TF is with sparsity
TESTBED_C = Gpu("C: 96GB, 504 TF", 503.8, collective_gbs=25.0)


@dataclass(frozen=True)
class DiT:
    name: str
    params_b: float  # billions
    blocks: int
    hidden: int
    text_tokens: int
    cfg_passes: int  # transformer passes per sampling step (2 with classifier-free guidance)
    video: bool


FLUX = DiT("FLUX.1-12B", 12.0, 57, 3072, 512, 1, False)  # guidance-distilled: one pass
QWEN_IMAGE = DiT("Qwen-Image-20B", 20.0, 60, 3072, 256, 2, False)
WAN = DiT("Wan2.1-14B", 14.0, 40, 5120, 0, 2, True)  # text enters by cross-attention only
HUNYUAN = DiT("HunyuanVideo-13B", 13.0, 60, 3072, 256, 1, True)  # embedded guidance: one pass


@dataclass(frozen=True)
class Setting:
    sampling_steps: int = 20
    timestep_fraction: float = 0.6
    height: int = 512
    width: int = 512
    frames: int = 1
    keep_fraction: float = 1.0
    reward_params_b: float = 8.0  # Qwen3-VL-8B-class scorer
    network_gbs: float = 25.0  # inter-pool link (200 Gb/s); weight sync goes over it


# efficiency assumptions (docs/simulator.md, "Assumptions")
MFU_SAMPLE_IMAGE = 0.35
MFU_SAMPLE_VIDEO = 0.45
MFU_TRAIN = 0.40
MFU_SCORE = 0.30
FSDP_EXPOSED = 0.3  # share of per-pass FSDP traffic not hidden behind compute
CALL_OVERHEAD_S = {False: 0.5, True: 1.5}  # per sampling call: text encoding, scheduler setup
DECODE_SHARE = {False: 0.03, True: 0.10}  # VAE decode relative to the denoising loop
SCORE_DECODE_S = 0.1  # a short generated answer from the VLM scorer


def tokens(model: DiT, s: Setting) -> int:
    lat_t = 1 + (s.frames - 1) // 4 if model.video else 1  # causal 4x temporal VAE
    return lat_t * (s.height // 16) * (s.width // 16) + model.text_tokens  # 8x VAE, 2x2 patches


def forward_flops(model: DiT, s: Setting) -> float:
    L = tokens(model, s)
    return 2 * model.params_b * 1e9 * L + 4 * model.blocks * L * L * model.hidden


def hardware(model: DiT, s: Setting, gpu: Gpu, fsdp_ranks: int) -> Hardware:
    """Per-GPU affine costs of ``model`` under ``s`` on ``gpu`` (training sharded over fsdp_ranks)."""
    fwd = forward_flops(model, s)
    peak = gpu.dense_tflops * 1e12
    mfu_s = MFU_SAMPLE_VIDEO if model.video else MFU_SAMPLE_IMAGE
    sample = s.sampling_steps * model.cfg_passes * fwd / (peak * mfu_s) * (1 + DECODE_SHARE[model.video])
    frames = s.frames if model.video else 1
    score_tokens = 1300 * (min(frames, 8) if model.video else 1)  # image tokens + prompt per sample
    score = 2 * s.reward_params_b * 1e9 * score_tokens / (peak * MFU_SCORE) + SCORE_DECODE_S
    row = 4 * fwd / (peak * MFU_TRAIN)  # forward + backward (2x) + activation recompute
    param_bytes = 2 * model.params_b * 1e9
    fsdp = 3 * param_bytes * (fsdp_ranks - 1) / fsdp_ranks / (gpu.collective_gbs * 1e9) * FSDP_EXPOSED
    return Hardware(
        name=gpu.name,
        generate=Affine(CALL_OVERHEAD_S[model.video], sample),
        score=Affine(0.2, score),
        train_pass=Affine(fsdp, row),
    )


def derive(model: DiT, s: Setting, gen_gpu: Gpu, train_gpu: Gpu, gen_workers: int, train_workers: int) -> CostModel:
    """The cluster cost model of one preset (see module docstring)."""
    n = model.params_b * 1e9
    k = max(1, round(s.sampling_steps * s.timestep_fraction))
    opt_state = 12 * n / train_workers  # fp32 master + Adam moments, sharded
    offload = opt_state / (train_gpu.host_gbs * 1e9)
    # TAG: every trainer rank all-gathers the full bf16 weights once per switch (its own generator copy)
    gather = 2 * n * (train_workers - 1) / train_workers / (train_gpu.collective_gbs * 1e9)
    return CostModel(
        generator=Pool(hardware(model, s, gen_gpu, train_workers), gen_workers),
        trainer=Pool(hardware(model, s, train_gpu, train_workers), train_workers),
        steps_trained=k,
        keep_fraction=s.keep_fraction,
        switch_to_gen=offload + gather,
        switch_to_train=offload,
        optimizer_step=0.2 + 16 * n / train_workers / 1e12,  # sharded Adam at ~1 TB/s memory traffic
        weight_sync=1.5 * 2 * n / (s.network_gbs * 1e9),  # one generator fetches bf16 weights, 1.5x protocol
        publish=gather + 2 * n / (train_gpu.host_gbs * 1e9),  # gather once, copy to host for the store
    )


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    model: CostModel
    workload: Workload


IMAGE = Setting(sampling_steps=16, timestep_fraction=0.6)
QWEN = Setting(sampling_steps=10, timestep_fraction=0.6, network_gbs=50.0)  # testbed B: 400 Gb/s
VIDEO = Setting(sampling_steps=20, timestep_fraction=0.6, height=352, width=352, frames=25)
VIDEO_B = Setting(sampling_steps=20, timestep_fraction=0.6, height=352, width=352, frames=25, network_gbs=50.0)
HUNYUAN_SETTING = Setting(sampling_steps=20, timestep_fraction=0.6, height=352, width=352, frames=25,
                          keep_fraction=1.0)


def _presets() -> dict[str, Preset]:
    out: dict[str, Preset] = {}

    def add(name: str, desc: str, model: DiT, s: Setting, gg: Gpu, tg: Gpu, g: int, r: int, tsp: int) -> None:
        wl = Workload(prompts=4, group_size=8, mb_size=1, tsp_degree=tsp, staleness=0.25, steps=4, policy="bts")
        out[name] = Preset(name, desc, derive(model, s, gg, tg, g, r), wl)

    for gpus in (16, 32):
        half = gpus // 2
        add(f"flux-12b-{gpus}", f"FLUX.1-12B DanceGRPO 512px, T=16, fraction 0.6, {gpus} x testbed A",
            FLUX, IMAGE, TESTBED_A, TESTBED_A, half, half, 10)
        add(f"qwen-image-20b-{gpus}", f"Qwen-Image-20B FlowGRPO 512px, T=10, CFG, {gpus} x testbed B",
            QWEN_IMAGE, QWEN, TESTBED_B, TESTBED_B, half, half, 6)
        add(f"wan2.1-14b-{gpus}", f"Wan2.1-14B FlowGRPO 352x352x25, T=20, fraction 0.6, {gpus} x testbed B",
            WAN, VIDEO_B, TESTBED_B, TESTBED_B, half, half, 4)
        add(f"hunyuanvideo-13b-{gpus}", f"HunyuanVideo-13B DanceGRPO 352x352x25, T=20, fraction 0.6, {gpus} x A",
            HUNYUAN, HUNYUAN_SETTING, TESTBED_A, TESTBED_A, half, half, 4)
    add("hunyuanvideo-13b-hetero", "HunyuanVideo-13B, 8 x A (48 GB) generate + 8 x C (96 GB) train",
        HUNYUAN, HUNYUAN_SETTING, TESTBED_A, TESTBED_C, 8, 8, 4)
    return out


PRESETS = _presets()


def names() -> list[str]:
    return sorted(PRESETS)


def get(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(names())}") from None
