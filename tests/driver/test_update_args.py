"""The backend passes an update's scored refs to the trainer each as an argument of its own: Ray resolves
top-level refs itself (a small result travels inline with the call), while refs nested in a tuple made an
argument that carried the small results inline and, over Ray's inline limit, was written into the object
store by the driver, touching new pages of the store's memory each step (docs/benchmarks.md, "Soak")."""

from verl_digen.driver.ray_backend import RayBackend, Work
from verl_digen.schedule.actions import UPDATE, Action
from verl_digen.schedule.timeline import TRAINER


class _Pool:
    workers = ["rank0"]

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def execute_all_async(self, method: str, *args):
        self.calls.append((method, args))
        return [object()]


class _Ref:
    """A scored-trajectory ref stand-in."""


def _launch(colocated: bool, scored: dict) -> tuple:
    pool = _Pool()
    backend = RayBackend(None, pool, None, scale=0.25)
    backend.colocated = colocated
    backend._scored = scored
    adv = {(0, 0): 1.0}
    backend.launch(Action(UPDATE, (TRAINER,), 3, 3, mb=0, count=2), Work([(0, 0)], ["p"], adv))
    ((method, args),) = pool.calls
    assert method == "update"
    return args, adv


def test_an_updates_refs_are_top_level_arguments_in_micro_batch_order():
    refs = [_Ref() for _ in range(3)]
    args, adv = _launch(False, {(3, 0): refs[:2], (3, 1): refs[2:]})
    assert args == (refs[0], 0.25, adv, False, refs[1], refs[2])  # update(traj, scale, advantages, subset, *more)
    assert not any(isinstance(a, (list, tuple)) for a in args)  # no ref inside a container


def test_a_colocated_update_passes_the_steps_refs_the_same_way_and_keeps_them():
    refs = [_Ref(), _Ref()]
    scored = {(3, 0): refs}
    args, adv = _launch(True, scored)
    assert args == (refs[0], 0.25, adv, True, refs[1])
    assert scored == {(3, 0): refs}  # the step's later mini-batches read them too


class _Resolved(Exception):
    """Stops ``update`` once it has resolved its parts (what it trains is other tests' business)."""


def test_the_trainer_trains_every_part_it_is_passed(monkeypatch):
    from types import SimpleNamespace

    from verl_digen.workers import actor

    seen = []

    def resolve(parts):
        seen.append(parts)
        raise _Resolved

    monkeypatch.setattr(actor.P, "resolve_trajectories", resolve)
    worker = SimpleNamespace(_require=lambda: None, old=None)
    for args, parts in (((["a", "b"],), ["a", "b"]), (("a",), "a"), (("a", "b", "c"), ("a", "b", "c"))):
        try:
            actor.TSPActorWorker.update(worker, args[0], 0.5, None, False, *args[1:])
        except _Resolved:
            pass
        assert seen.pop() == parts
