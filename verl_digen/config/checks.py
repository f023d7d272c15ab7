"""The parts of ``validate`` that look past a value's type: finiteness and signs of the floats, pool
sizes against what one machine can hold, and the filesystem (output dirs written to by a probe file,
prompt files read, checkpoints and their ownership, the config a resume continues).

Why here and not at run time: each of these used to fail after Ray and the workers had started (or
never failed: a NaN learning rate trained NaN weights). Every error is a ``ConfigError`` naming the
key, the value and what is allowed; docs/config.md's "Bad input" table lists them, one test each.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from verl_digen import archs
from verl_digen.archs import ARCHS, arch_facts, canonical_arch
from verl_digen.config.errors import ConfigError
from verl_digen.config.schema import get_key
from verl_digen.schedule.config import COLOCATED

#: absolute upper bound of one pool (a typo guard: 1000 workers spawned ~100 processes before failing)
MAX_POOL_WORKERS = 4096
#: what one tiny CPU worker process takes (measured ~0.5 GB): the local CPU limit is RAM / this
CPU_WORKER_BYTES = 512 * 2**20
NONFINITE_ACTIONS = ("skip", "stop")
#: upper bounds past which a value is a typo, not a workload (each refused with its reason)
MAX_GROUP = 1024  # rollout.n
MAX_SAMPLING_STEPS = 1000  # rollout.num_steps
MAX_LATENT = 512  # model.latent_size (latents per side)
MAX_LR = 1.0  # actor.lr
MAX_SEED = 2**64 - 1  # trainer.seed, model.seed: torch.manual_seed's range
#: room left in a path for what the run writes under an output dir (global_step_<N>/rng_rank<r>.pt.xxh3, ...)
PATH_ROOM = 64
#: what the driver keeps per sample of a step (scheduler records, prompt, reward, metrics), measured
#: generously; with the trajectories (latents of every sampling step, float32) the step-size estimate
DRIVER_BYTES_PER_SAMPLE = 4096

#: the config a checkpoint records, checked on resume (changed keys are refused unless allowed)
RESUME_KEYS = (
    "model.arch", "model.path", "model.dtype", "model.latent_size", "model.latent_width", "model.num_frames",
    "model.seed",
    "model.lora_rank", "model.lora_alpha", "model.target_modules",
    "data.train_files", "data.train_batch_size", "data.synthetic_prompts",
    "rollout.n", "rollout.num_steps", "rollout.shift", "rollout.sde_type", "rollout.noise_level",
    "actor.lr", "actor.weight_decay", "actor.grad_clip", "actor.clip_ratio", "actor.kl_coef",
    "algorithm.adv_std", "reward.name", "reward.weights", "reward.kwargs", "trainer.seed",
)
#: keys that change which parameters are trained: a checkpoint cannot be loaded across them
STRUCTURAL_KEYS = ("model.arch", "model.lora_rank", "model.target_modules")


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(key: str, value: Any, lo: float, strict: bool, what: str = "", optional: bool = False) -> None:
    """``value`` must be a finite number > lo (``strict``) or >= lo."""
    if optional and value is None:
        return
    ok = _real(value) and math.isfinite(value) and (value > lo if strict else value >= lo)
    if not ok:
        rel = ">" if strict else ">="
        raise ConfigError(key, value, f"{'null or ' if optional else ''}a finite number {rel} {lo:g}{what}")


def numbers(cfg: Any) -> None:
    """Finiteness and sign of every float the run uses, the new trainer keys, and pool sizes."""
    a, g, r, m, t = cfg.actor, cfg.algorithm, cfg.rollout, cfg.model, cfg.trainer
    _finite("actor.lr", a.lr, 0, True)
    _finite("actor.weight_decay", a.weight_decay, 0, False)
    _finite("actor.grad_clip", a.grad_clip, 0, False, " (the max gradient norm; 0 turns clipping off)")
    _finite("actor.clip_ratio", a.clip_ratio, 0, True)
    _finite("actor.kl_coef", a.kl_coef, 0, False)
    if a.ema_decay is not None and not (_real(a.ema_decay) and 0 < a.ema_decay < 1):  # NaN fails it too
        raise ConfigError("actor.ema_decay", a.ema_decay, "null or a number in (0, 1) (the EMA's weight on its "
                          "past: 1 would never move it; Flow-GRPO uses 0.9)")
    _finite("algorithm.adv_eps", g.adv_eps, 0, True, " (added to the std: 0 divides by zero for equal rewards)")
    _finite("algorithm.adv_clip", g.adv_clip, 0, True, optional=True)
    _finite("rollout.shift", r.shift, 0, True, " (the sigma schedule's time shift)")
    _finite("rollout.noise_level", r.noise_level, 0, True, " (training needs stochastic steps)")
    _finite("rollout.guidance_scale", r.guidance_scale, 1, False, " (1 = no guidance)")
    tf = r.timestep_fraction
    if tf is not None and not (_real(tf) and 0 < tf <= 1):
        raise ConfigError("rollout.timestep_fraction", tf, "null or a fraction in (0, 1]")
    _finite("model.lora_alpha", m.lora_alpha, 0, True, " (null means the rank)", optional=True)
    tm = m.target_modules
    if tm is not None and (not tm or not all(isinstance(x, str) and x.strip() for x in tm)):
        raise ConfigError("model.target_modules", tm, "null or a non-empty list of module-name suffixes")
    for name, w in (cfg.reward.weights or {}).items():
        if not (_real(w) and math.isfinite(w) and w != 0):
            raise ConfigError(f"reward.weights.{name}", w, "a finite, non-zero weight (drop the reward instead of "
                              "weighting it 0)")
    if t.save_freq is None or isinstance(t.save_freq, bool):
        raise ConfigError("trainer.save_freq", t.save_freq, "an integer (<= 0 never saves)")
    if t.max_checkpoints is not None and not (isinstance(t.max_checkpoints, int) and t.max_checkpoints >= 1):
        raise ConfigError("trainer.max_checkpoints", t.max_checkpoints, "null (keep all) or an integer >= 1")
    if t.on_nonfinite not in NONFINITE_ACTIONS:
        raise ConfigError("trainer.on_nonfinite", t.on_nonfinite, f"one of {', '.join(NONFINITE_ACTIONS)}")
    if not (isinstance(t.max_nonfinite_steps, int) and t.max_nonfinite_steps >= 1):
        raise ConfigError("trainer.max_nonfinite_steps", t.max_nonfinite_steps, "an integer >= 1")
    _finite("trainer.stop_grace_s", t.stop_grace_s, 0, True, " (seconds; null always finishes the step)",
            optional=True)
    _finite("trainer.stall_timeout_s", t.stall_timeout_s, 0, True, " (seconds; null waits forever)", optional=True)
    if not (isinstance(t.generator_max_restarts, int) and not isinstance(t.generator_max_restarts, bool)
            and t.generator_max_restarts >= 0):
        raise ConfigError("trainer.generator_max_restarts", t.generator_max_restarts,
                          "an integer >= 0 (0: a dead generator ends the run)")
    _finite("trainer.action_timeout_factor", t.action_timeout_factor, 1, False,
            " (x the action's estimated seconds; null: no per-action timeout)", optional=True)
    _finite("trainer.action_timeout_min_s", t.action_timeout_min_s, 0, True, " (seconds)")
    for key in t.resume_allow_changes:
        if key not in RESUME_KEYS or key in STRUCTURAL_KEYS:
            allowed = [k for k in RESUME_KEYS if k not in STRUCTURAL_KEYS]
            raise ConfigError("trainer.resume_allow_changes", key, f"keys among {', '.join(allowed)} ("
                              f"{', '.join(STRUCTURAL_KEYS)} change the trained parameters and cannot be allowed)")
    if cfg.data.synthetic_prompts is None or not (isinstance(cfg.data.synthetic_prompts, int)
                                                  and cfg.data.synthetic_prompts >= 1):
        raise ConfigError("data.synthetic_prompts", cfg.data.synthetic_prompts, "an integer >= 1")
    for key, seed in (("trainer.seed", t.seed), ("model.seed", m.seed)):
        if not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED):
            raise ConfigError(key, seed, f"an integer in [0, 2^64 - 1] (torch's seed range; {MAX_SEED})")
    st = cfg.digen.tcss.staleness
    if not (_real(st) and math.isfinite(st) and 0 <= st <= 1):
        raise ConfigError("digen.tcss.staleness", st, "a fraction in [0, 1], finite (the share of a step's "
                          "micro-batches that may come from the previous policy version)")
    ke = g.keep_extremes
    if ke is not None and not (isinstance(ke, int) and not isinstance(ke, bool) and ke >= 2 and ke % 2 == 0):
        raise ConfigError("algorithm.keep_extremes", ke, "null or an even integer >= 2 (the top and bottom k/2 "
                          "samples of each group are kept)")
    _pools(cfg)


def latent_channels(cfg: Any) -> int:
    """Channels of the model's latent, as its facts declare them: the released VAE's, or the tiny one's."""
    if cfg.model.path is None:
        return archs.TINY_LATENT_CHANNELS
    return arch_facts(cfg.model.arch).pretrained.latent_channels


def step_bytes(cfg: Any) -> tuple[int, int]:
    """(driver bytes, trajectory bytes) one step holds at most, from the config alone: every sample's
    bookkeeping, and every sample's trajectory (the latent after each sampling step, float32) in the
    Update Queue at once, plus the TCSS share of the next step's."""
    m, r = cfg.model, cfg.rollout
    samples = cfg.data.train_batch_size * r.n
    height = m.latent_size if m.latent_size is not None else 64
    width = m.latent_width if m.latent_width is not None else height
    frames = (m.num_frames - 1) // 4 + 1 if m.num_frames else 1  # the video VAEs' 4x temporal compression
    per_sample = latent_channels(cfg) * height * width * frames * (r.num_steps + 1) * 4
    ahead = 1 + (cfg.digen.tcss.staleness or 0)
    return samples * DRIVER_BYTES_PER_SAMPLE, int(samples * ahead * per_sample)


def sizes(cfg: Any) -> None:
    """Upper bounds (a typo guard, each with its reason) and the step's memory from the config alone,
    before anything is allocated: the driver's bookkeeping against this machine's memory, and on a local
    CPU run (no ``RAY_ADDRESS``: the object store shares this machine) the trajectories too."""
    m, r = cfg.model, cfg.rollout
    if r.n > MAX_GROUP:
        raise ConfigError("rollout.n", r.n, f"a group size in [2, {MAX_GROUP}] (samples per prompt; GRPO recipes use "
                          "8-24, and a group's trajectories are held until its last sample is scored)")
    if r.num_steps > MAX_SAMPLING_STEPS:
        raise ConfigError("rollout.num_steps", r.num_steps,
                          f"at most {MAX_SAMPLING_STEPS} sampling steps (flow-matching "
                          "samplers use 10-50; each is a transformer forward per sample and a latent kept per step)")
    for key, side in (("model.latent_size", m.latent_size), ("model.latent_width", m.latent_width)):
        if side is not None and side > MAX_LATENT:
            raise ConfigError(key, side, f"an even number in [2, {MAX_LATENT}] (latents per side; "
                              f"{MAX_LATENT} is {MAX_LATENT * 8} px with the 8x VAEs)")
    if cfg.actor.lr > MAX_LR:
        raise ConfigError("actor.lr", cfg.actor.lr,
                          f"a number in (0, {MAX_LR:g}] (AdamW moves every weight by about lr "
                          "per step; diffusion RL fine-tuning uses 1e-6 to 1e-4)")
    driver, trajectories = step_bytes(cfg)
    ram = _ram_bytes()
    samples = cfg.data.train_batch_size * r.n
    if driver > ram // 2:
        raise ConfigError("data.train_batch_size", cfg.data.train_batch_size,
                          f"a batch whose step fits the driver: {samples:,} samples per step (x rollout.n={r.n}) "
                          f"need ~{driver / 2**30:,.1f} GiB of bookkeeping, over half of this machine's "
                          f"{ram / 2**30:.0f} GiB")
    if cfg.trainer.device == "cpu" and cfg.ray_address()[0] is None and trajectories > ram // 2:
        raise ConfigError("data.train_batch_size", cfg.data.train_batch_size,
                          f"a batch whose trajectories fit this machine: {samples:,} samples per step hold "
                          f"~{trajectories / 2**30:,.1f} GiB of latents (model.latent_size, model.latent_width, "
                          f"model.num_frames, rollout.num_steps), over half of its {ram / 2**30:.0f} GiB")


def inert_keys(cfg: Any) -> None:
    """Keys that would do nothing (LoRA keys without LoRA, a KL weighting without a KL term): refused,
    naming the key that turns them off (the validation keys' counterpart is in ``user_inputs``)."""
    m = cfg.model
    if m.lora_rank == 0:
        for key, value in (("model.lora_alpha", m.lora_alpha), ("model.target_modules", m.target_modules)):
            if value is not None:
                raise ConfigError(key, value if not isinstance(value, list) else list(value),
                                  "null while model.lora_rank=0 (LoRA is off: a full fine-tune; set "
                                  "model.lora_rank > 0 to train adapters)")
    if cfg.actor.kl_dt_weighted and cfg.actor.kl_coef == 0:
        raise ConfigError("actor.kl_dt_weighted", True, "false while actor.kl_coef=0 (there is no KL term to weight)")
    t = cfg.trainer
    if t.val_with_ema and cfg.actor.ema_decay is None:
        raise ConfigError("trainer.val_with_ema", True, "false while actor.ema_decay is null (there is no EMA to "
                          "validate: set actor.ema_decay)")
    if t.val_with_ema and t.test_freq <= 0:
        raise ConfigError("trainer.val_with_ema", True, f"false while trainer.test_freq={t.test_freq} (no "
                          "validation runs)")
    if t.export_on_save and t.save_freq <= 0:
        raise ConfigError("trainer.export_on_save", True, f"false while trainer.save_freq={t.save_freq} (no "
                          "checkpoint is saved to export)")


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def _pools(cfg: Any) -> None:
    """Pool sizes: an absolute sanity bound, and on a local CPU run (no ``RAY_ADDRESS``) what this
    machine's memory holds, so a typo never spawns a hundred workers before failing."""
    res = cfg.resources
    for key, n in (("resources.generator.workers", res.generator.workers),
                   ("resources.trainer.workers", res.trainer.workers)):
        if isinstance(n, int) and n > MAX_POOL_WORKERS:
            raise ConfigError(key, n, f"at most {MAX_POOL_WORKERS} workers per pool")
    gen, trn = res.generator.workers, res.trainer.workers
    if not (isinstance(gen, int) and isinstance(trn, int)):
        return
    if cfg.trainer.device == "cpu" and cfg.ray_address()[0] is None:
        ram = _ram_bytes()
        limit = max(2, ram // CPU_WORKER_BYTES)
        if gen + trn > limit:
            key = "resources.generator.workers" if gen >= trn else "resources.trainer.workers"
            raise ConfigError(key, gen if gen >= trn else trn,
                              f"at most {limit} workers in all on this machine (a local CPU run gives each worker "
                              f"~0.5 GB of its {ram / 2**30:.0f} GB); set RAY_ADDRESS to run on a Ray cluster")


# -- files ----------------------------------------------------------------------------------------
def _limit(name: str, default: int) -> int:
    try:
        return int(os.pathconf("/", name))
    except (OSError, ValueError):
        return default


def _path_fits(key: str, path: str, p: Path) -> None:
    """Every component of ``p`` within the file system's name limit and the whole within its path limit
    (less what the run appends), so the run's ``mkdir`` cannot fail with 'File name too long'."""
    name_max, path_max = _limit("PC_NAME_MAX", 255), _limit("PC_PATH_MAX", 4096)
    for part in p.parts:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(key, path, f"a path whose every name is at most {name_max} bytes (the file system's "
                              f"limit); {part[:40]!r}... is {len(os.fsencode(part))}")
    if len(os.fsencode(str(p))) + PATH_ROOM > path_max:
        raise ConfigError(key, path, f"a path of at most {path_max - PATH_ROOM} bytes (the file system's limit, "
                          f"less {PATH_ROOM} for the files the run writes in it); it is {len(os.fsencode(str(p)))}")


def writable(key: str, path: str) -> None:
    """Create and remove a probe file in ``path`` (or, if it does not exist yet, in its nearest
    existing ancestor: the run creates the rest), so an unwritable output dir fails now, not after
    the last step."""
    p = Path(path).expanduser().absolute()
    _path_fits(key, path, p)
    at = p
    while not at.exists():
        if at.parent == at:
            break
        at = at.parent
    if not at.is_dir():
        raise ConfigError(key, path, f"a directory path ({str(at)!r} exists and is not a directory)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".digen-probe-", dir=at)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(key, path, f"a writable directory (creating a file in {str(at)!r} failed: "
                          f"{err.strerror or err})") from None


def resolve_resume(cfg: Any) -> str | None:
    """The checkpoint a run resumes from: ``trainer.resume_from``, or for ``auto`` the latest complete
    checkpoint under ``trainer.default_local_dir`` (None: a fresh start)."""
    rf = cfg.trainer.resume_from
    if rf == "auto":
        from verl_digen.workers import checkpoint as ckpt  # torch: only where a checkpoint is read

        found = ckpt.latest(cfg.trainer.default_local_dir)
        return str(found) if found is not None else None
    return rf


def fingerprint(cfg: Any) -> dict[str, Any]:
    """The values of ``RESUME_KEYS`` as JSON values (the architecture by its canonical name)."""
    out: dict[str, Any] = {}
    for key in RESUME_KEYS:
        v = get_key(cfg, key)
        if key == "model.arch":
            v = canonical_arch(v)
        out[key] = json.loads(json.dumps(v, default=str)) if v is not None else None
    return out


def _same(a: Any, b: Any) -> bool:
    if _real(a) and _real(b):
        return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
    return a == b


def check_resume(cfg: Any, path: str) -> list[str]:
    """The checkpoint at ``path`` must be complete and recorded with this config: a changed key is an
    error unless listed in ``trainer.resume_allow_changes`` (then a warning). Returns warnings."""
    from verl_digen.workers import checkpoint as ckpt  # torch: only where a checkpoint is read

    why = ckpt.problem(path)
    if why is not None:
        raise ConfigError("trainer.resume_from", cfg.trainer.resume_from,
                          f"a complete verl-digen checkpoint directory, but {path!r} is not one: {why}")
    warnings = []
    try:
        if not ckpt.verify(path):
            warnings.append(f"resuming {path}: unverified, it has no checksums (saved by a verl-digen from before "
                            "they were written), so a change to its bytes would go unnoticed")
    except ckpt.CheckpointError as err:
        raise ConfigError("trainer.resume_from", cfg.trainer.resume_from,
                          f"a checkpoint whose files have the bytes they were saved with: {err}") from None
    meta = json.loads((Path(path) / ckpt.META_FILE).read_text())
    saved = (meta.get("extra") or {}).get("config") or {}
    run = (meta.get("extra") or {}).get("run_id", "?")
    mine = fingerprint(cfg)
    for key in RESUME_KEYS:
        if key not in saved or _same(saved[key], mine[key]):
            continue
        if key in cfg.trainer.resume_allow_changes:
            warnings.append(f"resuming with {key} = {mine[key]!r} (the checkpoint at {path} has {saved[key]!r}; "
                            f"allowed by trainer.resume_allow_changes)")
            continue
        how = ("it changes the trained parameters, so it cannot be resumed across" if key in STRUCTURAL_KEYS
               else f"set it back, or allow the change with 'trainer.resume_allow_changes=[{key}]'")
        raise ConfigError(key, mine[key],
                          f"{saved[key]!r} as in the checkpoint being resumed ({path}, run {run}): {how}")
    return warnings


def finished(cfg: Any) -> str | None:
    """What to say instead of starting Ray when the checkpoint being resumed is already at
    ``trainer.total_steps`` (None: there are steps to run)."""
    from verl_digen.workers import checkpoint as ckpt  # torch: only where a checkpoint is read

    path = resolve_resume(cfg)
    if path is None or ckpt.problem(path) is not None:
        return None
    step = (ckpt.read_meta(path).get("extra") or {}).get("step", ckpt.step_of(path))
    if step is None or int(step) < cfg.trainer.total_steps:
        return None
    return (f"nothing to do: the checkpoint resumed ({path}) is at step {int(step)}, and trainer.total_steps="
            f"{cfg.trainer.total_steps}; raise trainer.total_steps to train further")


def lora_targets(cfg: Any) -> None:
    """``model.target_modules`` must each name a module of the transformer (peft matches a name or a
    ``.``-suffix of one), and ``model.lora_rank`` must not exceed the smaller side of the layers it adapts
    (a larger rank adds parameters, not expressiveness: adapters outgrow the layers). Checked where cheap:
    the tiny random-weight models (built here, well under a second) exactly; a local pretrained model's
    rank against its attention width (``transformer/config.json``); other targets when LoRA is applied."""
    m = cfg.model
    if m.lora_rank <= 0:
        return
    if m.path is not None:
        width = _attention_width(m)
        if width is not None and m.lora_rank > width:
            raise ConfigError("model.lora_rank", m.lora_rank, f"at most {width}, the attention width of "
                              f"{m.path}'s transformer (the LoRA rank is bounded by the adapted layers' sizes)")
        return
    import torch

    from verl_digen.models import build_model
    from verl_digen.models.lora import default_lora_targets

    with torch.random.fork_rng():
        model = build_model(m.arch, pretrained=None, dtype=torch.float32, device="cpu", seed=m.seed,
                            latent_size=m.latent_size, latent_width=m.latent_width, num_frames=m.num_frames)
    names = [n for n, _ in model.transformer.named_modules() if n]
    targets = list(m.target_modules) if m.target_modules else default_lora_targets(model)
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing and m.target_modules:
        leaves = sorted({n.rsplit(".", 1)[-1] for n, mod in model.transformer.named_modules()
                         if isinstance(mod, torch.nn.Linear)})
        raise ConfigError("model.target_modules", list(m.target_modules),
                          f"module-name suffixes of the {m.arch} transformer; {missing} match no module "
                          f"(its linear layers end in: {', '.join(leaves)})")
    sides = [min(mod.in_features, mod.out_features) for n, mod in model.transformer.named_modules()
             if isinstance(mod, torch.nn.Linear) and any(n == t or n.endswith("." + t) for t in targets)]
    if sides and m.lora_rank > min(sides):
        raise ConfigError("model.lora_rank", m.lora_rank, f"at most {min(sides)}, the smaller side of the smallest "
                          f"layer it adapts in the {m.arch} transformer (targets {', '.join(targets)}): the LoRA "
                          "rank is bounded by the adapted layers' sizes")


def _attention_width(m: Any) -> int | None:
    """heads x head size of a local pretrained transformer (``transformer/config.json``), else None."""
    config = os.path.join(m.path, "transformer", "config.json")
    if not os.path.isfile(config):
        return None
    with open(config) as f:
        c = json.load(f)
    heads, size = c.get("num_attention_heads"), c.get("attention_head_dim")
    return heads * size if isinstance(heads, int) and isinstance(size, int) else None


def wandb_unready() -> str | None:
    """Why ``trainer.logger=[wandb]`` would fail once the run has started (None: it can start): wandb is not
    installed, or has no credentials (``WANDB_API_KEY``, a ``wandb login`` entry in ~/.netrc) while it is
    neither offline nor disabled (``WANDB_MODE``). Checked without the network."""
    import importlib.util
    import netrc

    if importlib.util.find_spec("wandb") is None:
        return "is not installed (pip install wandb)"
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return None
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        if netrc.netrc().authenticators(host):
            return None
    except (OSError, netrc.NetrcParseError):
        pass
    return (f"has no credentials for {host} (it would stop the run after Ray and the workers started): set "
            "WANDB_API_KEY or run `wandb login`, or WANDB_MODE=offline to log locally")


def model_source(cfg: Any, single_node: bool) -> str | None:
    """Once Ray is up, before any worker starts: a ``model.path`` hub id must be in the Hugging Face
    cache (nothing is downloaded at run time). On one node a missing one is refused; on a cluster the
    driver's cache need not be the workers', so it returns a warning instead. Not part of ``validate``:
    a dry run plans a recipe on a machine without its weights."""
    mp = cfg.model.path
    if mp is None or Path(mp).expanduser().is_dir() or hub_cached(mp):
        return None
    from huggingface_hub.constants import HF_HUB_CACHE

    if single_node:
        raise ConfigError("model.path", mp, f"a hub id whose pipeline is in the Hugging Face cache ({HF_HUB_CACHE}; "
                          f"nothing is downloaded at run time: `huggingface-cli download {mp}` where there is "
                          "network), or a local diffusers pipeline directory")
    return (f"model.path {mp!r} is not in this node's Hugging Face cache ({HF_HUB_CACHE}); the workers must find "
            "it in theirs (nothing is downloaded at run time)")


def hub_cached(repo_id: str) -> bool:
    """Whether the diffusers pipeline ``repo_id`` (its ``model_index.json``) is in the local Hugging Face
    cache (a malformed id is not)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "model_index.json"), str)
    except Exception:  # noqa: BLE001 - HFValidationError and kin: not an id the cache can hold
        return False


def files_and_resume(cfg: Any) -> list[str]:
    """Output dirs, prompt files, resume source and checkpoint ownership; returns warnings."""
    from verl_digen.data import load_prompts

    t = cfg.trainer
    warnings: list[str] = []
    mp = cfg.model.path
    if mp is not None and mp.startswith(("/", "./", "../", "~")) and not Path(mp).expanduser().is_dir():
        raise ConfigError("model.path", mp, "an existing local diffusers pipeline directory (a path that looks local "
                          "is not looked up on the Hugging Face hub), or a hub id in the HF cache")
    # a Ray of its own on this machine (CPU or GPU) is one node; a dry run plans a job on a machine without its
    # weights
    if not t.dry_run and cfg.ray_address()[0] is None:
        model_source(cfg, single_node=True)
    lora_targets(cfg)
    if t.trace_dir:
        writable("trainer.trace_dir", t.trace_dir)
    saves = t.save_freq > 0
    if saves or t.resume_from == "auto":
        writable("trainer.default_local_dir", t.default_local_dir)
    prompts = cfg.data.synthetic_prompts
    if cfg.data.train_files is not None:
        try:
            prompts = len(load_prompts(cfg.data.train_files, cfg.data.prompt_key))
        except ValueError as err:
            raise ConfigError("data.train_files", cfg.data.train_files, f"a readable prompt file ({err})") from None
    if prompts < cfg.data.train_batch_size:
        warnings.append(f"data: only {prompts} prompt(s) for data.train_batch_size = {cfg.data.train_batch_size}: "
                        "prompts repeat inside a step (their groups are trained twice per step)")
    source = resolve_resume(cfg)
    if source is not None:
        warnings += check_resume(cfg, source)
    if saves:
        from verl_digen.workers import checkpoint as ckpt  # torch: only where a checkpoint is read

        start = (ckpt.step_of(source) or 0) if source is not None else 0
        # a folder of a step this run may save (every step may be saved when a signal stops the run)
        foreign = [(d, why) for d, why in ckpt.foreign_step_dirs(t.default_local_dir)
                   if start < ckpt.step_of(d) <= t.total_steps]
        if foreign:
            (d, why), more = foreign[0], f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
            raise ConfigError("trainer.default_local_dir", t.default_local_dir,
                              f"a directory whose global_step_* folders are verl-digen checkpoints: {d.name}{more} "
                              f"is not one ({why}), and saving that step would replace it. Choose another directory "
                              "(verl-digen cannot resume another trainer's checkpoints, e.g. verl-omni's)")
        found = ckpt.complete_checkpoints(t.default_local_dir)
        inside = source is not None and Path(source).resolve().parent == Path(t.default_local_dir).resolve()
        if found and not inside:
            step, latest = found[-1]
            run = (ckpt.read_meta(latest).get("extra") or {}).get("run_id", "?")
            raise ConfigError("trainer.default_local_dir", t.default_local_dir,
                              f"a directory without another run's checkpoints: it holds {len(found)} (latest "
                              f"{latest.name}, run {run}), which this run's would mix with. Continue that run with "
                              "trainer.resume_from=auto, or choose another (or an empty) directory")
    return warnings


def _transformer_heads(m: Any, arch: str) -> int | None:
    """Attention heads of the policy's transformer: the tiny config's, a local checkpoint's
    ``transformer/config.json``, else unknown until the weights load (the trainer checks them then)."""
    if m.path is None:
        from verl_digen.models.arch import MODEL_REGISTRY  # the tiny models: torch is loaded to build them

        return MODEL_REGISTRY[arch].tiny.transformer_kwargs.get("num_attention_heads")
    config = os.path.join(m.path, "transformer", "config.json")
    if os.path.isfile(config):
        with open(config) as f:
            return json.load(f).get("num_attention_heads")
    return None


def sequence_parallel_problem(cfg: Any, size: int) -> str | None:
    """What ``actor.ulysses_sequence_parallel_size`` must be when ``size`` is not right for this run (None
    when it is): a divisor of the trainer ranks, for a model it can cut, into whole attention heads and equal
    shares of each sample's video tokens (``models/ulysses.py``)."""
    if size == 1:
        return None
    m, arch = cfg.model, canonical_arch(cfg.model.arch)
    facts = ARCHS[arch]
    if facts.sequence_plan is None:
        return archs.sequence_parallel_problem(arch, 1, 1, size)
    ranks = cfg.total_workers if cfg.trainer.mode == COLOCATED else cfg.resources.trainer.workers
    if ranks % size:
        return f"a divisor of the {ranks} trainer GPUs (each group of that many trains the same rows)"
    spec = facts.pretrained
    spatial, temporal = facts.vae_factors
    if m.path is None:  # tiny: latent frames and sides as given
        frames, height = m.num_frames or 3, m.latent_size or 16
    else:  # released weights: pixel frames 4k + 1
        frames = ((m.num_frames or spec.num_frames) - 1) // temporal + 1
        height = m.latent_size or spec.height // spatial
    tokens = archs.video_tokens((0, frames, height, m.latent_width or height), 2, 1)  # both patchify 1 x 2 x 2
    return archs.sequence_parallel_problem(arch, _transformer_heads(m, arch) or size, tokens, size)


#: what ``ray.address`` may be: ``auto``, ``host:port`` or a ``ray://`` client address (what ``ray.init`` takes)
RAY_ADDRESS_FORM = re.compile(r"^(auto|(ray://)?[A-Za-z0-9._\-\[\]:]+:[0-9]{1,5})$")


def ray_address(address: str | None) -> None:
    """``ray.address`` as ``ray.init`` takes it, refused before any start-up (a typo would fail after the
    dry run, inside Ray, with Ray's words)."""
    if address is not None and not RAY_ADDRESS_FORM.match(str(address)):
        raise ConfigError("ray.address", address, "a Ray cluster's address: host:port (its GCS, e.g. 10.0.0.5:6379), "
                          "ray://host:port (Ray client) or auto; unset to start a Ray head of the run's own")
