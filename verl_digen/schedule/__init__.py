"""Pure-Python scheduling core of verl-digen (no torch, no Ray).

Executor-facing API (the simulator and the Ray runtime drive the same object)::

    from verl_digen.schedule import ScheduleConfig, StepScheduler, run
    sched = StepScheduler(config, stage_costs, gen_workers=G, trainer_ranks=R)  # TAG policy from config
    timeline = run(sched, backend)   # the one executor loop; checks the invariants at the end

Modules: costs (cost model), profiler, gap (micro-batch formation), config, actions, scheduler (two
queues, TAG slots, per-worker weight pickup, TCSS), colocated (the baseline as a scheduler), tag_policy
(the TAG-policy interface, the scheduler's neutral view and the policy registry), policies + bts (the
registered TAG policies; imported here so that their names are registered), executor (the loop + the
virtual-clock backend), bounds (ideal step time), simulator, timeline (records + invariants), export
(Perfetto trace, Gantt PNG), profile_io + presets, plan.
"""

from .actions import Action
from .bounds import Bounds, step_bounds
from .bts import BtsPolicy
from .colocated import ColocatedScheduler
from .config import COLOCATED, DIGEN, SEPARATE, ScheduleConfig
from .costs import Affine, CostModel, Hardware, Pool, StageCosts
from .executor import Backend, Completion, SimBackend, run
from .gap import MicroBatch, Partition, batch_partition, gap_partition, partition
from .policies import Adaptive, Never, Static
from .profiler import Profiler
from .scheduler import StepScheduler
from .tag_policy import (
    BubbleContext,
    SchedulerView,
    TagPolicy,
    parse_policy,
    register_tag_policy,
    tag_policy_names,
    tag_policy_usage,
)
from .timeline import TRAINER, Record, Timeline, TimelineError, check_timeline

__all__ = [
    "Action", "Adaptive", "Affine", "Backend", "Bounds", "BtsPolicy", "BubbleContext", "COLOCATED",
    "ColocatedScheduler", "CostModel",
    "Completion", "DIGEN", "Hardware", "Never", "SchedulerView", "SimBackend", "Static", "run",
    "MicroBatch", "Partition", "Pool", "Profiler", "Record", "SEPARATE", "ScheduleConfig", "StageCosts",
    "StepScheduler", "TRAINER", "TagPolicy", "Timeline", "TimelineError", "batch_partition",
    "check_timeline", "gap_partition", "parse_policy", "partition", "register_tag_policy", "step_bounds",
    "tag_policy_names", "tag_policy_usage",
]
