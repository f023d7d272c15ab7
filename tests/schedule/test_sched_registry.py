"""The TAG-policy registry: a policy in one file is accepted by name everywhere, an unknown name lists the
registered ones, and the policy modules no longer import each other (docs/architecture.md, "The
scheduling core")."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import verl_digen.schedule as schedule
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import uniform_stage_costs
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.simulator import execute
from verl_digen.schedule.tag_policy import (
    UnknownTagPolicy,
    parse_policy,
    register_tag_policy,
    tag_policy_names,
    tag_policy_usage,
    unregister_tag_policy,
)

BUILTIN = "adaptive[:R], bts, never, static:K"
SCHEDULE = Path(schedule.__file__).parent


def load_toy_policy():
    """Import tests/schedule/toy_tag_policy.py afresh (its import registers ``one_slot``)."""
    path = Path(__file__).with_name("toy_tag_policy.py")
    spec = importlib.util.spec_from_file_location("toy_tag_policy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def toy():
    module = load_toy_policy()
    yield module
    unregister_tag_policy("one_slot")


def test_builtin_policies_are_registered():
    assert tag_policy_names() == ("adaptive", "bts", "never", "static")
    assert tag_policy_usage() == BUILTIN
    assert str(parse_policy("static(2)")) == "static:2" and str(parse_policy("adaptive")) == "adaptive:0.3"
    assert str(parse_policy("BTS")) == "bts"


def test_a_policy_in_one_file_is_accepted_by_the_scheduler(toy):
    assert "one_slot" in tag_policy_names() and tag_policy_usage() == "adaptive[:R], bts, never, one_slot[:N], static:K"
    cfg = ScheduleConfig(prompts=8, group_size=2, mb_size=1, steps=2, policy="one_slot:2")
    costs = uniform_stage_costs(4.0, 0.1, score=0.1, tag_generate=1.0)  # slow generators: bubbles
    sched = StepScheduler(cfg, costs, 2, trainer_ranks=2)
    assert isinstance(sched.policy, toy.OneSlot) and sched.policy.bubbles == 2
    tl = execute(sched, costs)  # check_timeline holds the run to the invariants
    for step in range(2):
        taken = [d.slots for d in sched.decisions if d.step == step]
        assert max(taken) == 1 and sum(taken) == 2, taken  # two bubbles, one slot each, though 2 were free
        assert sum(1 for r in tl.records if r.kind == "tag_generate" and r.step == step) == 2
    with pytest.raises(ValueError, match="bad TAG policy 'one_slot:-1': one_slot needs a bubble count"):
        parse_policy("one_slot:-1")


def test_an_unknown_name_lists_the_registered_policies(toy):
    with pytest.raises(UnknownTagPolicy, match=r"^unknown TAG policy 'greedy'; registered: adaptive\[:R\], bts, never, "
                                               r"one_slot\[:N\], static:K$"):
        parse_policy("greedy")
    with pytest.raises(ValueError) as err:
        ScheduleConfig(prompts=8, group_size=2, mb_size=1, policy="greedy")
    assert str(err.value) == "unknown TAG policy 'greedy'; registered: adaptive[:R], bts, never, one_slot[:N], static:K"
    unregister_tag_policy("one_slot")
    with pytest.raises(ValueError, match=r"unknown TAG policy 'one_slot'; registered: adaptive\[:R\], bts, never, "
                                         r"static:K$"):
        StepScheduler(ScheduleConfig(prompts=8, group_size=2, mb_size=1), uniform_stage_costs(1.0, 0.1), 1,
                      policy="one_slot")


def test_spec_arguments_are_checked_against_the_registration():
    with pytest.raises(ValueError, match="bad TAG policy 'never:2': never takes no argument"):
        parse_policy("never:2")
    with pytest.raises(ValueError, match=r"bad TAG policy 'static': static needs an argument, e.g. static:K"):
        parse_policy("static")
    with pytest.raises(ValueError, match="bad TAG policy 'static:1.5'"):
        parse_policy("static:1.5")


def test_a_second_policy_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="'never' is already registered by verl_digen.schedule.policies.Never"):
        @register_tag_policy("never")
        class Impostor:
            name = "never"

            def decide(self, ctx) -> int:
                return 1
    assert type(parse_policy("never")).__name__ == "Never"
    with pytest.raises(ValueError, match="lower-case"):
        register_tag_policy("Bad-Name")


def test_registration_spells_the_usage_and_accepts_the_same_factory_again(toy):
    load_toy_policy()  # importing the file again registers the same factory again: accepted
    assert "one_slot[:N]" in tag_policy_usage().split(", ")
    with pytest.raises(ValueError, match="'sized': arg_required needs an arg converter"):
        register_tag_policy("sized", arg_required=True)
    specs = {"plain": ({}, "plain"), "sized": ({"arg": int, "arg_required": True}, "sized:X"),
             "tuned": ({"arg": float}, "tuned[:X]")}
    try:
        for name, (kwargs, usage) in specs.items():
            register_tag_policy(name, **kwargs)(toy.OneSlot)
            assert usage in tag_policy_usage().split(", ") and name in tag_policy_names()
        assert parse_policy("sized:2").bubbles == 2 and parse_policy("tuned").bubbles == 1_000_000
        with pytest.raises(ValueError, match="sized needs an argument, e.g. sized:X"):
            parse_policy("sized")
    finally:
        for name in specs:
            unregister_tag_policy(name)


def _package_imports(path: Path) -> set[str]:
    """Modules of verl_digen.schedule that ``path`` imports, at module level or inside functions."""
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                deps.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
            elif node.module and node.module.startswith("verl_digen.schedule."):
                deps.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            deps.update(a.name.split(".")[2] for a in node.names if a.name.startswith("verl_digen.schedule."))
    return deps


def test_the_schedule_policies_depend_only_on_tag_policy():
    """Every import counts, lazy ones too: the policies depend on tag_policy, never on each other or on
    the scheduler, and the scheduler hands them a neutral view instead of building BTS's state (that no module
    imports itself back through others is tests/test_import_cycles.py's, for the whole package)."""
    graph = {p.stem: _package_imports(p) - {"__init__"} for p in SCHEDULE.glob("*.py") if p.stem != "__init__"}
    assert graph["tag_policy"] == {"costs"}
    assert graph["policies"] == {"tag_policy"} and graph["bts"] == {"actions", "costs", "tag_policy"}
    assert "bts" not in graph["scheduler"] and "policies" not in graph["scheduler"]


@pytest.mark.parametrize("first", ["bts", "policies", "tag_policy"])
def test_each_policy_module_imports_alone_in_a_fresh_interpreter(first):
    code = (f"import verl_digen.schedule.{first}; from verl_digen.schedule.tag_policy import tag_policy_usage; "
            "print(tag_policy_usage())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == BUILTIN
