"""The collective weight sync's transfer itself, members as threads of this process over real gloo groups:
the bucket cut (every byte once, no bucket over its size), pickups from several sources and relays that
arrive bit-identical and counted, the challenge-response (a stranger, a copied group id, a replayed
handshake, a receiver without the secret), the opt-in payload check, and a generator whose pickup broke
half-way refusing to generate (docs/architecture.md, "Weight sync")."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import torch
from workers_helpers import rows_of, tiny_cfg

from verl_digen.schedule import ledger
from verl_digen.workers import policy as P
from verl_digen.workers import sync as S
from verl_digen.workers.buckets import (
    BucketPlan,
    byte_view,
    layout_of,
    new_bucket,
    pack,
    pack_owned,
    plan_for,
    unpack,
)
from verl_digen.workers.sync import Packer, SyncGroup, SyncRefused, group_id, new_secret

pytestmark = pytest.mark.slow  # real process groups on loopback


def _state() -> dict[str, torch.Tensor]:
    """Tensors of several dtypes and sizes: some span buckets, one is empty."""
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(37, 11, generator=g, dtype=torch.float64),
            "b.bias": torch.randn(5, generator=g).to(torch.bfloat16),
            "c.empty": torch.empty(0, 4),
            "d.big": torch.randn(300, generator=g),
            "e.int": torch.arange(9, dtype=torch.int64)}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*members) -> list:
    """Run each member (a function) on its own thread; return their results, re-raising nothing."""
    out: list = [None] * len(members)

    def call(i, fn):
        try:
            out[i] = fn()
        except BaseException as err:  # noqa: BLE001 - inspected by the test
            out[i] = err

    threads = [threading.Thread(target=call, args=(i, fn)) for i, fn in enumerate(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


# ------------------------------------------------------------------------------------------------ buckets
@pytest.mark.parametrize("bucket_bytes, pack_bytes", [(1, None), (7, None), (64, None), (100, None),
                                                      (10_000, None), (64, 16), (1000, 200), (100, 10_000)])
def test_the_bucket_cut_holds_every_byte_once_and_no_bucket_exceeds_its_size(bucket_bytes, pack_bytes):
    state = _state()
    plan = BucketPlan.of(layout_of(state), bucket_bytes, pack_bytes)
    total = sum(t.numel() * t.element_size() for t in state.values())
    assert plan.total_bytes == total and all(0 < s <= max(bucket_bytes, pack_bytes or 0) for s in plan.sizes)
    for k, pieces in enumerate(plan.pieces):  # a tensor of its own never shares a bucket; packed ones stay small
        big = [p for p in pieces if pack_bytes is not None and state[p.name].numel() * state[p.name].element_size()
               >= pack_bytes]
        assert not big or (len(pieces) == 1 and plan.direct(k) and plan.sizes[k] <= bucket_bytes)
        if pack_bytes is not None and not big:
            assert plan.sizes[k] <= pack_bytes
    covered = {name: [] for name in state}
    for b, pieces in enumerate(plan.pieces):
        assert sum(p.length for p in pieces) == plan.sizes[b]
        for p in pieces:
            covered[p.name].append((p.start, p.start + p.length))
    for name, t in state.items():
        spans = sorted(covered[name])
        if not t.numel():
            assert spans == []  # an empty tensor takes no bytes of any bucket
            continue
        assert [s for s, _ in spans] == [0] + [e for _, e in spans[:-1]]  # contiguous, no overlap
        assert spans[-1][1] == t.numel() * t.element_size()
    for sources in (1, 2, 3):
        owned = [plan.owned(i, sources) for i in range(sources)]
        assert sorted(b for o in owned for b in o) == list(range(len(plan)))


def test_packing_then_unpacking_gives_back_every_tensor_bit_for_bit():
    state = _state()
    plan = BucketPlan.of(layout_of(state), 64)
    out = {k: torch.full_like(v, 3) for k, v in state.items()}
    for b in range(len(plan)):
        unpack(plan, b, pack(plan, b, state, new_bucket(plan, b, "cpu")), out)
    assert all(torch.equal(byte_view(out[k]), byte_view(state[k])) for k in state)
    # a source packing only its own buckets from a stream of full tensors packs the same bytes
    owned = plan.owned(1, 3)
    mine = pack_owned(plan, owned, ((n, state[n]) for n, _, _ in plan.layout), "cpu")
    assert all(torch.equal(mine[b], pack(plan, b, state, new_bucket(plan, b, "cpu"))) for b in owned)


# ------------------------------------------------------------------------------------------------ transfers
def test_a_pickup_from_two_sources_then_a_relay_arrive_bit_identical_and_counted():
    """Two trainer ranks each send their own buckets to generator A; A then relays the whole version to B.
    The receivers' ledgers count the model once over the transport, nothing hashed; staging stays within two
    buckets; each source sent exactly its share."""
    state, port, secret, bucket = _state(), _port(), new_secret(), 64
    plan = plan_for(layout_of(state), bucket, 2)  # two senders: buckets of half the size
    total = plan.total_bytes
    zeros = {k: torch.zeros_like(v) for k, v in state.items()}
    got_a, got_b = dict(zeros), {k: v.clone() for k, v in zeros.items()}

    def source(rank):
        def run():
            g = SyncGroup("127.0.0.1", port, 4, rank, timeout_s=60, secret=secret)
            staged = pack_owned(plan, plan.owned(rank, 2), ((n, state[n]) for n, _, _ in plan.layout), "cpu")
            g.serve(2, 7, plan, lambda k, slot: staged[k], source=rank, sources=2)
            return g  # kept alive: rank 0 hosts the group's store
        return run

    def generator_a():
        g = SyncGroup("127.0.0.1", port, 4, 2, timeout_s=60, secret=secret)
        moved = g.receive(7, plan, got_a, [0, 1])
        packer = Packer(got_a, bucket, g.device)
        g.serve(3, 7, packer.plan, packer.bucket)
        return moved, packer.staging_bytes

    def generator_b():
        g = SyncGroup("127.0.0.1", port, 4, 3, timeout_s=60, secret=secret)
        return g.receive(7, plan_for(layout_of(state), bucket, 1), got_b, [2])

    src0, src1, (moved_a, relay_staging), moved_b = _run(source(0), source(1), generator_a, generator_b)
    sent0, sent1 = src0.counters, src1.counters
    for got in (got_a, got_b):
        assert all(torch.equal(byte_view(got[k]), byte_view(state[k])) for k in state)
    assert sent0["sent"] == sum(plan.sizes[b] for b in plan.owned(0, 2)) and sent0["sent"] + sent1["sent"] == total
    for moved in (moved_a, moved_b):
        assert moved[ledger.DEVICE_TO_DEVICE] == moved[ledger.INTRA_NODE] == total
        assert ledger.HASHED not in moved and ledger.HOST_COPIES not in moved
        assert moved.get(ledger.STAGING_PEAK, 0) <= 2 * bucket
    assert relay_staging <= 2 * bucket


def test_a_payload_changed_on_the_way_is_refused_with_verify_payload_and_nothing_is_installed(monkeypatch):
    """digen.sync.verify_payload: the sender's MAC covers the bytes it hashed; a byte that changes after that
    (on the wire) fails the receiver's check, and the staged buckets never reach the weights."""
    state, port, secret = _state(), _port(), new_secret()
    hash_into = S._hash_into

    def tamper(digest, buf, out):  # the sender hashes, then the bytes change before they are sent
        hash_into(digest, buf, out)
        if threading.current_thread().name == "sender" and buf.numel():
            buf[0] ^= 1

    monkeypatch.setattr(S, "_hash_into", tamper)
    into = {k: torch.zeros_like(v) for k, v in state.items()}

    def sender():
        g = SyncGroup("127.0.0.1", port, 2, 0, timeout_s=60, secret=secret)
        return g.send(1, 3, state, bucket_bytes=64, verify_payload=True)

    def receiver():
        g = SyncGroup("127.0.0.1", port, 2, 1, timeout_s=60, secret=secret)
        return g.receive(3, plan_for(layout_of(state), 64, 1), into, [0], verify_payload=True)

    out: list = [None, None]
    t = threading.Thread(target=lambda: out.__setitem__(0, sender()), name="sender")
    t.start()
    out[1] = _run(receiver)[0]
    t.join(60)
    assert isinstance(out[1], SyncRefused) and "does not match its MAC" in str(out[1])
    assert all(not v.any() for v in into.values()), "a refused payload was installed"


def test_verify_payload_hashes_every_byte_on_both_ends_when_asked():
    state, port, secret = _state(), _port(), new_secret()
    into = {k: torch.zeros_like(v) for k, v in state.items()}
    total = sum(t.numel() * t.element_size() for t in state.values())
    sent, moved = _run(
        lambda: SyncGroup("127.0.0.1", port, 2, 0, timeout_s=60, secret=secret).send(1, 3, state, 64, True),
        lambda: SyncGroup("127.0.0.1", port, 2, 1, timeout_s=60, secret=secret).receive(
            3, plan_for(layout_of(state), 64, 1), into, [0], verify_payload=True))
    assert sent[ledger.HASHED] == moved[ledger.HASHED] == total
    assert all(torch.equal(byte_view(into[k]), byte_view(state[k])) for k in state)


def test_small_tensors_share_packed_buckets_and_arrive_bit_identical_through_two_staging_buffers():
    """Tensors smaller than a bucket are packed together: the receiver unpacks each packed bucket from one of two
    staging buffers it reuses (two buckets in flight), however many packed buckets come."""
    g = torch.Generator().manual_seed(3)
    state = {f"n{i}.w": torch.randn(3, generator=g, dtype=torch.float64) for i in range(12)}  # 24 bytes each
    port, secret = _port(), new_secret()
    plan = plan_for(layout_of(state), 64, 1)  # 288 bytes in five packed buckets of up to 64
    assert sum(not plan.direct(k) for k in range(len(plan.pieces))) == 5
    into = {k: torch.zeros_like(v) for k, v in state.items()}
    _, moved = _run(
        lambda: SyncGroup("127.0.0.1", port, 2, 0, timeout_s=60, secret=secret).send(1, 3, state, 64),
        lambda: SyncGroup("127.0.0.1", port, 2, 1, timeout_s=60, secret=secret).receive(3, plan, into, [0]))
    assert all(torch.equal(into[k], state[k]) for k in state)
    assert moved[ledger.STAGING_PEAK] == 2 * plan.staged_size()


def test_a_replayed_handshake_is_refused_before_any_tensor_moves():
    """A stranger that recorded a real sender's handshake reply (version, layout and MAC included) replays
    it to the same generator: the generator's fresh nonce makes the recorded MAC wrong."""
    state, secret = _state(), new_secret()
    port = _port()
    recorded: list[torch.Tensor] = []

    def sender():
        g = SyncGroup("127.0.0.1", port, 2, 0, timeout_s=60, secret=secret)
        send = g._send

        def recording(t, peer):
            recorded.append(t.clone())
            send(t, peer)
        g._send = recording
        return g.send(1, 4, state)

    _run(sender, lambda: SyncGroup("127.0.0.1", port, 2, 1, timeout_s=60, secret=secret).recv(4, state))
    reply = recorded[0]  # head, the sender's nonce, its MAC over the generator's old nonce
    port2 = _port()
    into = {k: torch.zeros_like(v) for k, v in state.items()}

    def stranger():
        g = SyncGroup("127.0.0.1", port2, 2, 0, timeout_s=60, secret=secret)  # past the store (test_sync_store)
        g._key = bytes.fromhex(new_secret())  # but without the run's key; the group id copied from the wire
        challenge = torch.zeros(5 + 4, dtype=torch.int64)
        g._recv(challenge, 1)
        g._send(reply, 1)
        answer = torch.zeros(5, dtype=torch.int64)
        g._recv(answer, 1)
        return answer.tolist()

    answer, err = _run(stranger, lambda: SyncGroup("127.0.0.1", port2, 2, 1, timeout_s=60, secret=secret).receive(
        4, plan_for(layout_of(state), S.DEFAULT_BUCKET_BYTES, 1), into, [0]))
    assert answer == [0] * 5
    assert isinstance(err, SyncRefused) and "handshake does not verify" in str(err) and "nothing was loaded" in str(err)
    assert all(not v.any() for v in into.values())


def test_a_receiver_without_the_secret_is_sent_nothing():
    """The challenge-response is mutual: a stranger posing as a generator (group id copied) cannot pull the
    weights; the sender stops after the handshake, having sent no tensor."""
    state, port, secret = _state(), _port(), new_secret()

    def stranger():  # accepts whatever the sender proves and answers with a MAC it cannot make
        g = SyncGroup("127.0.0.1", port, 2, 1, timeout_s=5, secret=secret)  # past the store (test_sync_store)
        g._key = bytes.fromhex(new_secret())  # but without the run's key
        head = [group_id(secret), 4, plan_for(layout_of(state), S.DEFAULT_BUCKET_BYTES, 1).fingerprint(), 1, 0]
        g._send(torch.tensor(head + [7] * 4, dtype=torch.int64), 0)
        g._recv(torch.zeros(5 + 4 + 4, dtype=torch.int64), 0)
        g._send(torch.tensor([1, 1, 2, 3, 4], dtype=torch.int64), 0)
        bucket = torch.zeros(64, dtype=torch.uint8)
        g._recv(bucket, 0)  # nothing comes: times out
        return bucket

    holder = {}

    def source():
        holder["g"] = SyncGroup("127.0.0.1", port, 2, 0, timeout_s=60, secret=secret)
        return holder["g"].send(1, 4, state)

    sent, got = _run(source, stranger)
    assert isinstance(sent, SyncRefused) and "does not hold this run's secret; nothing was sent" in str(sent)
    assert holder["g"].counters["sent"] == 0
    assert isinstance(got, Exception)


# ------------------------------------------------------------------------------------------------ generator
@pytest.fixture
def generator(monkeypatch):
    from verl_digen.workers.generator import GeneratorWorker

    for key, value in {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()),
                       "VERL_PLATFORM": "cpu"}.items():
        monkeypatch.setitem(os.environ, key, value)
    worker = GeneratorWorker(tiny_cfg(sync_backend="collective", sync_bucket_mb=1))
    worker.init_model()
    return worker


def test_a_pickup_that_breaks_half_way_leaves_the_generator_refusing_to_generate_until_one_completes(generator):
    """A source that passes the handshake and then sends nothing: the receive times out, the weights may be
    torn, so the generator refuses to generate; a complete pickup of the same version clears it."""
    cfg = generator.cfg
    trainer_weights = P.live_weights(P.build_policy(cfg), lora=False)
    plan = plan_for(layout_of(trainer_weights), cfg.sync_bucket_mb << 20, 1)
    secret, port = new_secret(), _port()

    def silent_source():
        g = SyncGroup("127.0.0.1", port, 2, 0, timeout_s=3, secret=secret)
        with pytest.raises(RuntimeError):
            g.serve(1, 1, plan, lambda k, slot: (_ for _ in ()).throw(RuntimeError("source died")))
        return g

    def receive():
        generator.join_sync_group("127.0.0.1", port, 2, 1, timeout_s=3, secret=secret)
        return generator.recv_weights(1, [0])

    _, err = _run(silent_source, receive)
    assert isinstance(err, RuntimeError) and not isinstance(err, SyncRefused)
    rows, prompts = rows_of([0], 2)
    with pytest.raises(RuntimeError, match="pickup of version 1 failed half-way.*torn"):
        generator.generate(0, 0, rows, prompts)
    packer = Packer(trainer_weights, cfg.sync_bucket_mb << 20, torch.device("cpu"))
    port = _port()  # a fresh group: the timed-out one is closed

    def complete_source():
        g = SyncGroup("127.0.0.1", port, 2, 0, timeout_s=30, secret=secret)
        g.serve(1, 1, packer.plan, packer.bucket)
        return g

    def complete_receive():
        generator.join_sync_group("127.0.0.1", port, 2, 1, timeout_s=30, secret=secret)
        return generator.recv_weights(1, [0])

    _, done = _run(complete_source, complete_receive)
    assert done["version"] == 1 and done["received"]
    assert len(generator.generate(0, 1, rows, prompts)) == 2


@pytest.mark.parametrize("sources, verify", [(2, False), (2, True), (1, False)])
def test_a_pickup_into_an_engine_lands_each_tensor_once_complete_and_keeps_no_whole_copy(sources, verify):
    """rollout.backend=vllm (issue 43): the receiver's ``into`` is an ``EngineSink``: a tensor exists from its
    first bucket to its last, then goes to the engine's load (here: recorded) and is dropped. Every tensor reaches
    the engine once, bit for bit; from one source (two buckets in flight) the sink holds two tensors at most.
    (From several, a source ahead of the others leaves tensors half-landed: up to the skew between them.)"""
    from verl_digen.workers.vllm_backend import EngineSink

    g = torch.Generator().manual_seed(1)
    state = {f"blocks.{i}.w": torch.randn(64, 64, generator=g) for i in range(8)}  # 16 KiB each
    state["norm.b"] = torch.randn(3, generator=g).to(torch.bfloat16)
    port, secret, bucket = _port(), new_secret(), 8 << 10
    plan = plan_for(layout_of(state), bucket, sources)
    loads: list[dict[str, torch.Tensor]] = []
    world = sources + 1

    def source(rank):
        def run():
            grp = SyncGroup("127.0.0.1", port, world, rank, timeout_s=60, secret=secret)
            staged = pack_owned(plan, plan.owned(rank, sources), ((n, state[n]) for n, _, _ in plan.layout), "cpu")
            grp.serve(sources, 5, plan, lambda k, slot: staged[k], source=rank, sources=sources,
                      verify_payload=verify)
            return grp
        return run

    sink = EngineSink(plan, "cpu", lambda chunk: loads.append({k: v.clone() for k, v in chunk.items()}))

    def engine_generator():
        grp = SyncGroup("127.0.0.1", port, world, sources, timeout_s=60, secret=secret)
        moved = grp.receive(5, plan, sink, list(range(sources)), verify, on_landed=sink.landed)
        sink.check_complete()
        return moved

    *_, moved = _run(*(source(r) for r in range(sources)), engine_generator)
    assert not isinstance(moved, BaseException), moved
    names = [k for chunk in loads for k in chunk]
    assert sorted(names) == sorted(state)  # each tensor handed over once
    for chunk in loads:
        assert all(torch.equal(byte_view(v), byte_view(state[k])) for k, v in chunk.items())
    assert not sink.live and not sink.done
    if sources == 1:  # the tensors of the two buckets in flight, never the model
        assert 0 < sink.peak_bytes <= 2 * state["blocks.0.w"].numel() * 4
