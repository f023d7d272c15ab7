"""The weight sync's pieces that every transfer rests on, each test in milliseconds (workers/buckets.py,
workers/sync.py): the bucket cut of a layout (exact pieces, with and without packing), the plan of a pickup
from several sources, the layout hash both ends compare, the group id and the handshake's words, the
listener bound to one address, a gloo group on its own address and timeout, a sync group's members formed
in this process (rank 0 holds the store), a source's checks and ledger, and a packer's scratch reuse. The
transfers over real gloo groups are in tests/workers/test_weight_transfer.py (slow); the receiving side over
an in-process transport is tests/workers/test_sync_loopback.py."""

from __future__ import annotations

import hashlib
import socket
import struct
import threading
import types
from datetime import timedelta

import pytest
import torch
from test_sync_loopback import _Loopback, _member, _mixed_state, _pickup

from verl_digen.schedule import ledger
from verl_digen.workers import buckets as B
from verl_digen.workers import sync as S
from verl_digen.workers.buckets import PACK_BYTES, BucketPlan, byte_view, layout_hash, layout_of, plan_for
from verl_digen.workers.sync import Packer, SyncGroup, SyncRefused, group_id, new_secret


def _state() -> dict[str, torch.Tensor]:
    """40 + 12 + 100 + 4 + 8 bytes, given out of name order."""
    return {"c": torch.zeros(100, dtype=torch.uint8), "a": torch.zeros(5, dtype=torch.float64),
            "e": torch.zeros(8, dtype=torch.uint8), "b": torch.zeros(3), "d": torch.zeros(2, dtype=torch.int16)}


def _cut(plan: BucketPlan) -> list[list[tuple[str, int, int, int]]]:
    return [[(p.name, p.start, p.length, p.offset) for p in pieces] for pieces in plan.pieces]


# ------------------------------------------------------------------------------------------------- buckets
def test_a_layout_is_every_tensors_name_dtype_and_shape_in_name_order_and_its_bytes():
    assert layout_of(_state()) == (("a", torch.float64, (5,)), ("b", torch.float32, (3,)),
                                   ("c", torch.uint8, (100,)), ("d", torch.int16, (2,)), ("e", torch.uint8, (8,)))
    assert B._nbytes(torch.float64, (3, 4)) == 96 and B._nbytes(torch.bfloat16, (5,)) == 10
    assert B._nbytes(torch.int8, ()) == 1 and B._nbytes(torch.float32, (0, 4)) == 0


def test_the_layout_hash_is_63_bits_of_sha256_over_each_name_dtype_and_shape():
    def want(layout: B.Layout) -> int:
        h = hashlib.sha256()
        for name, dtype, shape in layout:
            h.update(f"{name}|{dtype}|{shape};".encode())
        return int.from_bytes(h.digest()[:8], "little") & ((1 << 63) - 1)

    layout = layout_of(_state())
    assert layout_hash(layout) == want(layout) and 0 <= want(layout) < 1 << 63
    several = [((f"t{i}", torch.float32, (i,)),) for i in range(8)]
    assert [layout_hash(x) for x in several] == [want(x) for x in several]
    assert any(want(x) >> 62 for x in several)  # the top bit of the 63 is in use
    assert layout_hash(()) == int.from_bytes(hashlib.sha256().digest()[:8], "little") & ((1 << 63) - 1)
    changed = [(("x",) + layout[0][1:],), ((layout[0][0], torch.float32, layout[0][2]),), ((*layout[0][:2], (6,)),)]
    assert len({layout_hash(layout[:1])} | {layout_hash(c) for c in changed}) == 4


def test_the_stream_is_cut_into_buckets_of_the_bucket_size_with_tensors_spanning_them():
    plan = BucketPlan.of(layout_of(_state()), 32)
    assert plan.sizes == (32, 32, 32, 32, 32, 4) and plan.total_bytes == 164 and len(plan) == 6
    assert _cut(plan) == [[("a", 0, 32, 0)], [("a", 32, 8, 0), ("b", 0, 12, 8), ("c", 0, 12, 20)],
                          [("c", 12, 32, 0)], [("c", 44, 32, 0)],
                          [("c", 76, 24, 0), ("d", 0, 4, 24), ("e", 0, 4, 28)], [("e", 4, 4, 0)]]
    assert [plan.direct(k) for k in range(len(plan))] == [True, False, True, True, False, True]
    assert plan.staged_size() == 32 and plan.pack_bytes is None and plan.bucket_bytes == 32


def test_with_a_pack_size_a_large_tensor_has_buckets_of_its_own_and_small_ones_pack_together():
    plan = BucketPlan.of(layout_of(_state()), 32, 16)
    assert plan.sizes == (32, 8, 12, 32, 32, 32, 4, 12)
    assert _cut(plan) == [[("a", 0, 32, 0)], [("a", 32, 8, 0)], [("b", 0, 12, 0)], [("c", 0, 32, 0)],
                          [("c", 32, 32, 0)], [("c", 64, 32, 0)], [("c", 96, 4, 0)],
                          [("d", 0, 4, 0), ("e", 0, 8, 4)]]
    assert [plan.direct(k) for k in range(len(plan))] == [True] * 7 + [False]
    assert plan.staged_size() == 12
    # packed buckets fill to the pack size, a tensor spilling into the next one; 16 bytes exactly is alone
    small = {"p": torch.zeros(12, dtype=torch.uint8), "q": torch.zeros(8, dtype=torch.uint8),
             "r": torch.zeros(16, dtype=torch.uint8), "s": torch.zeros(15, dtype=torch.uint8)}
    plan = BucketPlan.of(layout_of(small), 32, 16)
    assert _cut(plan) == [[("p", 0, 12, 0), ("q", 0, 4, 12)], [("q", 4, 4, 0)], [("r", 0, 16, 0)],
                          [("s", 0, 15, 0)]]


def test_a_plan_of_only_direct_buckets_stages_nothing_and_sizes_under_one_byte_are_refused():
    plan = BucketPlan.of((("w", torch.float32, (16,)),), 16, 8)
    assert plan.sizes == (16, 16, 16, 16) and plan.staged_size() == 0
    for bucket, pack in ((0, None), (1, 0), (-1, 4)):
        with pytest.raises(ValueError, match=f"bucket sizes must be at least one byte, got {bucket} and {pack}"):
            BucketPlan.of(plan.layout, bucket, pack)
    assert BucketPlan.of(plan.layout, 1, 1).sizes == (1,) * 64


def test_the_fingerprint_covers_the_layout_and_both_sizes():
    layout = layout_of(_state())
    plan = BucketPlan.of(layout, 32, 16)
    assert plan.fingerprint() == layout_hash(layout + (("", 32, 16),))
    others = [BucketPlan.of(layout, 33, 16), BucketPlan.of(layout, 32, 17), BucketPlan.of(layout, 32),
              BucketPlan.of(layout[1:], 32, 16)]
    assert len({plan.fingerprint()} | {o.fingerprint() for o in others}) == 5


def test_a_pickup_from_s_sources_moves_buckets_of_a_share_of_the_bucket_and_pack_sizes():
    layout = layout_of(_state())
    assert plan_for(layout, 1000, 2) == BucketPlan.of(layout, 500, 500)
    assert plan_for(layout, 1000, 3) == BucketPlan.of(layout, 333, 333)
    big = 4 * PACK_BYTES
    plan = plan_for(layout, big, 2)
    assert (plan.bucket_bytes, plan.pack_bytes) == (2 * PACK_BYTES, PACK_BYTES // 2)
    assert plan_for(layout, 64, 0) == BucketPlan.of(layout, 64, 64)  # no sources: as one
    assert plan_for(layout, 1, 4) == BucketPlan.of(layout, 1, 1)  # never under a byte
    assert PACK_BYTES == B.SYNC_PACK_MB << 20


# --------------------------------------------------------------------------------------- the handshake words
def test_a_runs_secret_is_fresh_and_its_group_id_fits_a_signed_word():
    secret = new_secret()
    assert len(secret) == 64 and bytes.fromhex(secret) and secret != new_secret()
    digest = hashlib.sha256(b"digen-sync|" + bytes.fromhex(secret)).digest()
    assert group_id(secret) == int.from_bytes(digest[:8], "little") >> 1
    assert 0 <= group_id(secret) < 1 << 63 and group_id(secret) != group_id(new_secret())


def test_the_handshake_words_are_signed_little_endian_int64():
    raw = struct.pack("<qq", 1, -2)
    assert S._words(raw) == [1, -2] and S._bytes([1, -2]) == raw
    assert S._words(bytes(range(16))) == list(struct.unpack("<2q", bytes(range(16))))
    assert S._bytes(S._words(b"\xff" * 24)) == b"\xff" * 24 and S._words(b"") == []
    n = S._nonce()
    assert len(n) == S.NONCE_BYTES == 32 and n != S._nonce()


# ---------------------------------------------------------------------------------------- sockets and groups
def test_the_listener_is_bound_to_the_given_address_and_port_only_and_listens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sock = S.bind_listener("127.0.0.1", port)
    with sock:
        assert sock.family == socket.AF_INET and sock.getsockname() == ("127.0.0.1", port)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) != 0
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    try:  # where the host has an IPv6 loopback, an IPv6 address gets an IPv6 listener
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return
    with S.bind_listener("::1", 0) as six:
        assert six.family == socket.AF_INET6 and six.getsockname()[0] == "::1"


def test_the_local_address_is_the_one_on_the_route_to_the_peer_else_the_peer():
    assert S._local_address("127.0.0.1") == "127.0.0.1"
    assert S._local_address("127.0.0.2") == "127.0.0.1"  # the route's source, not the peer echoed back
    try:  # an IPv6 socket reaches an IPv4-mapped peer where the host has IPv6 at all
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.connect(("::ffff:127.0.0.2", 9))
    except OSError:
        return
    assert S._local_address("::ffff:127.0.0.2") == "::ffff:127.0.0.1"
    assert S._local_address("no-such-host.invalid") == "no-such-host.invalid"


def _threads(*fns, seconds: float = 10.0) -> list:
    out: list = [None] * len(fns)

    def call(i: int, fn) -> None:
        try:
            out[i] = fn()
        except BaseException as err:  # noqa: BLE001 - inspected by the test
            out[i] = err

    ts = [threading.Thread(target=call, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(seconds)
    assert not any(t.is_alive() for t in ts), f"still running after {seconds} s"
    return out


def test_a_gloo_group_takes_the_given_timeout_and_its_ranks_exchange():
    store = torch.distributed.HashStore()

    def rank(r: int) -> tuple:
        pg = S._gloo_group(store, r, 2, timedelta(seconds=7), "127.0.0.1")
        t = torch.tensor([float(r + 1)])
        pg.allreduce([t]).wait()
        return pg.rank(), pg.size(), t.item(), pg.options._timeout

    assert _threads(lambda: rank(0), lambda: rank(1)) == [(0, 2, 3.0, timedelta(seconds=7)),
                                                          (1, 2, 3.0, timedelta(seconds=7))]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recording_gloo(monkeypatch, options_api: bool = True) -> tuple[list, list]:
    """``sync``'s view of ``ProcessGroupGloo``, recording each group made and each device asked for."""
    real = torch.distributed.ProcessGroupGloo
    calls: list = []
    devices: list = []

    def group(*args):
        calls.append(args)
        return real(*args)

    def create_device(**kwargs):
        devices.append(kwargs)
        return real.create_device(**kwargs)

    if options_api:
        group._Options, group.create_device = real._Options, create_device
    monkeypatch.setattr(S, "dist", types.SimpleNamespace(ProcessGroupGloo=group))
    return calls, devices


def test_a_gloo_group_binds_its_sockets_to_the_given_address_with_the_given_timeout(monkeypatch):
    calls, devices = _recording_gloo(monkeypatch)
    store = torch.distributed.HashStore()
    pg = S._gloo_group(store, 0, 1, timedelta(seconds=7), "127.0.0.1")
    assert devices == [{"hostname": "127.0.0.1"}] and len(calls) == 1  # made once: no fallback
    ((got_store, rank, world, opts),) = calls
    assert got_store is store and (rank, world) == (0, 1)
    assert isinstance(opts, torch.distributed.ProcessGroupGloo._Options)
    assert opts._timeout == timedelta(seconds=7) and len(opts._devices) == 1 and pg.size() == 1


def test_without_the_options_api_a_gloo_group_takes_the_default_device_and_the_timeout(monkeypatch):
    calls, devices = _recording_gloo(monkeypatch, options_api=False)
    store = torch.distributed.HashStore()
    pg = S._gloo_group(store, 0, 1, timedelta(seconds=7), "127.0.0.1")
    assert calls == [(store, 0, 1, timedelta(seconds=7))] and devices == [] and pg.size() == 1


def test_the_handshake_mac_is_hmac_sha256_of_the_label_the_head_words_and_the_nonces():
    import hmac

    wire, secret = _Loopback(), new_secret()
    g = _member(wire, 0, secret)
    head, n1, n2 = [g.group_id, 3, -1, 2, 1], bytes(range(32)), bytes(range(32, 64))
    digest = hmac.new(bytes.fromhex(secret), b"digen-send" + struct.pack("<5q", *head) + n1 + n2,
                      hashlib.sha256).digest()
    assert g._mac(b"digen-send", head, n1, n2) == list(struct.unpack("<4q", digest))


def test_a_generator_relays_to_a_member_of_a_lower_rank():
    """A relay's destination may be any other member, rank 0 included."""
    state = _mixed_state()
    wire, secret = _Loopback(), new_secret()
    relay, dst = _member(wire, 1, secret), _member(wire, 0, secret)
    packer = Packer(state, 64, torch.device("cpu"))
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("out", relay.serve(0, 2, packer.plan, packer.bucket)),
                         daemon=True)
    t.start()
    into = {k: torch.zeros_like(v) for k, v in state.items()}
    dst.receive(2, plan_for(layout_of(state), 64, 1), into, [1])
    t.join(5)
    assert all(torch.equal(into[k], state[k]) for k in state) and "out" in box




def test_a_sync_group_forms_in_this_process_with_its_store_on_rank_0_and_every_members_node(monkeypatch):
    """Rank 0 serves on the given address (127.0.0.2 here); every other rank binds its gloo sockets to its own
    address on the route there (127.0.0.1)."""
    port, secret = _port(), new_secret()
    hosts: dict[int, str] = {}
    real = S._gloo_group

    def recorded(store, rank, world, timeout, host):
        hosts[rank] = host
        return real(store, rank, world, timeout, host)

    monkeypatch.setattr(S, "_gloo_group", recorded)
    a, b = _threads(lambda: SyncGroup("127.0.0.2", port, 2, 0, timeout_s=7, secret=secret, node="n0"),
                    lambda: SyncGroup("127.0.0.2", port, 2, 1, timeout_s=7, secret=secret))
    assert hosts == {0: "127.0.0.2", 1: "127.0.0.1"}
    assert isinstance(a, SyncGroup) and isinstance(b, SyncGroup), (a, b)
    assert a.store_server is not None and b.store_server is None and a.store_server.world == 2
    assert (a.rank, a.world, a.backend, b.rank, b.world, b.backend) == (0, 2, "gloo", 1, 2, "gloo")
    assert a.device == b.device == torch.device("cpu")
    assert a._key == b._key == bytes.fromhex(secret) and a.group_id == b.group_id == group_id(secret)
    assert a.node == "n0" and b.node == socket.gethostname()
    assert a._nodes == b._nodes == {0: "n0", 1: socket.gethostname()}
    assert a.counters == b.counters == {"sent": 0, "received": 0} and a._pool == [] and b._pool == []
    assert a.pg.rank() == 0 and b.pg.rank() == 1 and a.pg.size() == 2
    assert a.pg.options._timeout == timedelta(seconds=7)
    assert a.store.port == port and a.store.host == "127.0.0.2" and a.store._timeout_s == 7
    state = {"w": torch.arange(6, dtype=torch.float64)}
    sent, got = _threads(lambda: a.send(1, 1, state, 16), lambda: b.recv(1, state, 16))
    assert torch.equal(got["w"], state["w"]), (sent, got)
    assert a.counters["sent"] == b.counters["received"] == 48


def test_a_lone_sync_group_waits_300_s_by_default_and_starts_with_nothing_counted():
    """A one-member group forms without a peer (fast, and alone in its test: a mutant that breaks a member's
    fields fails here before any two-member test waits on a peer that broke)."""
    secret = new_secret()
    g = SyncGroup("127.0.0.1", _port(), 1, 0, secret=secret)
    assert g.store._timeout_s == 300.0 and g.pg.options._timeout == timedelta(seconds=300)
    assert g.backend == "gloo" and g.store_server.members == 1 and g.store_server.world == 1
    assert (g.rank, g.world, g.device) == (0, 1, torch.device("cpu")) and g.pg.size() == 1
    assert g._key == bytes.fromhex(secret) and g.group_id == group_id(secret)
    assert g.node == socket.gethostname() and g._nodes == {0: socket.gethostname()}
    assert g.counters == {"sent": 0, "received": 0} and g._pool == []


def test_a_sync_group_refuses_a_rank_out_of_range_a_missing_secret_and_an_unknown_backend():
    for rank, world in ((-1, 2), (2, 2)):
        with pytest.raises(ValueError, match=f"sync-group rank {rank} out of range for world {world}"):
            SyncGroup("127.0.0.1", 1, world, rank, secret=new_secret())
    with pytest.raises(ValueError, match="^the weight-sync group needs the run's secret \\(new_secret\\(\\)\\)$"):
        SyncGroup("127.0.0.1", 1, 2, 0, secret="ab" * 15)
    with pytest.raises(ValueError, match="unknown sync backend 'mpi'; expected 'gloo' or 'nccl'"):
        SyncGroup("127.0.0.1", _port(), 1, 0, "mpi", timeout_s=5, secret="ab" * 16)
    if not torch.cuda.is_available():  # a known backend: NCCL's own error on a machine without CUDA
        with pytest.raises(Exception) as nccl:  # noqa: PT011 - whichever error torch's NCCL raises here
            SyncGroup("127.0.0.1", _port(), 1, 0, "nccl", timeout_s=5, secret="ab" * 16)
        assert "unknown sync backend" not in str(nccl.value)


# -------------------------------------------------------------------------------------------- the source's side
def test_a_source_refuses_a_destination_outside_the_group_or_itself():
    wire, secret = _Loopback(), new_secret()
    src = _member(wire, 0, secret)
    packer = Packer(_mixed_state(), 64, torch.device("cpu"))
    for dst in (-1, 0, 2):
        with pytest.raises(ValueError, match=f"destination {dst} out of range \\(world 2, this rank 0\\)"):
            src.serve(dst, 1, packer.plan, packer.bucket)


@pytest.mark.parametrize("verify", [False, True])
def test_a_source_counts_what_it_sent_by_kind_and_by_the_receivers_node(verify):
    state = _mixed_state()
    wire, secret = _Loopback(), new_secret()
    src, dst = _member(wire, 0, secret), _member(wire, 1, secret)
    src._nodes[1] = "elsewhere"
    _, into, out = _pickup(state, verify=verify, members=(src, dst))
    assert not isinstance(out, Exception) and not isinstance(src.outcome, Exception), (out, src.outcome)
    total = sum(byte_view(t).numel() for t in state.values())
    assert src.outcome[ledger.DEVICE_TO_DEVICE] == total and src.outcome[ledger.INTER_NODE] == total
    assert ledger.INTRA_NODE not in src.outcome and src.counters == {"sent": total, "received": 0}
    assert out[ledger.INTRA_NODE] == total and dst.counters == {"sent": 0, "received": total}
    assert src.outcome.get(ledger.HASHED, 0) == (total if verify else 0)


def test_a_source_sends_nothing_to_a_receiver_that_accepts_without_proving_the_secret():
    wire, secret = _Loopback(), new_secret()
    src = _member(wire, 0, secret)
    fake = wire.group(1)
    packer = Packer(_mixed_state(), 64, torch.device("cpu"))
    head = [src.group_id, 1, packer.plan.fingerprint(), 1, 0]

    def receiver() -> None:
        fake.send([torch.tensor(head + [0] * 4, dtype=torch.int64)], 0, 0)
        reply = torch.zeros(5 + 4 + 4, dtype=torch.int64)
        fake.recv([reply], 0, 0)
        fake.send([torch.tensor([1, 2, 3, 4, 5], dtype=torch.int64)], 0, 0)  # "ok", with a MAC it cannot make

    t = threading.Thread(target=receiver, daemon=True)
    t.start()
    with pytest.raises(SyncRefused, match="sync rank 1 does not hold this run's secret; nothing was sent"):
        src.serve(1, 1, packer.plan, packer.bucket)
    t.join(5)
    assert src.counters["sent"] == 0 and wire._queue(0, 1).qsize() == 0  # nothing after its reply


def test_a_packer_packs_a_detached_contiguous_copy_and_reuses_scratch_that_fits_within_twice_its_need():
    w = torch.arange(12, dtype=torch.float64).reshape(3, 4).t().requires_grad_(True)  # not contiguous
    state = {"w": w, "a": torch.ones(3, dtype=torch.float64), "b": torch.full((3,), 2.0, dtype=torch.float64)}
    packer = Packer(state, 64, torch.device("cpu"))
    assert packer.plan == plan_for(layout_of(state), 64, 1)
    t = packer.tensors["w"]
    assert t.is_contiguous() and not t.requires_grad and torch.equal(t, w.detach())
    size = packer.plan.staged_size()
    assert size > 0 and [b.numel() for b in packer.scratch] == [size, size] and packer.staging_bytes == 2 * size
    fits, twice, over, small = (torch.empty(n, dtype=torch.uint8) for n in (size, 2 * size, 2 * size + 1, size - 1))
    reused = Packer(state, 64, torch.device("cpu"), scratch=[over, small, fits, twice, fits])
    assert reused.scratch[0] is fits and reused.scratch[1] is twice and len(reused.scratch) == 2
    one = Packer(state, 64, torch.device("cpu"), scratch=[over, twice])
    assert one.scratch[0] is twice and one.scratch[1].numel() == size
    for k in range(len(packer.plan)):
        want = torch.empty(packer.plan.sizes[k], dtype=torch.uint8)
        B.pack(packer.plan, k, packer.tensors, want)
        assert torch.equal(packer.bucket(k, k % 2), want)
