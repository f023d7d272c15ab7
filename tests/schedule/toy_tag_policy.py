"""A TAG policy in one file (tests/schedule/test_sched_registry.py loads it): registering is all it takes
for ScheduleConfig, StepScheduler and the run config to accept ``one_slot[:N]``."""

from verl_digen.schedule.tag_policy import BubbleContext, register_tag_policy


@register_tag_policy("one_slot", arg=int, usage="one_slot[:N]")
class OneSlot:
    """At most one TAG micro-batch per bubble, in the first ``bubbles`` bubbles of each step."""

    name = "one_slot"

    def __init__(self, bubbles: int = 1_000_000) -> None:
        if bubbles < 0:
            raise ValueError(f"one_slot needs a bubble count >= 0, got {bubbles}")
        self.bubbles = bubbles

    def decide(self, ctx: BubbleContext) -> int:
        return min(1, ctx.most) if ctx.bubble <= self.bubbles else 0
