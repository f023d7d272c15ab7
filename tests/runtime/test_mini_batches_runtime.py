"""``actor.ppo_mini_batch_size``: several optimizer steps per global step, on Ray, against verl's loop.

The reference below is verl's PPO update written out in one process, from the same seeds: roll the whole
batch out with the step's weights, score it, take group advantages, (with recompute) the old log-probs of
every row under those weights, then per mini-batch (the batch's prompts in order) a forward/backward of its
rows with the loss averaged over them (Flow-GRPO's per-timestep loop), clip, AdamW step. It shares no
code with the runtime's training path (``sequential_backward``, not TSP; torch's own clipping).
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from runtime_helpers import compose_run, train

import verl_digen
from verl_digen.algo.advantages import group_advantages
from verl_digen.algo.loss import LossConfig
from verl_digen.algo.tsp import recompute_log_probs, sequential_backward
from verl_digen.data import PromptDataset
from verl_digen.reporting.metric_names import step_names
from verl_digen.rewards import build_reward
from verl_digen.schedule import check_timeline
from verl_digen.schedule.actions import OPTIMIZER_STEP, TAG_GENERATE, UPDATE
from verl_digen.workers import actor_memory
from verl_digen.workers import policy as P

#: 4 prompts x 2 samples, 2 mini-batches of 2 prompts, 2 steps; micro-batches of one sample
SHAPE = ["data.train_batch_size=4", "rollout.micro_batch_size=1", "actor.ppo_mini_batch_size=2",
         "trainer.total_steps=2", "actor.lr=0.02"]


def verl_reference(cfg, steps: int) -> dict[str, torch.Tensor]:
    """verl's mini-batch PPO loop over ``steps`` global steps, single process (see the module docstring)."""
    wc = cfg.worker_config()
    model = actor_memory.trainer_policy(wc, torch.device("cpu"), 1, False)
    params = [p for p in model.transformer.parameters() if p.requires_grad]
    o = wc.optim
    opt = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
    reward = build_reward(wc.reward)
    data = PromptDataset.synthetic(cfg.data.synthetic_prompts)
    prompts, n = cfg.data.train_batch_size, cfg.rollout.n
    mini = cfg.actor.ppo_mini_batch_size
    recompute = wc.loss.recompute_old_log_prob
    # the loss against given old log-probs (recomputed below when asked, as verl's compute_log_prob does)
    train_cfg = wc.sampler.train_config(LossConfig(clip_range=wc.loss.clip_range))
    for step in range(steps):
        ids, texts = data.batch(step * prompts, prompts)
        rows = [(ids[p], s) for p in range(prompts) for s in range(n)]
        traj = P.score_trajectories(reward, P.generate_rows(model, wc, step, step, rows,
                                                            [texts[p] for p in range(prompts) for _ in range(n)]))
        traj.advantages, _ = group_advantages(traj.rewards, traj.prompt_ids, cfg.advantage())
        if recompute:
            traj.log_probs = recompute_log_probs(model, traj, train_cfg)
        k = traj.num_trained_steps
        for c in range(prompts // mini):
            part = traj.index(list(range(c * mini * n, (c + 1) * mini * n)))
            sequential_backward(model, part, train_cfg, scale=1.0 / (len(part) * k))
            torch.nn.utils.clip_grad_norm_(params, o.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return {name: p.detach().clone() for name, p in model.transformer.named_parameters()}


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def test_mini_batches_equal_verls_loop_for_digen_with_tag_and_for_colocated(ray_session, tmp_path):
    """With the trainer's own old log-probs (``actor.recompute_log_prob=true``: the later mini-batch's are those
    of the step's starting weights, which the trainer ranks keep), digen and colocated each equal verl's loop.
    With the rollout's (false), both modes are held against the same loop by the MixGRPO test below."""
    # TAG forced on two FSDP2 ranks (each a TAG slot of its own with the full weights it gathered), GAP, TSP
    # and row packing (a mini-batch's two groups as one update, its 8 rows split 4 + 4 over the ranks and
    # trained in passes of 3 + 1 rows across samples): the TAG slots stop after the first mini-batch's
    # optimizer step, the second mini-batch's update waits for it
    digen = compose_run("trainer=digen", *SHAPE, "actor.recompute_log_prob=true", "digen.tag.policy=static:2",
                        "digen.tsp.degree=1", "digen.gap.enable=true", "digen.update_units=2",
                        "digen.tsp.rows_per_pass=3", "resources.trainer.workers=2", tmp_path=tmp_path / "d")
    colocated = compose_run("trainer=colocated", *SHAPE, "actor.recompute_log_prob=true", tmp_path=tmp_path / "c")
    res_d, params_d = train(digen)
    res_c, params_c = train(colocated)
    ref = verl_reference(digen, steps=2)
    assert _gap(params_d, ref) <= 1e-10 and _gap(params_c, ref) <= 1e-10, (_gap(params_d, ref), _gap(params_c, ref))
    # the weights moved in both mini-batches: one optimizer step per global step lands elsewhere
    one_step = verl_reference(compose_run(*SHAPE, "actor.ppo_mini_batch_size=4"), steps=2)
    assert _gap(one_step, ref) > 1e-6
    for res in (res_d, res_c):  # every logged name is in the schema that docs/metrics.md is checked against
        assert all(set(r.metrics) <= step_names() for r in res.reports), [set(r.metrics) for r in res.reports]
    check_timeline(res_d.timeline)
    recs = res_d.timeline.records
    assert [(r.step, r.mini_batch) for r in recs if r.kind == OPTIMIZER_STEP] == [(0, 0), (0, None), (1, 0), (1, None)]
    assert {r.worker for r in recs if r.kind == TAG_GENERATE} == {"tag0", "tag1"}, "TAG was forced on but not on both"
    assert [(r.step, r.mb, r.count) for r in recs if r.kind == UPDATE] == [(0, 0, 4), (0, 4, 4), (1, 0, 4), (1, 4, 4)]
    for m in (r.metrics for r in res_d.reports):
        # the second mini-batch trains weights the first one's optimizer step moved: its ratios are not 1
        assert m["actor/ratio_min"] != m["actor/ratio_max"]
        # against the step's weights, which generated the rows (float64: the same numbers)
        assert m["actor/rollout_logprob_diff_max"] < 1e-9
        assert "actor/grad_norm" in m
    colocated_kinds = [(r.kind, r.mini_batch, r.samples) for r in res_c.timeline.records
                       if r.worker == "col0" and r.kind in (UPDATE, OPTIMIZER_STEP) and r.step == 0]
    assert colocated_kinds == [(UPDATE, None, 4), (OPTIMIZER_STEP, 0, 0), (UPDATE, None, 4), (OPTIMIZER_STEP, None, 0)]
    # and the runs really moved the weights from the trainer's initial ones (built as a trainer rank builds them)
    init = dict(actor_memory.trainer_policy(digen.worker_config(), torch.device("cpu"), 1, False)
                .transformer.named_parameters())
    assert _gap(params_d, {k: v.detach() for k, v in init.items()}) > 1e-6


def test_mix_grpo_mini_batches_equal_verls_loop_with_the_window_sliding(ray_session, tmp_path):
    """MixGRPO (a progressive SDE window of 2 of 6 steps, moving between the global steps) with two mini-batches:
    digen (TAG, GAP, TSP, row packing) and colocated each train what the reference loop trains on the window's
    rows (MixGRPO's digen == colocated equality lives here), with the rollout's old log-probs."""
    common = [*SHAPE, "algorithm.name=mix_grpo", "rollout.num_steps=6", "rollout.train_steps=2",
              "rollout.sample_strategy=progressive"]
    digen = compose_run("trainer=digen", *common, "digen.tag.policy=static:2", "digen.tsp.degree=1",
                        "digen.tsp.rows_per_pass=3", "digen.gap.enable=true", tmp_path=tmp_path / "d")
    assert [digen.sampler().selection.window(6, 0, s) for s in range(2)] == [(2, 4), (4, 6)]
    res, params = train(digen)
    res_c, params_c = train(compose_run("trainer=colocated", *common, tmp_path=tmp_path / "c"))
    ref = verl_reference(digen, steps=2)
    assert _gap(params, ref) <= 1e-10 and _gap(params_c, ref) <= 1e-10, (_gap(params, ref), _gap(params_c, ref))
    for a, b in zip(res.reports, res_c.reports, strict=True):  # step by step, the same reward and loss
        for key in ("reward/mean", "actor/loss"):
            assert abs(a.metrics[key] - b.metrics[key]) <= 1e-10, (key, a.metrics[key], b.metrics[key])
    assert [r for r in res.timeline.records if r.kind == TAG_GENERATE], "TAG was forced on but never ran"
    assert [(r.step, r.mini_batch) for r in res.timeline.records if r.kind == OPTIMIZER_STEP] == [
        (0, 0), (0, None), (1, 0), (1, None)]


def _readers(name: str) -> dict[str, list[int]]:
    """The package's modules whose code (not docstrings) names ``name``: as an attribute or inside a string."""
    root = Path(verl_digen.__file__).parent
    found: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        if name not in source:  # parse only the modules that name it at all
            continue
        tree = ast.parse(source)
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            text = isinstance(node, ast.Constant) and isinstance(node.value, str) and name in node.value
            if (isinstance(node, ast.Attribute) and node.attr == name) or (text and id(node) not in docs):
                found.setdefault(path.relative_to(root).as_posix(), []).append(node.lineno)
    return found


def test_one_mini_batch_of_the_whole_batch_is_todays_run_bit_for_bit():
    """``actor.ppo_mini_batch_size`` = the batch runs today's (unset) run bit for bit, by construction: the two
    configs differ in that key alone, the run reads it only through ``RunConfig.mini_batches()`` (validate checks
    it, the verl-omni converter writes it), and everything the runtime is built from is equal (the schedule
    with its one optimizer step per global step, the workers' config, the loss scale of driver/steps.py)."""
    base = [*SHAPE[:2], "trainer.total_steps=2", "digen.tag.policy=static:1"]
    unset, whole = compose_run(*base), compose_run(*base, "actor.ppo_mini_batch_size=4")
    assert unset.actor.ppo_mini_batch_size is None and whole.actor.ppo_mini_batch_size == 4
    assert unset.mini_batches() == whole.mini_batches() == 1
    assert unset.schedule_config() == whole.schedule_config() and unset.worker_config() == whole.worker_config()
    assert set(_readers("ppo_mini_batch_size")) == {"config/schema.py", "config/validate.py",
                                                     "integrations/verl_omni/convert.py"}
    schema = Path(verl_digen.__file__).parent / "config" / "schema.py"
    method = next(n for n in ast.walk(ast.parse(schema.read_text()))
                  if isinstance(n, ast.FunctionDef) and n.name == "mini_batches")
    reads = [line for line in _readers("ppo_mini_batch_size")["config/schema.py"]
             if not method.lineno <= line <= method.end_lineno]
    assert all("mini_batches" in schema.read_text().splitlines()[line - 1] for line in reads), reads  # its name table


def test_mini_batches_under_tcss_keep_one_version_per_trajectory_and_the_bound(ray_session, tmp_path):
    """TCSS counts published versions: a mini-batch's optimizer step publishes nothing, so a stale row is
    still exactly one version old and the step's stale share stays within the bound."""
    cfg = compose_run("trainer=digen", *SHAPE[:2], "actor.ppo_mini_batch_size=2", "trainer.total_steps=3",
                      "digen.tcss.staleness=0.5", "digen.tag.policy=never", tmp_path=tmp_path)
    result, _ = train(cfg)
    check_timeline(result.timeline, staleness_bound=0.5)
    recs = result.timeline.records
    stale = [r for r in recs if r.stale]
    assert stale and all(r.version == r.step - 1 for r in stale)
    assert sorted({r.version for r in recs if r.kind == "weight_sync"}) == [1, 2]  # one publish per global step
    assert len([r for r in recs if r.kind == OPTIMIZER_STEP]) == 6
    assert all(r.metrics["digen/stale_fraction"] <= 0.5 for r in result.reports)
