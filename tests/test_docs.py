"""The user docs cannot rot: their keys, metric names and commands are checked against the code.

(a) ``docs/config.md`` has a table row for every key of the run-config schema (``RunConfig``), with the
    default ``python -m verl_digen.main`` really uses, and no row for a key the schema lacks.
(b) ``docs/metrics.md`` names every metric the runtime logs (read from the runtime's source, so a new key
    cannot slip through) and no metric the runtime does not log.
(c) Every shell command in a ```bash block of README.md and docs/*.md runs and exits 0. The rules:

    - a command is one line of a ```bash block; a line ending in ``\\`` continues on the next one;
      blank lines and lines starting with ``#`` (comments) are not commands;
    - a block whose fence is preceded (nearest non-blank line above) by ``<!-- gpu-only -->`` is not run:
      it needs a GPU cluster (GPU launch commands are checked by the recipe dry-run test). Its
      ``python -m verl_digen.main`` overrides are still composed and validated, in-process;
    - a leading ``bash scripts/install.sh && `` is stripped (CI ran the install before the tests);
    - ``python -m pytest ...`` is not run (it is what is running);
    - a command in ``SKIP`` is not run, for the reason given there;
    - a command in ``SHORTEN`` runs with the overrides listed there appended, for the reason given there
      (README's main job, 3 of its 10 steps; the other training commands in the docs are short already);
    - identical commands run once (README's main job is repeated in the quickstart);
    - commands run in order (README.md first, then docs/*.md by name, each file top to bottom), in the
      repository root, and write only under the git-ignored ``outputs/`` (checked: no new untracked file
      appears); later commands may read what earlier ones wrote (``outputs/trace/digen_profile.json``);
    - README's main job and every command that is not ``digen`` or ``python -m verl_digen.main`` run in a
      shell, as a newcomer types them; the other ``digen`` and ``python -m verl_digen.main`` commands run in
      this process through the same entry points (``verl_digen.cli.main``, the Hydra main) with their
      exit code and output captured, on the suite's Ray session: no interpreter, import and Ray start-up
      per command (the console script and ``python -m`` themselves are run by README's main job and by
      ``tests/test_packaging.py``). The shell commands join that Ray session too (``RAY_ADDRESS``): a run's
      own head, what a newcomer's first run starts, is started and stopped by the ``python -m
      verl_digen.main`` runs of ``tests/runtime/test_cluster_stop_runtime.py``;
    - where a command prints a table, its output must contain the word listed in ``EXPECT``;
    - each command's output is kept in ``outputs/test_docs/NN.log``.

    All commands together take about 1.5 minutes on 2 cores, most of it worker start-up of the five real
    training runs.
(d) README keeps its two set-up commands, and every relative link in README.md and docs/*.md resolves
    (file and heading anchor).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MODES = ("digen", "colocated", "separate")
GPU_ONLY = "<!-- gpu-only -->"
INSTALL_PREFIX = "bash scripts/install.sh && "
MAIN = "python -m verl_digen.main"

#: commands that are never run here: command -> reason
SKIP: dict[str, str] = {
    # docs/migrating-from-verl-omni.md: a template with a placeholder for a recipe's own overrides; it
    # also needs verl-omni and the recipe's model. The mapping it relies on is tested in
    # tests/integrations/test_verl_omni_integration.py.
    "python3 -m verl_omni.trainer.main_diffusion_v1 <the recipe's existing overrides, unchanged> "
    "trainer.use_v1=true trainer.v1.trainer_mode=digen +trainer=digen +resources.generator.workers=1 "
    "+resources.trainer.workers=1 algorithm.global_std=False "
    "data.train_files=$WORKSPACE/data/ocr/sd3/prompts.jsonl +reward.name=ocr":
        "verl-omni template with a placeholder; the mapping is covered by test_verl_omni_integration.py",
    "python3 -m verl_omni.trainer.main_diffusion_v1 <your script's overrides> trainer.use_v1=true "
    "trainer.v1.trainer_mode=digen +trainer=digen +resources.generator.workers=G +resources.trainer.workers=R "
    "algorithm.global_std=False":
        "the same template (the guide's opening); tests/integrations/test_verl_omni_real.py runs four scripts with it",
    # commands another test runs as they are written here, with more checks than an exit code and one word
    "python bench/gpu_check.py --device cpu --quick --json":
        "tests/test_gpu_check.py runs this very command and checks that every check passes",
    "recipes/launch/hunyuanvideo-13b-hetero.sh trainer.dry_run=true":
        "tests/test_recipes.py::test_dry_run_through_the_command_line runs it (launch script -> run.sh -> "
        "python -m verl_digen.main) and checks its config, plan and prediction",
}

#: commands run with extra overrides appended: command -> (overrides, reason)
SHORTEN: dict[str, tuple[str, str]] = {
    # README's main job (and the quickstart's, the same line): as typed, in a shell, with a Ray head of its
    # own; 3 of its 10 steps still end in the summary table, print the console blocks whose metric names are
    # checked against docs/metrics.md, and leave the trace, profile and curves the later commands read (that
    # the reward rises over a run is held by
    # tests/runtime/test_runtime.py::test_reward_rises_over_a_short_digen_run_whose_driver_holds_only_a_window)
    MAIN: ("trainer.total_steps=3", "the whole main job, run after run, adds 7 steps of the same work"),
}

#: appended to the main job's commands: the console block names every metric a run logs, which the test
#: checks against docs/metrics.md (the one-line format, the default off a terminal, names a few)
BLOCK_LOG = "trainer.log_format=block"

#: command prefix -> a word its output must contain
EXPECT: dict[str, str] = {
    "python -m verl_digen.main trainer.total_steps=3 trainer.resume_from=": "resumed from",
    "digen simulate": "configuration",
    "digen plan": "gen train",
}
#: a training run ends with the summary table; a dry run prints the resource plan
EXPECT_MAIN = "samples_per_worker_s"
EXPECT_DRY_RUN = "resource plan:"

#: each command's output, for reading after a failure (git-ignored)
LOG_DIR = ROOT / "outputs" / "test_docs"

README_SETUP = ("bash scripts/install.sh && python -m verl_digen.main", "python -m pytest -q tests")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


# ------------------------------------------------------------------------------------ (a) config.md
def schema_leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value for every leaf of a (nested) config dataclass instance."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            out.update(schema_leaves(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def markdown_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header cells, body rows) of every pipe table."""
    tables, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|\s*-", lines[i + 1]):
            header = _cells(lines[i])
            body, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                body.append(_cells(lines[i]))
                i += 1
            tables.append((header, body))
        else:
            i += 1
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _first_code(cell: str) -> str | None:
    m = re.search(r"`([^`]*)`", cell)
    return m.group(1) if m else None


def config_rows() -> dict[str, dict[str, str]]:
    """config.md's key rows: key -> {column header: cell}."""
    rows: dict[str, dict[str, str]] = {}
    for header, body in markdown_tables((DOCS / "config.md").read_text()):
        if not header or header[0] != "key":
            continue
        for cells in body:
            key = _first_code(cells[0])
            assert key is not None, f"config.md: a row without a `key`: {cells}"
            assert key not in rows, f"config.md documents {key} twice"
            rows[key] = dict(zip(header, cells))
    return rows


def composed_defaults() -> dict[str, dict[str, Any]]:
    from verl_digen.config import compose

    return {mode: schema_leaves(compose([f"trainer={mode}"])) for mode in MODES}


def test_config_md_lists_every_schema_key_with_its_default():
    from verl_digen.config import RunConfig

    schema = schema_leaves(RunConfig())
    rows = config_rows()
    assert sorted(set(schema) - set(rows)) == [], "keys missing from docs/config.md"
    assert sorted(set(rows) - set(schema)) == [], "docs/config.md names keys the schema lacks"
    defaults = composed_defaults()
    for key, row in rows.items():
        columns = MODES if "digen" in row else ("default",)
        for col in columns:
            mode = "digen" if col == "default" else col
            shown = _first_code(row[col])
            assert shown is not None, f"config.md: no `default` for {key} ({col})"
            assert yaml.safe_load(shown) == defaults[mode][key], (
                f"config.md: {key} default ({col}) is `{shown}`, the composed config has {defaults[mode][key]!r}")
        if "digen" not in row and key != "trainer.mode":  # one default column: the same in every mode
            assert len({repr(defaults[m][key]) for m in MODES}) == 1, f"{key} differs per mode: give all three"
        if schema[key] != defaults["digen"][key]:  # a bare RunConfig() differs: the row must say so
            m = re.search(r"`RunConfig\(\)` default: `([^`]*)`", row["meaning"])
            assert m and yaml.safe_load(m.group(1)) == schema[key], (
                f"config.md: {key}'s row must note \"`RunConfig()` default: `{schema[key]}`\"")


def test_config_md_verl_omni_column_matches_the_mapping():
    from verl_digen.integrations.verl_omni import from_verl_omni_config

    arr = {
        "rollout": {"n": 8, "seed": 1,
                    "pipeline": {"num_inference_steps": 10, "height": 512, "width": 512},
                    "algo": {"noise_level": 0.7, "sde_type": "sde", "sde_window_size": 3, "sde_window_range": [1, 4]}},
        "actor": {"ppo_micro_batch_size_per_gpu": 2, "ppo_mini_batch_size": 8,
                  "diffusion_loss": {"clip_ratio": 1e-4, "adv_clip_max": 5.0},
                  "use_kl_loss": True, "kl_loss_coef": 0.01, "optim": {"lr": 1e-4, "weight_decay": 0.0},
                  "grad_clip": 1.0, "fsdp_config": {"model_dtype": "bfloat16"}},
        "model": {"path": "black-forest-labs/FLUX.1-dev", "lora_rank": 32, "lora_alpha": 64,
                  "target_modules": ["to_q"]},
    }
    cfg = {"data": {"train_batch_size": 8, "train_files": "prompts.jsonl"}, "actor_rollout_ref": arr,
           "algorithm": {"global_std": False},
           "trainer": {"total_training_steps": 5, "project_name": "p", "experiment_name": "e", "save_freq": 1,
                       "default_local_dir": "ckpt", "logger": ["console"], "device": "cuda"}}
    mapped = {k for k, v in from_verl_omni_config(cfg, trainer_workers=2).items() if v is not None}
    rows = config_rows()
    for key in sorted(mapped):
        assert rows[key]["verl-omni"] not in ("—", "-", ""), f"config.md: {key} has a verl-omni counterpart"


# ------------------------------------------------------------------------------------ (b) metrics.md
METRIC = re.compile(r"^(?:timing|perf|pool|time|reward|actor|digen|fault)/[a-z0-9_]+$")


def logged_metric_names() -> set[str]:
    """Every name a step report may hold: the metrics schema (the runtime names metrics only from it;
    tests/runtime/test_runtime.py checks a real run's reports against it)."""
    from verl_digen.reporting.metric_names import step_names

    return step_names()


def documented_metric_names() -> set[str]:
    text = (DOCS / "metrics.md").read_text()
    return {code for code in re.findall(r"`([^`\s]+)`", text) if METRIC.match(code)}


def test_metrics_md_documents_every_logged_metric():
    logged = logged_metric_names()
    assert len(logged) >= 20, f"metric extraction looks broken: {sorted(logged)}"
    documented = documented_metric_names()
    assert sorted(logged - documented) == [], "metrics the runtime logs but docs/metrics.md does not describe"
    assert sorted(documented - logged) == [], "docs/metrics.md describes metrics the runtime does not log"


# ------------------------------------------------------------------------------------ (c) commands
def bash_blocks(path: Path) -> list[tuple[int, bool, list[str]]]:
    """(line number of the fence, gpu-only?, body lines) of every ```bash block."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            gpu_only = j >= 0 and lines[j].strip() == GPU_ONLY
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            assert i < len(lines), f"{path.name}:{start}: unterminated ```bash block"
            blocks.append((start, gpu_only, body))
        i += 1
    return blocks


def commands_of(body: list[str]) -> list[str]:
    out, pending = [], ""
    for raw in body:
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        out.append(pending + line)
        pending = ""
    assert not pending, f"a command ends with a line continuation: {pending!r}"
    return out


def doc_commands() -> list[tuple[str, str, bool]]:
    """(where, command, gpu_only) for every command, in run order."""
    out = []
    for path in doc_files():
        for line, gpu_only, body in bash_blocks(path):
            for cmd in commands_of(body):
                if cmd.startswith(INSTALL_PREFIX):
                    cmd = cmd[len(INSTALL_PREFIX):]
                out.append((f"{path.relative_to(ROOT)}:{line}", cmd, gpu_only))
    return out


def _expected_word(cmd: str) -> str | None:
    for prefix, word in EXPECT.items():
        if cmd.startswith(prefix):
            return word
    if cmd.startswith(MAIN):
        return EXPECT_DRY_RUN if "trainer.dry_run=true" in cmd else EXPECT_MAIN
    return None


def _untracked() -> set[str]:
    out = subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return set(out.split())


def test_gpu_only_main_commands_validate(weights_on_this_machine):
    """GPU-only launch lines are not run, but their overrides must compose and validate."""
    from verl_digen.config import compose, validate
    from verl_digen.config.plan import resource_plan

    checked, failures = 0, []
    for where, cmd, gpu_only in doc_commands():
        if gpu_only and cmd.startswith(MAIN):
            checked += 1
            try:
                cfg = compose(shlex.split(cmd)[len(MAIN.split()):])
                validate(cfg)
                resource_plan(cfg)
            except Exception as err:
                failures.append(f"{where}: {cmd}\n  {type(err).__name__}: {err}")
    assert checked >= 1
    assert not failures, "\n".join(failures)


def console_metric_names(stdout: str) -> set[str]:
    """Metric keys of the console blocks a run prints (reporting/run_log.py: a ``step N/T`` line, then
    ``  <prefix>  name=value  ...`` lines; a longer group goes on over more-indented lines)."""
    names: set[str] = set()
    prefix = None
    for line in stdout.splitlines():
        head = re.match(r"^  ([a-z_]+|-)  +(\S.*)$", line)
        cont = re.match(r"^ {4,}(\S.*)$", line)
        if head:
            prefix, items = head.group(1), head.group(2)
        elif cont and prefix is not None:
            items = cont.group(1)
        else:
            prefix = None
            continue
        names |= {f"{prefix}/{n}" if prefix != "-" else n for n in re.findall(r"(?:^|  )([a-z0-9_/]+)=", items)}
    return names


def test_console_metric_names_parses_the_console_block():
    from verl_digen.reporting.run_log import format_metrics

    metrics = {f"actor/m{i}": i + 0.5 for i in range(20)} | {"reward/mean": 0.25, "val/reward/mean": 1.0}
    text = "warning: x=1\n" + format_metrics(metrics, 3, 10, width=60) + "\nsummary: a=1"
    assert console_metric_names(text) == set(metrics)


@contextlib.contextmanager
def _in_root():
    """The repository root as the working directory (commands read and write relative paths)."""
    saved = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(saved)


def run_in_process(cmd: str) -> tuple[int, str] | None:
    """(exit code, stdout + stderr) of a ``digen`` or ``python -m verl_digen.main`` command run in this process
    through its entry point; None for a command that runs in a shell (README's main job, anything else)."""
    import verl_digen.main as entry
    from verl_digen import cli

    argv = shlex.split(cmd, comments=True)
    if argv[0] == "digen":
        call = lambda: cli.main(argv[1:])  # noqa: E731
    elif cmd.startswith(MAIN + " ") and all(c not in cmd for c in ";&|<>$"):
        def call():
            saved = sys.argv
            sys.argv = ["verl_digen.main", *argv[len(MAIN.split()):]]  # what Hydra and resume lines read
            try:
                entry.main()
            finally:
                sys.argv = saved
            return 0
    else:
        return None
    out = io.StringIO()
    with _in_root(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = call()
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    return code or 0, out.getvalue()


def test_in_process_commands_keep_their_exit_code_and_output():
    """A refused command fails here as it does in a shell; a shell-only command is left to the shell."""
    code, out = run_in_process("digen simulate --preset no-such-preset")
    assert code == 2 and "no-such-preset" in out
    code, out = run_in_process(f"{MAIN} trainer.dry_run=true rollout.n=0")
    assert code == 2 and "rollout.n" in out
    code, out = run_in_process(f"{MAIN} trainer.dry_run=true")
    assert code == 0 and EXPECT_DRY_RUN in out
    assert run_in_process("recipes/launch/hunyuanvideo-13b-hetero.sh trainer.dry_run=true") is None


def test_docs_commands_run(ray_session):
    commands = doc_commands()
    assert any(cmd == MAIN for _, cmd, _ in commands), "README's main job is no longer in a ```bash block"
    env = dict(os.environ)  # a shell run joins this session's Ray, as the in-process ones do (docstring, c)
    env["RAY_ADDRESS"] = ray_session.get_runtime_context().gcs_address
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `digen`, `python`
    before = _untracked()
    done: set[str] = set()
    failures, timings = [], []
    for where, cmd, gpu_only in commands:
        if gpu_only or cmd.startswith("python -m pytest") or cmd in SKIP or cmd in done:
            continue
        done.add(cmd)
        run = cmd + (" " + SHORTEN[cmd][0] if cmd in SHORTEN else "")
        if cmd.startswith(MAIN) and "trainer.log_format=" not in cmd:
            run += " " + BLOCK_LOG  # captured output is not a terminal, which would pick the one-line log
        t0 = time.perf_counter()
        done_here = None if cmd == MAIN else run_in_process(run)
        if done_here is not None:
            returncode, output = done_here
            stdout = output
        else:
            try:
                proc = subprocess.run(["bash", "-c", run], cwd=ROOT, env=env, capture_output=True, text=True,
                                      timeout=600)
            except subprocess.TimeoutExpired:
                failures.append(f"{where}: timed out: {run}")
                continue
            returncode, output, stdout = proc.returncode, proc.stdout + proc.stderr, proc.stdout
        timings.append((time.perf_counter() - t0, where, run))
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        (LOG_DIR / f"{len(timings):02d}.log").write_text(f"$ {run}\n# {where}, exit {returncode}\n{output}")
        if returncode != 0:
            failures.append(f"{where}: exit {returncode}: {run}\n{output[-3000:]}")
            continue
        word = _expected_word(cmd)
        if word is not None and word not in output:
            failures.append(f"{where}: output lacks {word!r}: {run}\n{output[-3000:]}")
        if cmd.startswith(MAIN) and "trainer.dry_run=true" not in cmd:  # the console lines' metric names
            logged = console_metric_names(stdout)
            if not logged and ("trainer.logger=" not in cmd or "console" in cmd):  # default logger: console
                failures.append(f"{where}: no console metric block found in the output: {run}")
            missing = logged - documented_metric_names()
            if missing:
                failures.append(f"{where}: the run logged metrics docs/metrics.md lacks: {sorted(missing)}")
    for seconds, where, run in timings:
        print(f"{seconds:7.1f} s  {where}  {run}")
    print(f"{sum(s for s, _, _ in timings):7.1f} s  total, {len(timings)} commands")
    new = sorted(_untracked() - before)
    if new:
        failures.append(f"docs commands left untracked files outside outputs/ (or a concurrent edit did): {new}")
    assert not failures, "\n\n".join(failures)


# ------------------------------------------------------------------------------------ (d) README, links
def test_readme_keeps_its_setup_commands():
    commands = [cmd for where, cmd, _ in doc_commands() if where.startswith("README.md")]
    readme = (ROOT / "README.md").read_text()
    for setup in README_SETUP:
        assert f"```bash\n{setup}\n```" in readme, f"README.md lost its set-up command {setup!r}"
    assert "python -m verl_digen.main" in commands


def _slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped (except - and _), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(_slug(line.lstrip("#")))
    return out


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_relative_links_resolve(path: Path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor}")
    assert not bad, f"{path.name}: broken links: {bad}"
