"""Pure-Python scheduling core of verl-digen (no torch, no Ray).

Executor-facing API (the simulator and the Ray runtime drive the same object)::

    from verl_digen.schedule import ScheduleConfig, StepScheduler, check_timeline
    sched = StepScheduler(config, stage_costs, gen_workers=G)    # TAG policy from config.policy
    actions = sched.start(now)
    ...  sched.on_complete(action, now[, duration]);  actions = sched.next_actions(now)  ...
    check_timeline(sched.timeline, config.staleness)

Modules: costs (cost model), profiler, gap (micro-batch formation), config, actions, scheduler (two
queues, TCSS), policies + bts (TAG decisions), bounds (ideal step time), simulator (virtual clock),
timeline (records + invariants), export (Perfetto trace, Gantt PNG), profile_io + presets, plan.
"""

from .actions import Action
from .bounds import Bounds, step_bounds
from .config import COLOCATED, DIGEN, SEPARATE, ScheduleConfig
from .costs import Affine, CostModel, Hardware, Pool, StageCosts
from .gap import MicroBatch, Partition, batch_partition, gap_partition, partition
from .policies import BubbleContext, TagPolicy, parse_policy
from .profiler import Profiler
from .scheduler import StepScheduler
from .timeline import TRAINER, Record, Timeline, TimelineError, check_timeline

__all__ = [
    "Action", "Affine", "Bounds", "BubbleContext", "COLOCATED", "CostModel", "DIGEN", "Hardware",
    "MicroBatch", "Partition", "Pool", "Profiler", "Record", "SEPARATE", "ScheduleConfig", "StageCosts",
    "StepScheduler", "TRAINER", "TagPolicy", "Timeline", "TimelineError", "batch_partition",
    "check_timeline", "gap_partition", "parse_policy", "partition", "step_bounds",
]
