"""The weight sync's receiving side (``SyncGroup.receive`` and its handshake) between two members in this
process over a loopback transport instead of gloo, so these run in milliseconds; the same flows over real
gloo groups are in tests/workers/test_weight_transfer.py (slow). The loopback transport completes each
receive as soon as it is posted, a schedule gloo allows, under which two buckets in flight that shared one
staging buffer would overwrite each other; and, as gloo does, it refuses a message whose byte size differs
from the buffer posted for it (where gloo aborts the process)."""

from __future__ import annotations

import queue
import threading
from collections import defaultdict

import pytest
import torch

from verl_digen.schedule import ledger
from verl_digen.workers.buckets import byte_view, layout_of, plan_for
from verl_digen.workers.platform_cpu import PlatformCPU
from verl_digen.workers.sync import Packer, SyncGroup, SyncRefused, group_id, new_secret


class _Done:
    def wait(self) -> None:
        return None


class _Loopback:
    """Point-to-point messages between members: a send is queued at once; a receive takes the next message
    from its peer when posted, and refuses one of another byte size or tag."""

    def __init__(self) -> None:
        self.queues: defaultdict[tuple[int, int], queue.Queue] = defaultdict(queue.Queue)
        self.lock = threading.Lock()

    def _queue(self, src: int, dst: int) -> queue.Queue:
        with self.lock:
            return self.queues[(src, dst)]

    def group(self, rank: int) -> _LoopbackGroup:
        return _LoopbackGroup(self, rank)


class _LoopbackGroup:
    def __init__(self, wire: _Loopback, rank: int) -> None:
        self.wire, self.rank = wire, rank

    def send(self, tensors: list[torch.Tensor], peer: int, tag: int) -> _Done:
        (t,) = tensors
        self.wire._queue(self.rank, peer).put((tag, byte_view(t).clone()))
        return _Done()

    def recv(self, tensors: list[torch.Tensor], peer: int, tag: int) -> _Done:
        (t,) = tensors
        sent_tag, msg = self.wire._queue(peer, self.rank).get(timeout=5)
        if sent_tag != tag:
            raise RuntimeError(f"message sent with tag {sent_tag} posted into a receive of tag {tag}")
        into = byte_view(t)
        if msg.numel() != into.numel():
            raise RuntimeError(f"message of {msg.numel()} bytes posted into a buffer of {into.numel()}")
        into.copy_(msg)
        return _Done()


def _member(wire: _Loopback, rank: int, secret: str, world: int = 2) -> SyncGroup:
    """A sync-group member on the loopback transport (``SyncGroup.__init__`` opens a rendezvous store and a
    gloo group: its fields are set here as it sets them)."""
    g = SyncGroup.__new__(SyncGroup)
    g._key, g.group_id = bytes.fromhex(secret), group_id(secret)
    g.rank, g.world, g.backend = rank, world, "gloo"
    g.device, g.pg = torch.device("cpu"), wire.group(rank)
    g.store_server = g.store = None
    g.node, g._nodes = "node", {r: "node" for r in range(world)}
    g.counters, g._pool = {"sent": 0, "received": 0}, []
    return g


def _pickup(state: dict[str, torch.Tensor], *, verify: bool = False, version: int = 3, sent: int | None = None,
            bucket: int = 64, members: tuple[SyncGroup, SyncGroup] | None = None,
            ) -> tuple[SyncGroup, dict[str, torch.Tensor], object]:
    """Member 0 serves ``state`` as version ``sent`` (default ``version``); member 1 receives ``version``
    (``members``: the two, when they are kept from pickup to pickup). Returns the receiver, what it received,
    and its ledger (or the error it raised)."""
    if members is None:
        wire, secret = _Loopback(), new_secret()
        members = _member(wire, 0, secret), _member(wire, 1, secret)
    src, dst = members
    packer = Packer(state, bucket, torch.device("cpu"))
    source = threading.Thread(target=lambda: _quiet(src.serve, 1, version if sent is None else sent, packer.plan,
                                                    packer.bucket, verify_payload=verify), daemon=True)
    src.outcome = None
    source.start()
    into = {k: torch.full_like(v, 7) for k, v in state.items()}
    try:
        result: object = dst.receive(version, plan_for(layout_of(state), bucket, 1), into, [0], verify)
    except Exception as err:  # noqa: BLE001 - inspected by the test
        result = err
    source.join(10)
    assert not source.is_alive()
    return dst, into, result


def _quiet(fn, *args, **kwargs) -> None:
    """Run a source's ``serve``; what it returned or raised goes to its member's ``outcome``."""
    try:
        fn.__self__.outcome = fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - inspected by the test
        fn.__self__.outcome = err


def _identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(byte_view(a[k]), byte_view(b[k])) for k in a)


def _mixed_state() -> dict[str, torch.Tensor]:
    """With 64-byte buckets: direct buckets (one of a tensor's pieces each) and three packed ones in a row."""
    g = torch.Generator().manual_seed(0)
    state = {f"t{i}": torch.randn(3 + i, generator=g, dtype=torch.float64) for i in range(6)}
    state["big"] = torch.randn(40, generator=g)
    return state


def test_packed_buckets_that_arrive_at_once_each_land_intact():
    """Two packed buckets are in flight at a time, each in its own staging buffer: the second may arrive
    before the first is unpacked."""
    state = _mixed_state()
    plan = plan_for(layout_of(state), 64, 1)
    packed = [k for k in range(len(plan)) if not plan.direct(k)]
    assert len(packed) >= 3 and packed == list(range(packed[0], packed[0] + len(packed)))  # in a row
    dst, into, out = _pickup(state)
    assert not isinstance(out, Exception), out
    assert _identical(into, state)
    assert out[ledger.STAGING_PEAK] == 2 * plan.staged_size() and len(dst._pool) == 2  # kept for the next


def test_a_verified_pickup_stages_what_it_receives_and_nothing_more():
    """With the payload check every bucket is staged until the MAC verifies, so no reused staging buffers
    are allocated besides (packed buckets of 64 and 24 bytes: two reused buffers would be 128)."""
    g = torch.Generator().manual_seed(1)
    state = {n: torch.randn(size, generator=g, dtype=torch.float64) for n, size in (("a", 5), ("b", 5), ("c", 1))}
    plan = plan_for(layout_of(state), 64, 1)
    assert plan.sizes == (64, 24) and not plan.direct(0) and not plan.direct(1)
    dst, into, out = _pickup(state, verify=True)
    assert not isinstance(out, Exception), out
    assert _identical(into, state)
    assert out[ledger.STAGING_PEAK] == 88 and dst._pool == []


def test_a_pickup_of_another_version_is_refused_naming_both_and_loads_nothing():
    state = _mixed_state()
    wire, secret = _Loopback(), new_secret()
    src, dst = _member(wire, 0, secret), _member(wire, 1, secret)
    _, into, out = _pickup(state, version=3, sent=4, members=(src, dst))
    assert isinstance(out, SyncRefused), out
    assert "sends version 4" in str(out) and f"expects version 3 ({len(state)} tensors" in str(out)
    assert all(torch.all(t == 7) for t in into.values())
    assert isinstance(src.outcome, SyncRefused) and "refused by sync rank 1" in str(src.outcome)  # told so


def test_a_source_outside_the_pickups_sources_owns_no_bucket():
    plan = plan_for(layout_of(_mixed_state()), 64, 2)
    assert sorted(plan.owned(0, 2) + plan.owned(1, 2)) == list(range(len(plan)))
    for source in (-1, 2):
        with pytest.raises(ValueError, match="out of range for 2 sources"):
            plan.owned(source, 2)


@pytest.mark.parametrize("verify", [False, True])
def test_a_pickup_over_a_transport_that_checks_sizes_arrives_whole(verify):
    """Every message of the handshake, the buckets and the payload MAC goes into a buffer of its size."""
    state = _mixed_state()
    _, into, out = _pickup(state, verify=verify)
    assert not isinstance(out, Exception), out
    assert _identical(into, state)


def test_a_pickup_reuses_the_last_ones_staging_buffers_only_when_they_fit_within_twice_its_need():
    """Staging buffers are kept from pickup to pickup (no fresh allocation in steady state), but one more than
    twice what a pickup needs is not held for it."""
    wire, secret = _Loopback(), new_secret()
    members = _member(wire, 0, secret), _member(wire, 1, secret)
    dst = members[1]
    g = torch.Generator().manual_seed(2)

    def state(*sizes: int) -> dict[str, torch.Tensor]:  # one packed bucket of 8 * sum(sizes) bytes
        return {f"t{i}": torch.randn(n, generator=g, dtype=torch.float64) for i, n in enumerate(sizes)}

    def pickup(s: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        before = list(dst._pool)
        _, into, out = _pickup(s, members=members)
        assert not isinstance(out, Exception), out
        assert _identical(into, s)
        return [b for b in dst._pool if any(b is old for old in before)]

    first = state(4, 4)  # 64 bytes
    assert pickup(first) == [] and [b.numel() for b in dst._pool] == [64]
    assert len(pickup(state(4, 4))) == 1  # the same size: reused
    assert len(pickup(state(2, 2))) == 1  # 32 bytes: 64 is twice that, reused
    assert pickup(state(2, 1)) == [] and [b.numel() for b in dst._pool] == [24]  # 24: 64 is too big, dropped


def test_the_cpu_platform_says_it_is_available():
    """verl asks a platform before using it; VERL_PLATFORM=cpu selects this one."""
    assert PlatformCPU().is_available() is True
