"""The profile format: a cluster's stage costs as JSON or YAML, written by hand, by ``digen simulate
--dump-profile``, or by the runtime from measured durations; ``load_profile(path)`` returns a
:class:`CostModel`. See docs/simulator.md for the full description. Shape::

    format: verl-digen-profile
    version: 1
    name: my-cluster
    generator: {workers: 8, hardware: {name: H20, generate: {fixed: 1.0, per_unit: 20.0},
                                        score: {fixed: 0.2, per_unit: 0.3}, train_pass: {...}}}
    trainer:   {workers: 8, hardware: {name: H100, generate: {...}, train_pass: {fixed: 0.3, per_unit: 1.1}}}
    steps_trained: 12          # K, timesteps trained per sample
    keep_fraction: 1.0         # share of samples trained (best-of-N < 1)
    sequence_parallel: 1       # trainer GPUs per Ulysses group (rows are shared over workers / this)
    switch_to_gen: 0.8         # seconds; also switch_to_train, optimizer_step, weight_sync, publish
    workload: {prompts: 4, group_size: 8, mb_size: 1, tsp_degree: 4, staleness: 0.25, steps: 4}  # optional
    samples:                   # optional raw measurements; refit the affine costs above
      - {pool: generator, kind: generate, size: 2, seconds: 41.2}
      - {pool: trainer, kind: update, size: 1, tsp_degree: 4, seconds: 9.7}
      - {kind: weight_sync, seconds: 1.9}

Per-unit costs are per sample (``generate``, ``score``) or per row of one training pass on one GPU
(``train_pass``, a row being one (sample, timestep) pair).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from .actions import KINDS
from .costs import SCALAR_COSTS, Affine, BaselineCosts, CostModel, Hardware, Pool, Sharded, passes

FORMAT = "verl-digen-profile"
VERSION = 1
_SCALARS = SCALAR_COSTS
_AFFINES = ("generate", "score", "train_pass")


@dataclass(frozen=True)
class Workload:
    """Default run shape stored with a profile or preset (all optional on load)."""

    prompts: int = 4
    group_size: int = 8
    mb_size: int = 1
    tsp_degree: int = 1
    staleness: float = 0.25
    steps: int = 4
    policy: str = "bts"
    mini_batches: int = 1  # optimizer steps per step (actor.ppo_mini_batch_size)
    recompute: bool = False  # the trainer's own old log-probs (actor.recompute_log_prob): priced with mini-batches
    row_forwards: int = 0  # no-grad forwards per trained row beside its pass (DiffusionNFT's old copy, reference)


def _affine(d: Any, where: str) -> Affine:
    if d is None:
        return Affine()
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a mapping with 'fixed' and 'per_unit', got {d!r}")
    unknown = set(d) - {"fixed", "per_unit", "floor"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    try:
        return Affine(float(d.get("fixed", 0.0)), float(d.get("per_unit", 0.0)), float(d.get("floor", 0.0)))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _hardware(d: dict, where: str) -> Hardware:
    return Hardware(
        name=str(d.get("name", "gpu")),
        **{k: _affine(d.get(k), f"{where}.{k}") for k in _AFFINES},
    )


def _pool(d: Any, where: str) -> Pool:
    if not isinstance(d, dict) or "workers" not in d:
        raise ValueError(f"profile needs '{where}: {{workers: N, hardware: {{...}}}}'")
    return Pool(_hardware(d.get("hardware") or {}, f"{where}.hardware"), d["workers"])


def _fields_only(cls: type, d: Any, name: str) -> dict:
    """``d`` (a mapping, or None for ``cls``'s defaults) holding only ``cls``'s fields."""
    if d is None:
        return {}
    allowed = {f.name for f in fields(cls)}
    if not isinstance(d, dict) or set(d) - allowed:
        raise ValueError(f"{name}: expected a mapping with keys from {sorted(allowed)}, got {d!r}")
    return d


def _baselines(d: Any) -> BaselineCosts:
    return BaselineCosts(**_fields_only(BaselineCosts, d, "baselines"))


def _sharded(d: Any) -> Sharded:
    d = _fields_only(Sharded, d, "sharded")
    return Sharded(**{**d, "collective": _affine(d.get("collective"), "sharded.collective")}) if d else Sharded()


def _contention(d: Any) -> tuple[tuple[str, float], ...]:
    if d is None:
        return ()
    if not isinstance(d, dict) or set(d) - set(KINDS):
        raise ValueError(f"host_contention: expected a mapping from action kinds {list(KINDS)} to fractions, "
                         f"got {d!r}")
    return tuple(sorted((str(k), float(v)) for k, v in d.items()))


def _beside(d: Any) -> tuple[tuple[str, str, float], ...]:
    if d is None:
        return ()
    if (not isinstance(d, dict) or set(d) - set(KINDS)
            or any(not isinstance(v, dict) or set(v) - set(KINDS) for v in d.values())):
        raise ValueError(f"host_contention_beside: expected a mapping from action kinds {list(KINDS)} to mappings "
                         f"from the kind beside to fractions, got {d!r}")
    return tuple(sorted((str(k), str(o), float(c)) for k, v in d.items() for o, c in v.items()))


def model_from_dict(d: dict) -> tuple[CostModel, Workload | None]:
    """Parse a profile mapping (see module docstring); raw ``samples`` refit the costs."""
    if d.get("format", FORMAT) != FORMAT:
        raise ValueError(f"not a verl-digen profile (format {d.get('format')!r})")
    if int(d.get("version", VERSION)) > VERSION:
        raise ValueError(f"profile version {d['version']} is newer than this verl-digen ({VERSION})")
    model = CostModel(
        generator=_pool(d.get("generator"), "generator"),
        trainer=_pool(d.get("trainer"), "trainer"),
        steps_trained=int(d.get("steps_trained", 1)),
        keep_fraction=float(d.get("keep_fraction", 1.0)),
        sequence_parallel=int(d.get("sequence_parallel", 1)),
        **{k: float(d.get(k, 0.0)) for k in _SCALARS},
        baselines=_baselines(d.get("baselines")),
        sharded=_sharded(d.get("sharded")),
        host_contention=_contention(d.get("host_contention")),
        host_contention_beside=_beside(d.get("host_contention_beside")),
    )
    if d.get("samples"):
        model = fit_samples(model, d["samples"])
    wl = None
    if d.get("workload") is not None:
        allowed = {f.name for f in fields(Workload)}
        unknown = set(d["workload"]) - allowed
        if unknown:
            raise ValueError(f"workload: unknown keys {sorted(unknown)}")
        wl = Workload(**d["workload"])
    return model, wl


def fit_affine(points: list[tuple[float, float, float]]) -> Affine:
    """Weighted least squares of ``seconds = fixed + per_unit * size`` over ``(size, seconds, weight)``
    points of at least two distinct sizes: ``fixed`` is the per-call overhead (dispatch, Ray round trip,
    serialization, launch), ``per_unit`` the compute per sample or row. A negative slope (noise) leaves the
    weighted mean as a per-call cost; a negative intercept refits the slope through the origin."""
    w = sum(p[2] for p in points)
    mx = sum(s * k for s, _, k in points) / w
    my = sum(t * k for _, t, k in points) / w
    sxx = sum(k * (s - mx) ** 2 for s, _, k in points)
    if sxx <= 0:
        raise ValueError("fit_affine needs points of at least two distinct sizes")
    slope = sum(k * (s - mx) * (t - my) for s, t, k in points) / sxx
    if slope <= 0:
        return Affine(max(my, 0.0), 0.0)
    fixed = my - slope * mx
    if fixed < 0:
        return Affine(0.0, sum(k * s * t for s, t, k in points) / sum(k * s * s for s, _, k in points))
    return Affine(fixed, slope)


def _medians(points: list[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """``(size, median seconds, count)`` per distinct size: a load spike on a shared host (one call 10x
    its peers) moves a mean, and with it every prediction, but not a median."""
    by: dict[float, list[float]] = defaultdict(list)
    for s, t in points:
        by[s].append(t)
    return [(s, statistics.median(ts), float(len(ts))) for s, ts in sorted(by.items())]


def fit_points(points: list[tuple[float, float]], prior: Affine | None = None) -> Affine:
    """Per-call + per-unit cost of ``(size, seconds)`` points: least squares over the per-size medians
    (weighted by their counts) where there are two sizes or more; one size keeps the prior's split of per
    call vs per unit at the measured level (or, with no prior, makes the cost a per-unit rate)."""
    med = _medians(points)
    if len(med) >= 2:
        return fit_affine(med)
    ((size, t, _),) = med
    predicted = prior(size) if prior is not None else 0.0
    if predicted > 0:
        return prior.scaled(t / predicted)
    return Affine(0.0, t / size if size > 0 else 0.0)


def fit_samples(model: CostModel, samples: list[dict]) -> CostModel:
    """Refit affine costs from measured (pool, kind, size, seconds) samples (``fit_points``); scalar kinds -> their
    median."""
    pts: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    scalars: dict[str, list[float]] = defaultdict(list)
    R = model.trainer.workers
    for i, s in enumerate(samples):
        kind, secs = s.get("kind"), s.get("seconds")
        if secs is None or float(secs) < 0:
            raise ValueError(f"samples[{i}]: needs non-negative 'seconds'")
        secs = float(secs)
        if kind in _SCALARS:
            scalars[kind].append(secs)
            continue
        size = float(s.get("size", 1))
        if kind == "tag_generate":
            pts[("trainer", "generate")].append((size, secs))  # one whole micro-batch per TAG slot
        elif kind == "update":  # whole micro-batch update -> per-pass points
            d = int(s.get("tsp_degree", 1))
            ps = passes(model.steps_trained, d)
            rows = max(1.0, math.ceil(size * model.keep_fraction * ps[0] / model.data_parallel(R)))
            pts[("trainer", "train_pass")].append((rows, secs / len(ps)))
        elif kind in _AFFINES:
            pool = s.get("pool", "trainer" if kind == "train_pass" else "generator")
            if pool not in ("generator", "trainer"):
                raise ValueError(f"samples[{i}]: unknown pool {pool!r}")
            pts[(pool, kind)].append((size, secs))
        else:
            raise ValueError(f"samples[{i}]: unknown kind {kind!r}")
    pools = {"generator": model.generator, "trainer": model.trainer}
    for (pool, kind), p in pts.items():
        hw = pools[pool].hardware
        pools[pool] = Pool(replace(hw, **{kind: fit_points(p, getattr(hw, kind))}), pools[pool].workers)
    return replace(model, generator=pools["generator"], trainer=pools["trainer"],
                   **{k: statistics.median(v) for k, v in scalars.items()})


def model_to_dict(model: CostModel, name: str = "", workload: Workload | None = None) -> dict:
    def hw(h: Hardware) -> dict:
        return {"name": h.name, **{k: asdict(getattr(h, k)) for k in _AFFINES}}

    out: dict[str, Any] = {"format": FORMAT, "version": VERSION, "name": name}
    for pool in ("generator", "trainer"):
        p: Pool = getattr(model, pool)
        out[pool] = {"workers": p.workers, "hardware": hw(p.hardware)}
    out["steps_trained"] = model.steps_trained
    out["keep_fraction"] = model.keep_fraction
    if model.sequence_parallel > 1:
        out["sequence_parallel"] = model.sequence_parallel
    out.update({k: getattr(model, k) for k in _SCALARS})
    if model.baselines != BaselineCosts():
        out["baselines"] = asdict(model.baselines)
    if model.sharded != Sharded():
        out["sharded"] = asdict(model.sharded)
    if model.host_contention:
        out["host_contention"] = dict(model.host_contention)
    if model.host_contention_beside:
        beside: dict[str, dict[str, float]] = {}
        for kind, other, c in model.host_contention_beside:
            beside.setdefault(kind, {})[other] = c
        out["host_contention_beside"] = beside
    if workload is not None:
        out["workload"] = asdict(workload)
    return out


def _read(path: str | Path) -> dict:
    text = Path(path).read_text()
    if str(path).endswith(".json"):
        return json.loads(text)
    import yaml  # YAML is a superset of JSON; PyYAML is a dependency of the package

    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


def load(path: str | Path) -> tuple[CostModel, Workload | None]:
    """Cost model and (optional) workload of a profile file."""
    try:
        return model_from_dict(_read(path))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None


def load_profile(path: str | Path) -> CostModel:
    """The cost model of a profile (JSON or YAML) measured by the runtime or written by hand."""
    return load(path)[0]


def dump_profile(model: CostModel, path: str | Path, name: str = "", workload: Workload | None = None) -> None:
    d = model_to_dict(model, name, workload)
    if str(path).endswith(".json"):
        Path(path).write_text(json.dumps(d, indent=2) + "\n")
    else:
        import yaml

        plain = json.loads(json.dumps(d))  # safe_dump refuses str subclasses (action kinds)
        Path(path).write_text(yaml.safe_dump(plain, sort_keys=False))
