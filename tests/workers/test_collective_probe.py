"""The after-run probe's sharding samples: the collectives sharding a trainer adds, counted on its module, and an
all-gather timed between two members of a group of their own (threads here; two of the run's processes there)."""

import socket
import threading

import torch

from verl_digen.models.tiny import tiny_components
from verl_digen.workers.collective_probe import time_all_gather, time_sharded
from verl_digen.workers.fsdp import sharded_calls


def test_the_counts_follow_the_units_and_tensors_of_the_module():
    transformer, _ = tiny_components("flux")
    blocks = set(transformer._no_split_modules)
    units = 1 + sum(type(m).__name__ in blocks for m in transformer.modules())
    params = sum(p.numel() * 4 for p in transformer.parameters())
    counts = sharded_calls(transformer)
    assert units >= 3 and counts["pass_calls"] == 3 * units - 1  # the root is not gathered again for backward
    assert counts["pass_bytes"] == 3 * params  # gathered forward, backward, gradients reduce-scattered
    assert counts["switch_calls"] == len(transformer.state_dict()) and counts["switch_bytes"] >= params
    transformer.requires_grad_(False)  # frozen weights are gathered but reduce nothing
    assert sharded_calls(transformer)["pass_bytes"] == 2 * params
    assert counts["step_calls"] == 2  # the gradient norm's reduction and the ranks' skip verdict (actor._agree)


def test_an_all_gather_between_two_members_is_timed_per_size():
    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out: dict[int, list] = {}
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(
        r, time_all_gather("127.0.0.1", port, r, 2, [1, 1000], reps=3))) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [b for b, _ in out[0]] == [8, 8000] == [b for b, _ in out[1]]  # bytes gathered: float32 x 2 ranks
    assert all(0 < t < 10 for _, t in out[0])


def test_the_sharded_probe_gives_up_without_its_peer():
    """A peer that never joins (one that had a process group of its own): no figures, the profile keeps the bare
    all-gather's latency, and the run's probe goes on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert time_sharded(None, "127.0.0.1", port, 1, 2, [4], timeout_s=0.1) == []


def test_the_probes_switch_stashes_the_training_state_as_the_runtimes_does():
    """The timed switch moves the gradients and AdamW state out (``switch.stash``, as ``HybridWorker.switch_to_gen``:
    on a sharded rank a copy per DTensor shard, which the probe's gather alone never paid) and, sharded, gathers
    the generation copy; the untimed way back restores both bit-identical."""
    from verl_digen.workers import switch
    from verl_digen.workers.collective_probe import switch_back, switch_out

    torch.set_num_threads(1)
    transformer, _ = tiny_components("flux")
    gen, _ = tiny_components("flux", seed=1)
    params = [p for p in transformer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    grads = [p.grad.clone() for p in params]
    moments = [opt.state[p]["exp_avg"].clone() for p in params]
    stash = switch.TrainingStash()
    switch_out(transformer, gen, opt, stash, sharded=False)  # an unsharded rank: the stash, no gather
    assert all(p.grad is None for p in params) and not opt.state and stash
    assert not torch.equal(next(iter(gen.state_dict().values())), next(iter(transformer.state_dict().values())))
    switch_back(transformer, opt, stash)
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))
    assert all(torch.equal(opt.state[p]["exp_avg"], m) for p, m in zip(params, moments)) and not stash
    switch_out(transformer, gen, opt, stash, sharded=True)  # sharded: the gather into the generation copy too
    assert all(torch.equal(a, b) for a, b in zip(gen.state_dict().values(), transformer.state_dict().values()))
    assert all(p.grad is None for p in params) and not opt.state


def test_the_sharded_probe_interleaves_its_variants():
    """alone, plain and sharded take turns, so a load that comes and goes moves all three alike: the order of the
    runs, and per timed work each variant's median over its timed runs (the first round is warm-up here)."""
    from verl_digen.workers.collective_probe import interleaved

    order: list[str] = []
    clock = iter(range(100))

    def run(name: str):
        def once() -> dict[str, float]:  # one run times two works, as the probe's step and switch
            order.append(name)
            return {"step": float(next(clock)), "switch": float(next(clock))}
        return once

    got = interleaved([(n, run(n)) for n in ("alone", "plain", "sharded")], reps=3, warmup=1)
    assert order == ["alone", "plain", "sharded"] * 4
    # timed runs: alone 6-7, 12-13, 18-19; plain 8-9, ...; sharded 10-11, ...
    assert got == {"step": {"alone": 12.0, "plain": 14.0, "sharded": 16.0},
                   "switch": {"alone": 13.0, "plain": 15.0, "sharded": 17.0}}


def test_the_probe_times_the_step_and_switch_in_a_runs_order(monkeypatch):
    """The optimizer step and the switch are timed once a round, as a colocated run reaches them: the previous
    switch undone, then the step, then the switch (timed back to back, the switch sat at the fast end of a run's).
    A group of one process here: every variant runs on it."""
    from verl_digen.config import compose
    from verl_digen.workers import collective_probe, fsdp

    torch.set_num_threads(1)
    events: list[str] = []
    for name, label in (("switch_out", "out"), ("switch_back", "back")):
        real = getattr(collective_probe, name)
        monkeypatch.setattr(collective_probe, name,
                            lambda *a, _real=real, _label=label, **k: (events.append(_label), _real(*a, **k))[1])
    clip = fsdp.clip_grad_norm
    monkeypatch.setattr(fsdp, "clip_grad_norm", lambda *a, **k: (events.append("step"), clip(*a, **k))[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = compose(["model.latent_size=8"]).worker_config()
    out = time_sharded(cfg, "127.0.0.1", port, 0, 1, [2], reps=2)
    assert [w["work"] for w in out] == ["pass", "step", "switch"]
    assert all(w[v] > 0 for w in out for v in ("alone", "plain", "sharded"))
    # four rounds (two warm-up) of alone, plain, sharded; the unsharded copy's first switch has nothing to undo
    first = ["step", "out", "back", "step", "out", "step", "out"]
    assert events == first + ["back", "step", "out"] * 3 * 3
