"""The paper's recipes (recipes/, installed as verl_digen.recipes): every one composes from its own
directory, validates, and has a resource plan that adds up; the launch scripts name real recipes; one
dry run goes through the real command line. Nothing is launched and no Ray starts."""

import os
import re
import subprocess
import sys
from dataclasses import asdict

import pytest
from hydra import compose, initialize_config_dir

from verl_digen import recipes
from verl_digen.config import RunConfig, load, validate
from verl_digen.config.plan import ResourcePlan, resource_plan
from verl_digen.models.arch import MODEL_REGISTRY, canonical_arch
from verl_digen.rewards import REWARDS
from verl_digen.schedule import presets

#: setting -> (GPUs, generator workers, trainer workers, diffusers hub id, the default's mode); the paper's
#: section 5. The split is the best disaggregated one (the default where the mode is digen, else the ``-digen``
#: variant) and the mode the planner's choice: ``test_every_recipe_is_the_planners_choice``
SETTINGS = {
    "flux-12b-32": (32, 2, 30, "black-forest-labs/FLUX.1-dev", "colocated"),
    "qwen-image-20b-32": (32, 2, 30, "Qwen/Qwen-Image", "colocated"),
    "wan2.1-14b-16": (16, 1, 15, "Wan-AI/Wan2.1-T2V-14B-Diffusers", "colocated"),
    "wan2.1-14b-32": (32, 2, 30, "Wan-AI/Wan2.1-T2V-14B-Diffusers", "colocated"),
    "wan2.1-14b-720p-32": (32, 4, 28, "Wan-AI/Wan2.1-T2V-14B-Diffusers", "colocated"),
    "hunyuanvideo-13b-16": (16, 6, 10, "hunyuanvideo-community/HunyuanVideo", "digen"),
    "hunyuanvideo-13b-32": (32, 8, 24, "hunyuanvideo-community/HunyuanVideo", "digen"),
    "hunyuanvideo-13b-hetero": (16, 8, 8, "hunyuanvideo-community/HunyuanVideo", "digen"),
}
#: setting -> (height, width, frames) in pixels where it is not the paper's (512 x 512 images, 352 x 352 x 25 video)
RESOLUTION = {"wan2.1-14b-720p-32": (720, 1280, 81)}
TWIN = "-colocated"
#: setting -> the recipe running it in the other mode
VARIANT = {s: s + ("-digen" if v[4] == "colocated" else TWIN) for s, v in SETTINGS.items()}
ALL = sorted([*SETTINGS, *VARIANT.values()])
LAUNCH_DIR = recipes.RECIPES_DIR / "launch"


def _setting(name: str) -> str:
    return name.removesuffix(TWIN).removesuffix("-digen")


def _mode(name: str) -> str:
    """The mode recipe ``name`` runs."""
    default = SETTINGS[_setting(name)][4]
    return default if name in SETTINGS else ("digen" if default == "colocated" else "colocated")


def _pair(setting: str) -> tuple[str, str]:
    """(the setting's digen recipe, its colocated recipe)."""
    a, b = setting, VARIANT[setting]
    return (a, b) if _mode(a) == "digen" else (b, a)


def _compose(name: str, *overrides: str) -> RunConfig:
    """Compose a recipe from the recipes directory alone: the recipe's own ``hydra.searchpath`` must
    bring in the packaged configs (as it does for ``--config-dir`` on the command line)."""
    with initialize_config_dir(str(recipes.RECIPES_DIR), version_base=None):
        return load(compose(name, overrides=list(overrides)))


_CACHE: dict[str, tuple[RunConfig, ResourcePlan]] = {}


def _dry_run(name: str) -> tuple[RunConfig, ResourcePlan]:
    """What ``trainer.dry_run=true`` does: resolve, validate, plan (cached across the tests)."""
    if name not in _CACHE:
        cfg = _compose(name, "trainer.dry_run=true")
        validate(cfg)
        _CACHE[name] = (cfg, resource_plan(cfg))
    return _CACHE[name]


def test_every_setting_has_a_default_and_a_variant_in_the_other_mode():
    assert recipes.names() == ALL
    assert recipes.settings() == sorted(SETTINGS)
    for name in ALL:
        assert recipes.path(name).is_file()
    assert {s: recipes.variant(s) for s in SETTINGS} == VARIANT
    with pytest.raises(ValueError, match="flux-12b-32"):
        recipes.path("flux-12b-64")


@pytest.mark.parametrize("name", ALL)
def test_recipe_composes_validates_and_its_plan_adds_up(name):
    gpus, gen, trn, model_id, _ = SETTINGS[_setting(name)]
    cfg, plan = _dry_run(name)
    colocated = _mode(name) == "colocated"
    assert cfg.trainer.mode == _mode(name)
    # the split and the GPU count (a colocated run colocates on all of them)
    if not colocated:
        assert (cfg.resources.generator.workers, cfg.resources.trainer.workers) == (gen, trn)
    assert cfg.total_workers == plan.total_workers == gpus
    if colocated:
        assert [(p, n) for p, n, _ in plan.pools] == [("colocated", gpus)]
    else:
        assert [(p, n) for p, n, _ in plan.pools] == [("generator", gen), ("trainer", trn)]
    # the batch layout
    assert plan.batch == cfg.data.train_batch_size * cfg.rollout.n
    assert plan.micro_batches * cfg.rollout.micro_batch_size == plan.batch
    if not colocated:
        assert plan.micro_batches >= 2 * gen, "fewer than two micro-batches per generator worker: nothing to pipeline"
    assert plan.trained_steps == int(cfg.rollout.num_steps * cfg.rollout.timestep_fraction)
    # the prediction: the preset named like the setting, with both step times and every baseline, whatever the mode
    assert cfg.digen.profile == _setting(name) and cfg.digen.profile in presets.names()
    assert plan.predicted_step_s is not None and plan.predicted_step_s > 0
    assert set(plan.predicted_colocated) == {"ideal", "native", "verl-omni", "verl-omni-bypass"}
    assert "s/step (simulator)" in plan.render() and "x the strongest baseline, " in plan.render()
    # real weights at the paper's precision on GPUs
    m = cfg.model
    assert m.path == model_id and m.dtype == "bfloat16" and cfg.trainer.device == "cuda" and m.lora_rank == 0
    assert cfg.reward.name in REWARDS and cfg.reward.weights is None
    assert cfg.trainer.experiment_name == name


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_latent_size_matches_the_paper_resolution(name):
    cfg, _ = _dry_run(name)
    arch = canonical_arch(cfg.model.arch)
    assert cfg.model.arch == arch
    m = cfg.model
    if MODEL_REGISTRY[arch].latent_ndim == 5:  # video: 8x spatial, 4x causal temporal VAE
        height, width, frames = RESOLUTION.get(name, (352, 352, 25))
        assert (m.latent_size, m.latent_width or m.latent_size, m.num_frames) == (height // 8, width // 8, frames)
        assert (frames - 1) % 4 == 0
    else:  # 512 x 512 images, 8x VAE
        assert m.latent_size == 512 // 8 and m.num_frames is None


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_settings_two_recipes_run_the_same_workload(name):
    digen, colocated = _pair(name)
    cfg, plan = _dry_run(digen)
    other, other_plan = _dry_run(colocated)
    d = cfg.digen
    assert d.gap.enable and d.tag.policy in ("never", "adaptive", "bts") and 0 <= d.tcss.staleness <= 0.5
    assert d.tsp.degree is None or 1 <= d.tsp.degree <= plan.trained_steps
    # the colocated recipe: no TAG, no TCSS; a twin keeps upstream's per-step training, a planned default its TSP
    o = other.digen
    assert (o.tag.policy, o.tcss.staleness) == ("never", 0.0)
    if colocated.endswith(TWIN):
        assert o.tsp.degree == 1
    # ... on the same GPUs and the same workload, so the two step times compare
    assert other.total_workers == cfg.total_workers
    for part in ("model", "data", "rollout", "actor", "algorithm", "reward"):
        assert asdict(getattr(other, part)) == asdict(getattr(cfg, part)), part
    assert o.profile == d.profile
    assert other_plan.batch == plan.batch
    # both price the same baselines (what users run colocated, per-timestep training, whatever the mode)
    assert other_plan.predicted_colocated == pytest.approx(plan.predicted_colocated, rel=1e-12)
    # a twin with upstream's knobs is colocated:ideal itself (more, where a memory cap adds passes)
    if colocated.endswith(TWIN) and o.tsp.rows_per_pass is None:
        assert other_plan.predicted_step_s == pytest.approx(plan.predicted_colocated_step_s, rel=1e-9)
    else:
        assert other_plan.predicted_step_s > 0


def _gb(resource: str) -> int:
    match = re.search(r"(\d+)\s*gb", resource.lower())
    assert match, f"node resource {resource!r} does not name the GPU memory"
    return int(match.group(1))


def test_wan_720p_fits_only_with_ulysses_and_the_refusal_says_so():
    """One row of 75,600 tokens does not fit an 80 GB GPU even with checkpointing; cut over 4 GPUs it does, and
    the refusal without it names the Ulysses size that fits, with its figure."""
    from verl_digen.config import ConfigError
    from verl_digen.config.memory import memory_plan

    cfg, _ = _dry_run("wan2.1-14b-720p-32")
    assert cfg.actor.ulysses_sequence_parallel_size == 4 and cfg.resources.trainer.workers % 4 == 0
    assert memory_plan(cfg).pools[-1].fits
    with pytest.raises(ConfigError, match=r"actor.ulysses_sequence_parallel_size=2 with digen.tsp.rows_per_pass=1.*"
                                          r"GiB\)") as err:
        validate(_compose("wan2.1-14b-720p-32", "actor.ulysses_sequence_parallel_size=1", "digen.tsp.rows_per_pass=1"))
    assert "still over" not in str(err.value).split("ulysses_sequence_parallel_size=2")[1].split(";")[0]


def test_heterogeneous_recipe_trains_on_the_stronger_gpus():
    cfg, plan = _dry_run("hunyuanvideo-13b-hetero")
    gen, trn = cfg.resources.generator.node_resource, cfg.resources.trainer.node_resource
    assert gen and trn and gen != trn
    assert (_gb(gen), _gb(trn)) == (48, 96)
    assert [where for _, _, where in plan.pools] == [f"nodes with resource '{gen}'", f"nodes with resource '{trn}'"]
    # the preset it predicts with agrees: the trainer pool's GPU trains a row faster than the generator's
    model = presets.get(cfg.digen.profile).model
    assert model.trainer.hardware.train_pass.per_unit < model.generator.hardware.train_pass.per_unit
    assert plan.predicted_step_s < plan.predicted_colocated_step_s
    # verl-omni's synchronous separate mode on the same two pools is one of its baselines, and slower here
    from verl_digen.config.plan import cluster_costs
    from verl_digen.config.planning import workload
    from verl_digen.schedule.split_search import separate_baseline

    assert plan.separate_s == pytest.approx(separate_baseline(cluster_costs(cfg), workload(cfg)).step_time, rel=1e-9)
    assert f"{plan.separate_s:.2f} s/step separate:verl-omni-bypass on the same pools" in plan.render()
    assert plan.strongest[1] < plan.separate_s
    # the colocated twin spans both GPU types (a pool pinned to one type would not fit 16 workers)
    twin, twin_plan = _dry_run(VARIANT["hunyuanvideo-13b-hetero"])
    assert twin.resources.generator.node_resource is None and twin.resources.trainer.node_resource is None
    assert twin_plan.pools == [("colocated", 16, "any cuda node")]
    # the homogeneous settings pin no GPU type
    for name in SETTINGS.keys() - {"hunyuanvideo-13b-hetero"}:
        c, _ = _dry_run(name)
        assert c.resources.generator.node_resource is None and c.resources.trainer.node_resource is None


def _launch_scripts() -> list:
    return sorted(LAUNCH_DIR.glob("*.sh"))


def test_every_launch_script_references_an_existing_recipe():
    scripts = _launch_scripts()
    assert sorted(s.stem for s in scripts) == sorted(SETTINGS)
    for script in scripts:
        text = script.read_text()
        named = re.findall(r"^recipe=(\S+)$", text, flags=re.M)
        assert named == [script.stem], script
        assert (recipes.RECIPES_DIR / f"{named[0]}.yaml").is_file()
        variant = VARIANT[script.stem]
        assert (recipes.RECIPES_DIR / f"{variant}.yaml").is_file()
        # the first argument naming the other mode launches the variant
        mode = variant.removeprefix(script.stem + "-")
        assert f'if [[ "${{1:-}}" == {mode} ]]; then recipe={variant}; shift; fi' in text, script
        assert "../run.sh" in text and os.access(script, os.X_OK), script
    run = recipes.RECIPES_DIR / "run.sh"
    assert "-m verl_digen.main --config-dir" in run.read_text() and os.access(run, os.X_OK)
    for script in [run, *scripts]:
        subprocess.run(["bash", "-n", str(script)], check=True)
    assert recipes.launch_command("flux-12b-32")[-2:] == ["--config-name", "flux-12b-32"]


def test_run_sh_rejects_an_unknown_recipe(tmp_path):
    out = subprocess.run(["bash", str(recipes.RECIPES_DIR / "run.sh"), "flux-12b-64"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert out.returncode == 2 and "no recipe 'flux-12b-64'" in out.stderr


@pytest.mark.slow
def test_dry_run_through_the_command_line(tmp_path):
    """The launch script -> run.sh -> ``python -m verl_digen.main --config-dir recipes --config-name ...``
    with ``trainer.dry_run=true``: prints the resolved config and the plan, starts nothing."""
    script = LAUNCH_DIR / "hunyuanvideo-13b-hetero.sh"
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(script), "trainer.dry_run=true", f"hydra.run.dir={tmp_path / 'hydra'}"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "path: hunyuanvideo-community/HunyuanVideo" in text and "mode: digen" in text
    assert "profile: hunyuanvideo-13b-hetero" in text
    assert re.search(r"generator\s+8 worker\(s\)\s+on nodes with resource 'gpu_48gb'", text), text
    assert re.search(r"trainer\s+8 worker\(s\)\s+on nodes with resource 'gpu_96gb'", text), text
    _, plan = _dry_run("hunyuanvideo-13b-hetero")
    assert f"batch      512 samples = {plan.micro_batches} micro-batch(es)" in text
    assert "ceiling    none from colocated:ideal on mixed hardware" in text
    predicted = re.search(r"predicted\s+([\d.]+) s/step \(simulator\)", text)
    assert predicted and float(predicted.group(1)) > 0
    assert float(predicted.group(1)) == pytest.approx(plan.predicted_step_s, abs=0.01)
    assert not (tmp_path / "outputs").exists(), "a dry run must not create run outputs"


def _layout(cfg: RunConfig) -> str:
    """How the README table names a recipe's layout."""
    if cfg.trainer.mode == "colocated":
        return f"colocated, TSP {cfg.digen.tsp.degree}"
    g, t = cfg.resources.generator, cfg.resources.trainer
    if g.node_resource:
        return f"digen {g.workers} x {_gb(g.node_resource)} GB + {t.workers} x {_gb(t.node_resource)} GB"
    return f"digen {g.workers} + {t.workers}"


def test_readme_table_is_what_the_dry_run_says():
    """recipes/README.md lists every setting with the layout, step times, ratios and memory its dry runs give,
    the ratio against the strongest baseline first."""
    from verl_digen.config.memory import memory_plan

    text = (recipes.RECIPES_DIR / "README.md").read_text()
    sec = r" ([\d.]+) s/step \|"
    unfit = r" ([\d.]+) s/step(?: \(does not fit\))? \|"  # colocated:verl-omni, marked where it does not fit
    row = re.compile(r"^\| [^|]+ \| (\d+) \| `([^`]+)` \| ([^|]+) \| `recipes/launch/(\S+)\.sh` \|" + sec +
                     r" ([\d.]+)x \| ([^|,]+), ([\d.]+) s/step \|" + unfit + sec + r" ([^|:]+): ([\d.]+) s/step \|"
                     r" ([^|]+) \| ([\d /]+) of ([\d /]+) GiB \|$", re.M)
    rows = {m.group(4): m for m in row.finditer(text)}
    assert sorted(rows) == sorted(SETTINGS)
    for name, m in rows.items():
        gpus, _, _, model_id, _ = SETTINGS[name]
        cfg, plan = _dry_run(name)
        other, other_plan = _dry_run(VARIANT[name])
        assert (int(m.group(1)), m.group(2)) == (gpus, model_id), name
        assert m.group(3).strip() == _layout(cfg), name
        t = plan.predicted_step_s
        assert float(m.group(5)) == pytest.approx(t, abs=0.051), (name, plan.render())
        label, strong = plan.strongest
        assert float(m.group(6)) == pytest.approx(strong / t, abs=0.0051), name
        assert float(m.group(8)) == pytest.approx(strong, abs=0.051), name
        # the label: the baseline, and on mixed pools the subset it ran on
        baseline = m.group(7).split(" on ")[0].strip()
        assert label.split()[-1 if label.startswith("colocated:") else 1] == f"colocated:{baseline}", (name, label)
        assert (" on the " in m.group(7)) == label.startswith("best-subset"), name
        assert float(m.group(9)) == pytest.approx(plan.predicted_colocated["verl-omni"], abs=0.051), name
        assert (f"{m.group(9)} s/step (does not fit)" in m.group(0)) == ("verl-omni" in plan.unfit), name
        assert float(m.group(10)) == pytest.approx(plan.predicted_colocated["native"], abs=0.051), name
        assert m.group(11).strip() == _layout(other), name
        assert float(m.group(12)) == pytest.approx(other_plan.predicted_step_s, abs=0.051), name
        if plan.heterogeneous:
            assert m.group(13).strip() == "none (mixed GPUs)"
        else:
            assert m.group(13).strip() == f"{plan.ceiling_s / t:.0%}", name
        mem = memory_plan(cfg)
        assert [int(x) for x in m.group(14).split(" / ")] == [round(p.total / 2**30) for p in mem.pools], name
        assert [int(x) for x in m.group(15).split(" / ")] == [round(p.capacity_gb) for p in mem.pools], name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_recipe_is_the_planners_choice(name):
    """``digen plan --recipe <name>``'s best configuration among every layout (colocated included) is the
    setting's default, and a ``-digen`` variant is its best disaggregated one; each passes ``validate()`` with
    its memory check (every row ``digen plan`` prints does: ``tests/config/test_planning.py``)."""
    from verl_digen.config import planning

    cfg, plan = _dry_run(name)
    checks = [(name, True)] + ([(VARIANT[name], False)] if VARIANT[name].endswith("-digen") else [])
    for recipe, colocated in checks:
        shipped, shipped_plan = _dry_run(recipe)
        planned = planning.plan_config(shipped, keep=1, colocated=colocated)
        best = planned.best
        assert (best.mode == "colocated") == (shipped.trainer.mode == "colocated"), planning.describe(best, planned)
        assert best.result.step_time == pytest.approx(shipped_plan.predicted_step_s, rel=1e-9), \
            planning.describe(best, planned)
        assert planning.apply(shipped, best).schedule_config() == shipped.schedule_config()
        if shipped.trainer.mode == "digen":
            assert (best.generators, best.trainers) == (shipped.resources.generator.workers,
                                                        shipped.resources.trainer.workers)
        validate(planning.apply(shipped, best))  # the memory plan included (ConfigError if it did not fit)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_recipe_with_the_vllm_backend_shows_the_engines_memory_and_startup(name, weights_on_this_machine):
    """The recipes ship rollout.backend=diffusers (recipes/README.md, "Rollout backend"); with rollout.backend=vllm
    each setting's disaggregated recipe validates, and its dry run's memory plan shows the engine's terms within
    its share of the GPU and the engine's start-up price per generator and per restart. A colocated recipe starts
    no engine (its ranks generate through their own weights) and shows none."""
    from verl_digen.config.memory import memory_plan

    digen, colocated = _pair(name)
    assert _dry_run(name)[0].rollout.backend == "diffusers"
    text = memory_plan(_compose(colocated, "rollout.backend=vllm")).render()
    assert "vLLM-Omni engine" not in text and "engine start-up" not in text
    cfg = _compose(digen, "rollout.backend=vllm")
    validate(cfg)
    text = memory_plan(cfg).render()
    gen = re.search(r"vLLM-Omni engine: .*\(rollout.vllm_memory_fraction\): fits; engine weights [\d.]+ GiB, "
                    r"text encoders [\d.]+ GiB, VAE [\d.]+ [GM]iB, engine requests in flight [\d.]+ [GM]iB", text)
    assert gen, text
    workers = cfg.resources.generator.workers
    assert re.search(rf"engine start-up \(rollout.backend=vllm, eager.*\): \d+ s per generator .*paid once per "
                     rf"generator at start \({workers} generators: \d+ GPU-s\) and again per generator restart", text)
