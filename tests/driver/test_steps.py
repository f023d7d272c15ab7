"""The driver's step iterator without Ray: each action carries its rows, texts and advantages to the backend
(attached before launch, never asked for), and a backend with nothing finishing stops as a stall."""

from types import SimpleNamespace

import pytest

from verl_digen.config import compose
from verl_digen.driver.completions import Scored
from verl_digen.driver.ray_backend import RayBackend, Stalled, _Call
from verl_digen.driver.steps import Prompts, Steps, _Segment
from verl_digen.schedule.actions import GENERATE, PUBLISH, SCORE, UPDATE, Action
from verl_digen.schedule.executor import Completion

TINY = ["model.dtype=float64", "model.latent_size=8", "rollout.num_steps=3", "rollout.train_steps=2",
        "data.train_batch_size=2", "rollout.n=2", "rollout.micro_batch_size=2", "trainer.total_steps=3",
        "trainer.progress=false", "trainer.logger=[]", "digen.tag.policy=never"]


def _segment(base: int) -> tuple[_Segment, Prompts]:
    cfg = compose(TINY)
    pools = SimpleNamespace(gen_wg=SimpleNamespace(workers=["g0"]), trn_wg=SimpleNamespace(workers=["t0"]),
                            sync=None, start_step=0)
    prompts = Prompts(cfg)
    prompts.offset = 1  # a resume that changed the batch: rows follow the data position, not the step alone
    return _Segment(Steps(cfg, pools, prompts, "run", lambda _: None), base, 1, None), prompts


def test_each_action_carries_its_rows_texts_and_advantages():
    seg, prompts = _segment(base=2)
    samples = ((0, 0), (0, 1), (1, 0), (1, 1))
    rows, texts = prompts.rows(2, samples)
    assert rows and len({p for p, _ in rows}) == 2
    gen = seg.prepare(Action(GENERATE, ("gen0",), 0, 0, mb=0, samples=samples))
    assert (gen.rows, gen.texts, gen.advantages) == (rows, texts, None)
    assert seg.prepare(Action(PUBLISH, ("trainer",), 0, 1)) is None
    seg.acc.add(Completion(Action(SCORE, ("gen0",), 0, 0, mb=0, samples=samples), 1.0,
                           Scored(prompt_ids=tuple(p for p, _ in rows), sample_ids=tuple(s for _, s in rows),
                                  rewards=(1.0, 3.0, 0.0, 8.0))))
    update = seg.prepare(Action(UPDATE, ("trainer",), 0, 0, mb=0, samples=samples))
    assert update.rows == rows and update.texts == texts
    assert update.advantages == seg.acc.advantages(0, sorted({p for p, _ in rows}))
    assert sorted(update.advantages) == sorted(rows)


def test_a_backend_on_which_nothing_finishes_stops_as_a_stall_naming_what_it_waited_on():
    backend = RayBackend(None, SimpleNamespace(workers=["t0"]), None, scale=1.0, base=4, stall_timeout_s=2.5)
    call = _Call(Action(UPDATE, ("trainer",), 1, 1, mb=0), ["ref"])
    backend._inflight = {"ref": call}
    waited = []
    backend._pump = lambda timeout: waited.append(timeout) or False
    with pytest.raises(Stalled, match=r"no action finished for 2.5 s .* waiting on update on trainer \(step 6, "
                                      r"micro-batch 0\)"):
        backend.wait()
    assert waited == [2.5]
