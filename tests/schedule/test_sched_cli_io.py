"""Presets, the profile format, exports and the ``digen`` command line."""

from __future__ import annotations

import io
import json
import re

import pytest

from verl_digen.cli import StatusLine, main
from verl_digen.schedule import presets
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.export import chrome_trace, save_gantt_png
from verl_digen.schedule.profile_io import dump_profile, load, load_profile, model_from_dict, model_to_dict
from verl_digen.schedule.simulator import run_ablation, simulate
from verl_digen.schedule.timeline import check_timeline


def test_every_preset_simulates_the_whole_ladder_and_keeps_invariants():
    assert {"flux-12b-16", "qwen-image-20b-32", "wan2.1-14b-16", "hunyuanvideo-13b-32",
            "hunyuanvideo-13b-hetero"} <= set(presets.names())
    for name in presets.names():
        p = presets.get(name)
        wl = p.workload
        base = ScheduleConfig(prompts=wl.prompts, group_size=wl.group_size, mb_size=wl.mb_size, steps=2)
        results = run_ablation(base, p.model, wl.mb_size, wl.tsp_degree, "bts", wl.staleness)
        assert [r.label for r in results][:6] == ["colocated:ideal", "colocated:native", "colocated:verl-omni",
                                                  "colocated:verl-omni-bypass", "naive (separate)", "+GAP"]
        for r in results[4:]:
            check_timeline(r.timeline, r.config.staleness)
            assert 0 < r.fraction_of_ideal <= 1 + 1e-9
        naive, tag = results[4].step_time, results[7].step_time
        assert tag < naive  # pipelining + TSP beat naive disaggregation in every preset
    with pytest.raises(ValueError, match="unknown preset"):
        presets.get("sdxl")


def test_profile_round_trip_and_measured_samples(tmp_path):
    p = presets.get("hunyuanvideo-13b-hetero")
    for ext in ("yaml", "json"):
        path = tmp_path / f"prof.{ext}"
        dump_profile(p.model, path, name="x", workload=p.workload)
        model, wl = load(path)
        assert model == p.model and wl == p.workload
        assert load_profile(path) == p.model
    d = model_to_dict(p.model)
    d["samples"] = [
        {"pool": "generator", "kind": "generate", "size": 1, "seconds": 40.0},
        {"pool": "generator", "kind": "generate", "size": 3, "seconds": 100.0},
        {"kind": "weight_sync", "seconds": 3.0},
        {"kind": "weight_sync", "seconds": 5.0},
        {"kind": "update", "size": 8, "tsp_degree": 4, "seconds": 30.0},
    ]
    fitted, _ = model_from_dict(d)
    assert fitted.generator.hardware.generate.fixed == pytest.approx(10.0)
    assert fitted.generator.hardware.generate.per_unit == pytest.approx(30.0)
    assert fitted.weight_sync == pytest.approx(4.0)
    costs = fitted.stage_costs(1, 4, update_samples=8)
    assert costs.update == pytest.approx(30.0)
    bad = dict(d, samples=[{"kind": "nap", "seconds": 1}])
    with pytest.raises(ValueError, match="unknown kind"):
        model_from_dict(bad)
    with pytest.raises(ValueError, match="generator"):
        model_from_dict({"trainer": {"workers": 1}})
    with pytest.raises(ValueError, match=">= 0"):
        model_from_dict(dict(model_to_dict(p.model), weight_sync=-1))


def test_chrome_trace_and_gantt(tmp_path):
    p = presets.get("wan2.1-14b-16")
    cfg = ScheduleConfig(prompts=4, group_size=8, mb_size=1, steps=2, tsp_degree=4, policy="bts", staleness=0.25)
    res = simulate(cfg, p.model)
    trace = chrome_trace(res.timeline)
    json.dumps(trace)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(res.timeline.records)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert names == set(res.timeline.workers)  # one track per worker
    png = tmp_path / "g.png"
    save_gantt_png(res.timeline, png, title="t")
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_cli_simulate_plan_and_errors(tmp_path, capsys):
    trace, png, prof = tmp_path / "t.json", tmp_path / "g.png", tmp_path / "p.yaml"
    assert main(["simulate", "--preset", "flux-12b-16", "--steps", "2", "--trace", str(trace), "--png", str(png),
                 "--dump-profile", str(prof), "--json"]) == 0
    out = capsys.readouterr().out
    rows = json.loads(out.strip().splitlines()[-1])
    assert [r["label"] for r in rows][:5] == ["colocated:ideal", "colocated:native", "colocated:verl-omni",
                                              "colocated:verl-omni-bypass", "naive (separate)"]
    assert [r["rung"] for r in rows][5:8] == ["+GAP", "+TSP", "+TAG (bts)"] and {r["preset"] for r in rows} == {
        "flux-12b-16"}
    naive, vo = rows[4]["step_s"], rows[2]["step_s"]
    assert all(r["speedup_vs_naive"] == pytest.approx(naive / r["step_s"]) for r in rows)
    assert all(r["speedup_vs_colocated"] == pytest.approx(vo / r["step_s"]) for r in rows)  # default verl-omni
    assert all(r["speedup_vs_colocated_native"] == pytest.approx(rows[1]["step_s"] / r["step_s"]) for r in rows)
    assert "+TCSS (0.25)" in out and trace.exists() and png.exists()
    assert main(["simulate", "--profile", str(prof), "--only", "digen", "--policy", "adaptive"]) == 0
    capsys.readouterr()
    assert main(["simulate", "--profile", str(prof), "--nics-per-node", "8"]) == 2
    assert "--nics-per-node change how a preset is derived" in capsys.readouterr().err
    assert main(["plan", "--preset", "qwen-image-20b-16", "--gpus", "6", "--top", "3", "--json"]) == 0
    plan_rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(plan_rows) == 3 and all(r["generators"] + r["trainers"] == 6 for r in plan_rows)
    assert plan_rows[0]["step_time"] <= plan_rows[-1]["step_time"]
    assert main(["simulate", "--staleness", "2"]) == 2
    assert main(["simulate", "--policy", "sometimes"]) == 2
    assert "unknown TAG policy" in capsys.readouterr().err


def test_cli_single_modes_take_any_micro_batch_size(capsys):
    """--only colocated / separate used to fail unless --mb-size was a multiple of the group size."""
    for mode in ("colocated", "separate", "digen"):
        assert main(["simulate", "--preset", "wan2.1-14b-16", "--only", mode, "--mb-size", "2", "--steps", "2",
                     "--json"]) == 0, mode
        (row,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert row["mode"] == mode and row["step_s"] > 0
    assert main(["simulate", "--preset", "wan2.1-14b-16", "--only", "colocated", "--baseline", "native",
                 "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["baseline"] == "native" and row["rung"] == "colocated:native"


@pytest.mark.slow
def test_plan_keeps_a_heterogeneous_cluster_and_says_when_colocated_wins(capsys):
    assert main(["plan", "--preset", "hunyuanvideo-13b-hetero", "--top", "4", "--json"]) == 0
    out = capsys.readouterr().out
    rows = json.loads(out.strip().splitlines()[-1])
    assert {(r["generators"], r["trainers"]) for r in rows} == {(8, 8)}  # 9 A + 7 C would be another cluster
    assert "pools fixed by the hardware" in out
    assert main(["plan", "--preset", "hunyuanvideo-13b-hetero", "--gpus", "12"]) == 2
    assert "fixed by its hardware" in capsys.readouterr().err
    # this runtime's own colocated mode (TSP, no engine, no recompute) is the fastest layout of this small batch
    assert main(["plan", "--preset", "wan2.1-14b-32", "--top", "1", "--stalenesses", "0"]) == 0
    assert "recommendation: trainer=colocated on all 32 GPUs" in capsys.readouterr().out
    # among disaggregated splits: one NIC per node, FSDP over the whole cluster crosses the thin network ...
    assert main(["plan", "--preset", "wan2.1-14b-32", "--top", "1", "--stalenesses", "0", "--no-colocated",
                 "--baseline", "verl-omni"]) == 0
    thin = capsys.readouterr().out
    assert "recommendation: digen" in thin
    # ... eight NICs per node: colocated training loses little by spanning every GPU; digen's edge shrinks
    # to what verl-omni pays beyond the ideal, and the plan says an idealized colocated run would win
    assert main(["plan", "--preset", "wan2.1-14b-32", "--top", "1", "--stalenesses", "0",
                 "--nics-per-node", "8", "--no-colocated", "--baseline", "verl-omni"]) == 0
    fat = capsys.readouterr().out

    def edge(out: str) -> float:
        return float(re.search(r"recommendation: digen.*: ([0-9.]+)x colocated:verl-omni", out).group(1))

    assert 1.0 <= edge(fat) < edge(thin) and "FSDP traffic per training pass" in fat
    assert "an idealized colocated run" in fat and "an idealized colocated run" not in thin
    # topology knobs re-derive a preset; a measured profile cannot be re-derived
    assert main(["simulate", "--profile", "nonexistent.yaml"]) == 2
    assert "neither a preset" in capsys.readouterr().err



def test_table_columns_stay_aligned_when_a_baseline_is_missing(capsys):
    """``--only`` leaves the ratio columns without a baseline: each value, "-" too, ends where its header
    ends (the columns are right-aligned)."""
    assert main(["simulate", "--preset", "wan2.1-14b-16", "--only", "digen"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("configuration"))
    header, row = lines[head], lines[head + 2]
    assert row.startswith("digen ") and len(row) == len(header)
    for label in ("step (s)", "samples/GPU/s", "vs colo*", "vs naive", "of ideal", "gen bubble", "trn bubble"):
        end = header.index(label) + len(label)
        assert row[end - 1] != " " and row[end:end + 1] in ("", " "), f"{label!r} column: {row!r}"
    assert row.split()[3:5] == ["-", "-"]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_search_progress_is_one_line_on_a_terminal_and_plain_lines_in_a_file():
    tty, log = _Tty(), io.StringIO()
    for stream in (tty, log):
        with StatusLine(stream) as progress:
            progress("simulated 50")
            progress("simulated 100")
    assert tty.getvalue() == "\r\033[K  simulated 50\r\033[K  simulated 100\n"
    assert log.getvalue() == "  simulated 50\n  simulated 100\n"
