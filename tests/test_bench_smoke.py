"""Benchmarks must keep running: one fast pass of each, checking the JSON contract of its last line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _last_json(args: list[str]) -> list[dict]:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _last_json_in_process(args: list[str]) -> list[dict]:
    """``_last_json`` for a bench run that starts nothing (no Ray, no child process) and changes no process-wide
    state (``sys.path``, ``os.environ``, torch's settings): its ``__main__`` run here, without an interpreter and
    its imports (torch, Hydra, the schedule: ~1.5-2.5 s of CPU per run on 2 cores). ``bench/tsp.py`` (it re-executes
    itself) and ``bench/sim_sweep.py`` (it puts ``bench/`` on ``sys.path``) are among those that keep a process."""
    import contextlib
    import io
    import runpy

    out, saved = io.StringIO(), sys.argv
    sys.argv = [str(ROOT / args[0]), *args[1:]]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(ROOT / args[0]), run_name="__main__")
    finally:
        sys.argv = saved
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_tsp_bench_emits_rows():
    rows = _last_json(["bench/tsp.py", "--json", "--reps", "1", "--warmup", "0", "--archs", "flux", "wan",
                       "--k", "2", "--batch", "2", "--latent", "8"])
    assert [r["arch"] for r in rows] == ["flux", "wan"]
    assert all(r["speedup"] > 0 and r["seq_ms"] > 0 and r["tsp_ms"] > 0 for r in rows)


def test_sim_sweep_and_ladder_emit_their_row_fields():
    sweep = _last_json(["bench/sim_sweep.py", "--json", "--steps", "1"])
    assert {r["trainer_ranks"] for r in sweep} == {1, 4}
    assert all({"speedup_vs_never", "trainer_idle_never", "fraction_of_ideal"} <= r.keys() for r in sweep)
    ladder = _last_json_in_process(["bench/ladder.py", "--json", "--steps", "1"])
    nft = {r["preset"]: r for r in ladder if r["rung"] == "DiffusionNFT"}  # priced apart: its own baseline
    assert set(nft) == {"flux-12b-32", "qwen-image-20b-32"}  # one per image recipe
    assert all(r["step_s"] > 0 and r["colocated_verl_omni_s"] > 0 and r["row_forwards"] == 2 for r in nft.values())
    ladder = [r for r in ladder if r["rung"] != "DiffusionNFT"]
    rungs = [r["rung"] for r in ladder if r["preset"] == "hunyuanvideo-13b-hetero" and r["source"] == "preset"]
    assert rungs == ["colocated:ideal", "colocated:native", "colocated:verl-omni", "colocated:verl-omni-bypass",
                     "naive (separate)", "+GAP", "+TSP", "+TAG (bts)", "+TCSS (0.25)"]
    assert all(r["step_s"] > 0 and r["speedup_vs_naive"] > 0 for r in ladder)
    vo = {(r["source"], r["preset"]): r["step_s"] for r in ladder if r["rung"] == "colocated:verl-omni"}
    assert all(r["speedup_vs_colocated"] == pytest.approx(vo[r["source"], r["preset"]] / r["step_s"])
               for r in ladder if r["rung"] != "as shipped")
    shipped = {r["preset"]: r for r in ladder if r["rung"] == "as shipped"}
    for name, r in shipped.items():
        assert {"vs_verl_omni", "vs_verl_omni_bypass", "vs_colocated_ideal", "baseline_memory"} <= r.keys(), name
        # a baseline that does not fit its GPUs by the memory plan is no ratio
        for b, key in (("verl-omni", "vs_verl_omni"), ("verl-omni-bypass", "vs_verl_omni_bypass"),
                       ("ideal", "vs_colocated_ideal"), ("native", "speedup_vs_colocated_native")):
            fits = r["baseline_memory"][b]["fits"] is not False
            assert (b not in r["unfit_baselines"]) == fits and (r[key] is None) == (not fits), (name, b)
            assert fits or r["strongest_baseline"] != f"colocated:{b}", name  # a subset run may be it
        assert r["vs_verl_omni"] == r["speedup_vs_colocated"]
        if r["vs_verl_omni"] is not None:
            assert r["vs_verl_omni_bypass"] < r["vs_verl_omni"]
        assert ("vs_best_subset" in r) == (name == "hunyuanvideo-13b-hetero"), name
        # the strongest baseline leads: never weaker than any user baseline that fits all GPUs (nor, mixed, its subset)
        assert r["vs_strongest"] == pytest.approx(min(x for x in (r["vs_verl_omni"], r["vs_verl_omni_bypass"],
                                                                  r["speedup_vs_colocated_native"],
                                                                  r.get("vs_best_subset_bypass"),
                                                                  r.get("vs_best_subset")) if x is not None)), name
        assert r["mode"] in ("colocated", "digen") and r["strongest_baseline"], name
        # a disaggregated layout's own bound: no schedule of it is faster, so its ratio is the most it could reach
        assert (r["bound_s"] is None) == (r["mode"] == "colocated"), name
        if r["bound_s"] is not None:
            assert 0 < r["bound_s"] <= r["step_s"] + 1e-9 and r["vs_strongest_bound"] >= r["vs_strongest"], name
    # HunyuanVideo on 48 GB cards: verl-omni holds a generation copy + text encoders like trainer=colocated, over
    # the planner's 90 % on every GPU: the strongest that fits is the native loop
    for name in ("hunyuanvideo-13b-16", "hunyuanvideo-13b-32"):
        r = shipped[name]
        assert r["vs_verl_omni_bypass"] is None and r["strongest_baseline"] == "colocated:native", name
    # the homogeneous image settings ship trainer=colocated (the planner's choice), the hetero one digen
    assert (shipped["flux-12b-32"]["mode"], shipped["hunyuanvideo-13b-hetero"]["mode"]) == ("colocated", "digen")
    assert shipped["hunyuanvideo-13b-hetero"]["best_subset_pool"] == "trainer"
    assert 1 < shipped["hunyuanvideo-13b-hetero"]["vs_separate_verl_omni_bypass"]
    hetero = shipped["hunyuanvideo-13b-hetero"]  # verl-omni on all 16 does not fit the 48 GB cards
    assert hetero["vs_verl_omni"] is None and 1 < hetero["vs_best_subset"] < hetero["baseline_step_s"]["verl-omni"] / \
        hetero["step_s"]


def test_calibration_bench_emits_its_rows():
    rows = _last_json_in_process(["bench/calibration.py", "--json"])
    assert all({"figure", "published", "model", "error", "role", "note"} <= r.keys() for r in rows)
    held = [r for r in rows if r["role"] == "held_out"]
    assert len(held) >= len(rows) / 2 and {r["role"] for r in rows} == {"fit", "held_out"}


def test_e2e_bench_predicts_every_mode_from_the_digen_profile(tmp_path):
    args = ["bench/e2e_cpu.py", "--json", "--rounds", "1", "--steps", "2", "--modes", "digen", "separate"]
    rows = _last_json([*args, "--out", str(tmp_path)])
    assert [r["mode"] for r in rows] == ["digen", "separate"]
    assert all(r["step_s"] > 0 and r["predicted_step_s"] > 0 and r["cross_predicted_step_s"] > 0 for r in rows)
    # the digen row's cross prediction is its own profile's prediction
    assert rows[0]["cross_prediction_error"] == rows[0]["prediction_error"] and rows[0]["transfer_error"] == 0
    probes = json.loads((tmp_path / "round1" / "digen" / "digen_probes.json").read_text())["samples"]
    # the probe ran the trainer's own pass (2 sizes), optimizer step and switch (stash and gather) sharded over 2 of
    # the run's processes, and the digen profile prices each per collective from them
    work = [p for p in probes if p["kind"] == "sharded_work"]
    assert sorted(p["work"] for p in work) == ["pass", "pass", "step", "switch"]
    assert all(p["sharded"] > 0 and p["plain"] > 0 and p["alone"] > 0 for p in work)
    # and generations (each with its own time alone just before) and scores two at once, through Ray as the run's
    paired = [p for p in probes if p["kind"] == "paired"]
    assert {(p["action"], p["beside"]) for p in paired} == {("generate", "tag_generate"), ("tag_generate", "generate"),
                                                            ("score", "score")}
    assert all(p["seconds"] > 0 and (p["action"] == "score" or p["alone"] > 0) for p in paired)
    sharded = json.loads((tmp_path / "round1" / "digen" / "digen_profile.json").read_text())["sharded"]
    assert sharded["switch_latency"] > 0 and sharded["step_calls"] == 2
    # the same table again from what the run kept, every profile fitted again: the same steps and predictions
    # (no Ray and nothing to start: in this process, which has imported what the bench imports)
    again = _last_json_in_process([*args, "--refit", str(tmp_path)])
    for key in ("step_s", "predicted_step_s", "cross_predicted_step_s"):
        assert [r[key] for r in again] == pytest.approx([r[key] for r in rows], rel=1e-9)


def test_tcss_learning_bench_summarizes_and_plots_saved_curves(tmp_path):
    """The study's analysis from a saved curves file (the runs themselves take half an hour): rows are
    measured against the same seed's sync run, and the figure is written."""
    def run(staleness, seed, curve):
        n = len(curve)
        return {"reward": "latent_target", "staleness": staleness, "seed": seed, "steps": n, "curve": curve,
                "step_times": [0.5] * n, "stale": [0.0] + [0.25 if staleness else 0.0] * (n - 1)}

    runs = [run(0.0, 0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0]),
            run(0.5, 0, [0.0, 0.0, 0.0, 0.3, 0.6, 0.9, 0.9, 0.9])]
    curves = tmp_path / "runs.jsonl"
    curves.write_text("".join(json.dumps(r) + "\n" for r in runs))
    png = tmp_path / "tcss.png"
    rows = _last_json(["bench/tcss_learning.py", "--from", str(curves), "--plot", str(png), "--json"])
    sync, stale = rows
    assert sync["final_reward"] == 1.0 and stale["final_reward"] == pytest.approx(0.9)
    # 3-step trailing means: sync reaches 0.5 (half its gain) at step 5 (0.6), the stale run at step 6
    assert (sync["steps_to_half"], stale["steps_to_half"]) == (5, 6)
    assert sync["time_to_sync_final_s"] == 4.0 and stale["time_to_sync_final_s"] is None  # never reaches 1.0
    assert (sync["stale_fraction"], stale["stale_fraction"]) == (0.0, 0.25)
    assert png.stat().st_size > 0


def test_algo_curves_bench_parses_a_run_and_summarizes_saved_runs(tmp_path):
    """The per-algorithm learning table from the entry point's own step lines and from a saved runs file (the
    runs themselves take about 20 s each): quarters as the run's summary takes them, a run that did not finish
    counted apart."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("algo_curves", ROOT / "bench" / "algo_curves.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = "\n".join(f"step {i}/8  reward={r}+-0.02  loss=1e-09  step_s=0.18" for i, r in
                     enumerate([-0.02, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.61], start=1))
    curve = mod.parse_curve("(GeneratorWorker pid=1) INFO: started\n" + out + "\nreward (first quarter)  -0.01")
    assert len(curve) == 8 and mod.quarters(curve) == pytest.approx((-0.01, 0.555))

    def run(name, seed, rc, curve):
        first, last = mod.quarters(curve) if curve else (None, None)
        return {"algorithm": name, "seed": seed, "steps": 8, "rc": rc, "run_s": 20.0, "curve": curve,
                "first_quarter": first, "last_quarter": last, "rises": None if first is None else last > first}

    runs = [run("cps", 0, 0, curve), run("cps", 1, 0, curve[::-1]), run("mix_grpo", 0, 1, [])]
    saved = tmp_path / "runs.jsonl"
    saved.write_text("".join(json.dumps(r) + "\n" for r in runs))
    res = _last_json(["bench/algo_curves.py", "--from", str(saved), "--json"])
    assert [r["seed"] for r in res["runs"]] == [0, 1, 0]
    assert res["algorithms"]["cps"] == {"seeds": [0, 1], "exit_0": 2, "rises": 1, "mean_gain": pytest.approx(0.0),
                                       "min_gain": pytest.approx(-0.565)}
    assert res["algorithms"]["mix_grpo"]["exit_0"] == 0 and res["algorithms"]["mix_grpo"]["mean_gain"] is None


def test_soak_bench_simulated_run_emits_its_row():
    (row,) = _last_json(["bench/soak.py", "--json", "--skip-real", "--sim-steps", "40"])
    assert row["run"] == "sim" and row["steps"] == 40 and set(row["rss_mb"]) == {"driver"}
    assert row["driver_ms_per_step"] > 0 and row["driver_ms_growth"] > 0 and row["rss_growth"] > 0
    assert set(row["rss_kb_per_step_second_half"]) == {"driver"}


def test_soak_second_half_slope_ignores_the_warm_up():
    import importlib.util

    spec = importlib.util.spec_from_file_location("soak_bench", ROOT / "bench" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    warm = [1e6 * min(i, 50) for i in range(100)]  # grows 1 MB a step for 50 steps, then flat
    assert soak._late_slope_kb(warm) == 0.0
    assert soak._late_slope_kb([2048.0 * i for i in range(100)]) == pytest.approx(2.0)


def test_soak_growth_after_the_warm_up_leaves_the_first_steps_out():
    import importlib.util

    spec = importlib.util.spec_from_file_location("soak_bench", ROOT / "bench" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    warm = [1e6 * min(i, 50) + 1024.0 * i for i in range(400)]  # 1 MB a step for 50 steps, then 1 KB a step
    assert soak._kb_per_step(warm) > 10 and soak._kb_per_step(warm, 100) == pytest.approx(1.0)
    row = soak._row("x", 400, [1.0] * 400, {"driver": warm}, 1.0, 100, (warm, [0.0] * 400))
    assert row["steps_after_warmup"] == 300 and row["rss_kb_per_step_after_warmup"]["driver"] == pytest.approx(1.0)
    assert row["driver_private_kb_per_step_after_warmup"] == pytest.approx(1.0)
    assert row["driver_shared_kb_per_step"] == 0.0
    assert row["rss_kb_per_step_fit_after_warmup"]["driver"] == pytest.approx(1.0)
    assert row["driver_private_kb_per_step_fit_after_warmup"] == pytest.approx(1.0)
    assert soak._slope_kb(warm, 100) == pytest.approx(1.0) and soak._slope_kb(warm) > 10
    # one 128 KB jump (a heap extension) near the end of a flat run: the tenths' medians read it as nothing or
    # as ~0.5 KB a step as it falls two steps apart; the fit over every sample moves smoothly with it
    early, late = ([0.0] * (300 - n) + [131072.0] * n for n in (16, 14))
    assert soak._kb_per_step(early) > 0.45 and soak._kb_per_step(late) == 0.0
    assert 0.1 < soak._slope_kb(late) < soak._slope_kb(early) < 0.14
    assert "warmup_steps" not in soak._row("x", 40, [1.0] * 40, {"driver": warm[:40]}, 1.0, 100)
    private, shared = soak._status_kb()
    assert private > 0 and shared >= 0  # Linux: this process's RssAnon and RssShmem
    assert soak._heap_in_use() > 0  # glibc: the C heap's bytes in use
    in_use = [2048.0 * i for i in range(400)]
    row = soak._row("x", 400, [1.0] * 400, {"driver": warm}, 1.0, 100, (warm, [0.0] * 400, in_use))
    assert row["driver_heap_in_use_kb_per_step_fit_after_warmup"] == pytest.approx(2.0)
    # the fit's standard error: none on a straight line, some on a step; the target reads the driver's fit
    assert row["driver_heap_in_use_kb_per_step_fit_after_warmup_se"] == pytest.approx(0.0, abs=1e-9)
    assert soak._fit_kb(late)[1] > 0.01 and soak._fit_kb(warm, 100) == pytest.approx((1.0, 0.0), abs=1e-9)
    verdict = soak.target(row)
    assert verdict["kb_per_step"] == pytest.approx(1.0) and verdict["steps"] == 300 and verdict["met"]
    assert not soak.target(soak._row("x", 400, [1.0] * 400, {"driver": in_use}, 1.0, 100))["met"]  # 2 KB a step


def test_soak_ray_alone_row_takes_the_object_store_path_the_run_takes():
    """The Ray-alone row puts in the object store as many results a step as the run keeps there (its
    generations' trajectories and its publishes), each over Ray's inline limit (100 KiB), so the driver owns
    store objects in both rows (docs/benchmarks.md, "Soak", fifth pass)."""
    import importlib.util

    from verl_digen.schedule.timeline import Record

    spec = importlib.util.spec_from_file_location("soak_bench", ROOT / "bench" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    kinds = ["generate", "tag_generate", "score", "update", "optimizer_step", "publish", "weight_sync", "generate"]
    records = [Record("w", k, None, 0, 0, 0.0, 1.0) for k in kinds]
    assert soak.store_results_per_step(records, 2) == 2.0  # 2 generations, 1 TAG generation, 1 publish
    assert soak.STORE_RESULT_BYTES > 100 * 1024


def test_weight_sync_bench_emits_its_rows_and_the_relay_spares_the_trainer():
    rows = _last_json(["bench/weight_sync.py", "--json", "--gib", "0.004", "--bucket-mb", "1", "--generators", "1",
                       "2", "--no-object-store"])
    assert [(r["backend"], r["generators"]) for r in rows] == [("collective", 1), ("collective", 2)]
    for r in rows:
        assert r["identical"] is True and r["gb_per_s"] > 0 and r["limit_gb_per_s"] > 0
        assert r["hashed_bytes"] == r["host_copy_bytes"] == 0 and r["staging_buckets"] <= 2
    two = rows[1]  # direct: the trainer sends the model to each generator; relayed: once
    assert two["trainer_sent_bytes_direct"] == 2 * two["model_bytes"] and two["trainer_sent_over_model"] == 1.0


def test_tag_policy_scaling_holds_the_shipped_policies():
    """Every disaggregated recipe's TAG policy is within 5 % of the best policy at 0.5-4x its batch and GPUs
    (hunyuanvideo-13b-16 ships ``never`` because TAG does not fit its trainer GPUs; this bench checks no memory)."""
    rows = _last_json_in_process(["bench/tag_policy_scaling.py", "--json", "--steps", "1"])
    assert {r["factor"] for r in rows} == {0.5, 1, 2, 4} and {r["scale"] for r in rows} == {"batch", "gpus"}
    for r in rows:
        best = min(r["step_never"], r["step_adaptive"], r["step_bts"])
        assert r["shipped_vs_best"] == pytest.approx(r[f"step_{r['policy']}"] / best)
        if r["policy"] != "never":
            assert r["shipped_vs_best"] <= 1.05, r


def test_the_vllm_check_takes_json_and_says_where_it_runs():
    """bench/vllm_check.py has the benches' --json; without vllm-omni (this machine) it says where it runs,
    in one line, instead of failing inside the engine's imports."""
    import importlib.util

    if importlib.util.find_spec("vllm_omni") is not None:
        pytest.skip("vllm-omni is installed: the tier's tests run the check itself")
    out = subprocess.run([sys.executable, "bench/vllm_check.py", "--device", "cpu", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "scripts/vllm_tier.sh install" in out.stderr and "Traceback" not in out.stderr
    helped = subprocess.run([sys.executable, "bench/vllm_check.py", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert helped.returncode == 0 and "--json" in helped.stdout


def test_soak_real_run_samples_at_the_hook_the_runtime_calls():
    """The real soak samples memory where each step's report is recorded: ``RunOutputs.report``, which the
    runtime calls once a step (the soak once hooked a method a refactor had removed, and only its real run,
    not the suite, would have failed)."""
    import importlib.util
    import inspect

    from verl_digen.driver.outputs import RunOutputs
    from verl_digen.driver.runtime import DigenRuntime

    spec = importlib.util.spec_from_file_location("soak_bench", ROOT / "bench" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    assert list(inspect.signature(RunOutputs.report).parameters) == ["self", "result", "step", "metrics"]
    assert "RunOutputs.report" in inspect.getsource(soak.soak_real)
    assert "self.outputs.report(" in inspect.getsource(DigenRuntime)
