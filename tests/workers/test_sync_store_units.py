"""The weight-sync rendezvous store (workers/sync_store.py) piece by piece, in this process over loopback
sockets, each test in milliseconds: the frame format, reads bounded by a deadline, the challenge (what a
stranger is told and what it can hold), what a member checks of the store, and the key semantics gloo and
NCCL rely on (``get`` / ``wait`` block until a key is set, ``add``, ``compare_set``, ``check``, ``delete_key``,
``num_keys``). The same store under real gloo groups, with a stranger during a pickup, is
tests/workers/test_sync_store.py (slow). Every call that could block runs under a deadline, so a hang fails
its test instead of holding the run."""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import threading
import time
from datetime import timedelta

import pytest
from socket_helpers import closed, wait_for

from verl_digen.workers import sync_store as SS
from verl_digen.workers.sync import bind_listener, new_secret
from verl_digen.workers.sync_store import StoreRefused, StoreServer, SyncStore


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bounded(fn, seconds: float = 3.0):
    """``fn()``'s value (or its exception, re-raised), failing the test if it takes over ``seconds``."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised below
            box["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _server(world: int = 2, key: bytes | None = None) -> tuple[StoreServer, int, bytes]:
    port, key = _port(), key or bytes.fromhex(new_secret())
    return StoreServer(bind_listener("127.0.0.1", port), key, world), port, key


def _member(port: int, key: bytes, timeout_s: float = 2.0) -> SyncStore:
    return _bounded(lambda: SyncStore("127.0.0.1", port, key, timeout_s), timeout_s + 2)


def _hello(port: int) -> tuple[socket.socket, bytes]:
    """A raw connection and the server's nonce from its greeting."""
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    hello = SS._recv_exact(s, 11 + SS._NONCE)
    assert hello[:11] == b"DIGENSTORE1"
    return s, hello[11:]


# ------------------------------------------------------------------------------------------ the wire format
def test_a_frame_is_its_size_its_count_then_each_part_with_its_length_and_reads_back_whole():
    a, b = socket.socketpair()
    with a, b:
        parts = [b"set", b"", b"k\x00v"]
        SS._send_frame(a, parts)
        body = b"".join(struct.pack("<I", len(p)) + p for p in parts)
        assert len(body) == 4 + 3 + 4 + 4 + 3
        assert SS._recv_exact(b, 8 + len(body)) == struct.pack("<II", len(body), 3) + body
        SS._send_frame(a, parts)
        SS._send_frame(a, [])
        assert SS._recv_frame(b) == parts
        assert SS._recv_frame(b) == []


def test_a_frame_over_the_limit_is_refused_before_its_body_is_read(monkeypatch):
    monkeypatch.setattr(SS, "_MAX_FRAME", 12)
    a, b = socket.socketpair()
    with a, b:
        SS._send_frame(a, [b"12345678"])  # 4 + 8 = 12 bytes: at the limit, read
        assert SS._recv_frame(b) == [b"12345678"]
        SS._send_frame(a, [b"123456789"])  # 13
        with pytest.raises(ConnectionError, match="weight-sync store frame of 13 bytes \\(at most 12\\)"):
            SS._recv_frame(b)


def test_reads_gather_bytes_that_trickle_in_and_a_closed_peer_raises():
    a, b = socket.socketpair()
    with a, b:
        def trickle() -> None:
            for i in range(5):
                a.sendall(bytes([i]))
                time.sleep(0.01)

        threading.Thread(target=trickle, daemon=True).start()
        deadline = time.monotonic() + 2
        assert _bounded(lambda: SS._recv_exact(b, 5, deadline)) == bytes(range(5))
        assert SS._recv_exact(b, 0) == b""
        a.sendall(b"abc")  # a short read, then the rest together with the next message
        threading.Timer(0.05, lambda: a.sendall(b"deNEXT")).start()
        assert _bounded(lambda: SS._recv_exact(b, 5)) == b"abcde"  # nothing of the next message
        assert SS._recv_exact(b, 4) == b"NEXT"
        a.sendall(b"xy")
        a.close()
        with pytest.raises(ConnectionError, match="weight-sync store connection closed"):
            _bounded(lambda: SS._recv_exact(b, 3))


def test_a_read_under_a_deadline_ends_there_whatever_the_peer_sends():
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(TimeoutError, match="no answer in time"):  # past already: nothing read
            SS._recv_exact(b, 1, time.monotonic() - 0.001)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):  # a silent peer
            _bounded(lambda: SS._recv_exact(b, 4, time.monotonic() + 0.1))
        assert time.monotonic() - t0 < 1.0

        stop = threading.Event()

        def trickle() -> None:  # a byte every 20 ms: each within any per-read timeout, never done
            while not stop.is_set():
                try:
                    a.sendall(b"x")
                except OSError:
                    return
                time.sleep(0.02)

        threading.Thread(target=trickle, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            _bounded(lambda: SS._recv_exact(b, 1000, time.monotonic() + 0.15))
        stop.set()
        assert time.monotonic() - t0 < 1.0


def test_the_mac_is_hmac_sha256_of_the_label_and_parts():
    key = bytes(range(32))
    want = hmac.new(key, b"label" + b"ab" + b"cd", hashlib.sha256).digest()
    assert SS._mac(key, b"label", b"ab", b"cd") == want
    assert SS._mac(key, b"other", b"ab", b"cd") != want


# ---------------------------------------------------------------------------------------------- the challenge
def test_a_member_proves_the_secret_and_checks_the_stores_proof_over_fresh_nonces():
    server, port, key = _server(world=2)
    s, nonce_s = _hello(port)
    s2, nonce_s2 = _hello(port)
    assert len(nonce_s) == SS._NONCE and nonce_s != nonce_s2  # fresh per connection
    with s, s2:
        nonce_c = bytes(range(SS._NONCE))
        s.sendall(nonce_c + SS._mac(key, b"digen-store-client", nonce_s, nonce_c))
        assert SS._recv_exact(s, 32) == SS._mac(key, b"digen-store-server", nonce_c, nonce_s)
        SS._send_frame(s, [b"set", b"k", b"v"])
        assert SS._recv_frame(s) == [b"ok"]
        SS._send_frame(s, [b"get", b"k"])
        assert SS._recv_frame(s) == [b"ok", b"v"]
        assert wait_for(lambda: server.members == 1) and server.refused == [] and server.listening


def test_each_operations_reply_on_the_wire():
    """What the server answers, word for word (the member's client reads these)."""
    server, port, key = _server(world=1)
    s, nonce_s = _hello(port)
    with s:
        nonce_c = bytes(SS._NONCE)
        s.sendall(nonce_c + SS._mac(key, b"digen-store-client", nonce_s, nonce_c))
        SS._recv_exact(s, 32)

        def ask(*parts: bytes) -> list[bytes]:
            SS._send_frame(s, list(parts))
            return _bounded(lambda: SS._recv_frame(s))

        assert ask(b"set", b"k", b"v") == [b"ok"]
        assert ask(b"wait", b"k", b"100") == [b"ok"]
        assert ask(b"wait", b"k", b"nope", b"10") == [b"timeout", b"nope"]
        assert ask(b"get", b"k") == [b"ok", b"v"] and ask(b"get", b"nope") == [b"missing"]
        assert ask(b"add", b"n", b"2") == [b"ok", b"2"]
        assert ask(b"compare_set", b"c", b"", b"x") == [b"ok", b"x"]
        assert ask(b"compare_set", b"c", b"y", b"z") == [b"ok", b"x"]
        assert ask(b"compare_set", b"d", b"y", b"z") == [b"ok", b"y"]
        assert ask(b"check", b"k", b"c") == [b"ok", b"1"] and ask(b"check", b"k", b"d") == [b"ok", b"0"]
        assert ask(b"delete", b"k") == [b"ok", b"1"] and ask(b"delete", b"k") == [b"ok", b"0"]
        assert ask(b"num_keys") == [b"ok", b"2"]
        assert ask(b"zap", b"k") == [b"error", b"unknown operation zap"]


def test_a_stranger_with_a_wrong_proof_is_told_refused_and_dropped_before_any_request():
    server, port, key = _server(world=2)
    first = _member(port, key)
    first.set("run/key", b"secret value")
    s, nonce_s = _hello(port)
    with s:
        s.sendall(bytes(SS._NONCE) + bytes(range(32)))
        SS._send_frame(s, [b"get", b"run/key"])  # a request it hopes is served
        assert SS._recv_exact(s, 32) == SS._REFUSED and closed(s, timeout=2)
        where = f"127.0.0.1:{s.getsockname()[1]}"
    assert wait_for(lambda: server.refused == [f"{where} (does not hold the run's secret)"]), server.refused
    assert server.members == 1 and server.listening
    assert first.get("run/key") == b"secret value" and first.num_keys() == 1
    first.close()


def test_a_silent_stranger_and_one_that_trickles_its_answer_are_dropped_at_the_handshake_deadline(monkeypatch):
    monkeypatch.setattr(SS, "HANDSHAKE_S", 0.2)
    server, port, key = _server(world=2)
    silent, _ = _hello(port)
    trickler, _ = _hello(port)
    stop = threading.Event()

    def trickle() -> None:  # a byte every 30 ms: each well within the deadline, the answer never done in it
        for _ in range(SS._NONCE + 31):
            if stop.is_set():
                return
            try:
                trickler.sendall(b"x")
            except OSError:
                return
            time.sleep(0.03)

    t0 = time.monotonic()
    threading.Thread(target=trickle, daemon=True).start()
    assert closed(silent, timeout=2) and closed(trickler, timeout=2)
    stop.set()
    assert time.monotonic() - t0 < 1.5
    assert wait_for(lambda: len(server.refused) == 2)
    assert sorted(server.refused) == sorted(f"127.0.0.1:{c.getsockname()[1]} (no answer to the challenge: "
                                            "TimeoutError)" for c in (silent, trickler)), server.refused
    assert server.members == 0
    member = _member(port, key)  # the slots they held are free again
    assert wait_for(lambda: server.members == 1)
    silent.close(), trickler.close(), member.close()


def test_past_the_pending_limit_a_connection_is_closed_at_once_and_a_slot_frees_after_each_handshake(
        monkeypatch):
    monkeypatch.setattr(SS, "MAX_PENDING", 1)
    monkeypatch.setattr(SS, "HANDSHAKE_S", 2.0)
    server, port, key = _server(world=3)
    first = _member(port, key)  # its slot is released once it proved the secret
    second = _member(port, key)
    assert wait_for(lambda: server.members == 2)
    silent, _ = _hello(port)  # holds the one slot
    late = socket.create_connection(("127.0.0.1", port), timeout=2)
    with silent, late:
        t0 = time.monotonic()
        assert closed(late, timeout=2) and time.monotonic() - t0 < 1.0  # at once, not at the handshake deadline
        where = f"127.0.0.1:{late.getsockname()[1]}"
        assert wait_for(lambda: f"{where} (too many pending connections)" in server.refused), server.refused
    first.close(), second.close()


def test_a_member_dropped_by_a_flood_tries_again_until_a_slot_frees(monkeypatch):
    """Past the pending limit a connection is closed before its greeting: the member tries again (until its
    timeout) instead of giving up, and gets in once the stranger holding the slot is dropped."""
    monkeypatch.setattr(SS, "MAX_PENDING", 1)
    monkeypatch.setattr(SS, "HANDSHAKE_S", 0.3)
    server, port, key = _server(world=2)
    silent, _ = _hello(port)  # holds the one slot for 0.3 s
    with silent:
        member = _member(port, key, timeout_s=3.0)
        assert wait_for(lambda: server.members == 1)
        assert any("too many pending connections" in r for r in server.refused), server.refused
        member.close()


def test_the_store_stops_listening_once_every_member_joined():
    server, port, key = _server(world=2)
    first = _member(port, key)
    assert wait_for(lambda: server.members == 1) and server.listening
    second = _member(port, key)
    assert wait_for(lambda: server.members == 2)
    assert wait_for(lambda: not server.listening, 1.0)

    def refused() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        return False

    assert wait_for(refused, 1.0), "the store still takes connections after every member joined"
    first.set("a", b"1")  # the members keep their connections
    assert second.get("a") == b"1"
    first.close(), second.close()


def test_a_member_refuses_a_store_of_another_run_an_impostor_and_a_port_that_is_no_store():
    other, port, _ = _server(world=2)
    run_key = bytes.fromhex(new_secret())
    with pytest.raises(StoreRefused, match=f"the weight-sync store at 127.0.0.1:{port} refused this member: its "
                                           "secret is not the store's"):
        _member(port, run_key)
    assert other.members == 0

    def fake(greeting: bytes, proof: bytes | None) -> int:
        listener = bind_listener("127.0.0.1", 0)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(greeting)
                if proof is not None:
                    SS._recv_exact(conn, SS._NONCE + 32)
                    conn.sendall(proof)
                conn.settimeout(2)
                try:
                    conn.recv(64)
                except OSError:
                    pass
            listener.close()

        threading.Thread(target=serve, daemon=True).start()
        return listener.getsockname()[1]

    port2 = fake(b"DIGENSTORE1" + bytes(SS._NONCE), bytes(range(32)))  # speaks the protocol, cannot prove
    with pytest.raises(StoreRefused, match=f"the weight-sync store at 127.0.0.1:{port2} does not hold this run's "
                                           "secret"):
        _member(port2, run_key)
    port3 = fake(b"SSH-2.0-OpenSSH_9.6" + bytes(SS._NONCE + 11 - 19), None)
    with pytest.raises(StoreRefused, match=f"127.0.0.1:{port3} is not a weight-sync store of verl-digen"):
        _member(port3, run_key)


def test_a_member_waits_for_a_store_that_starts_after_it_and_names_one_that_never_does():
    port, key = _port(), bytes.fromhex(new_secret())
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("m", SyncStore("127.0.0.1", port, key, 3.0)), daemon=True)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.15)
    server = StoreServer(bind_listener("127.0.0.1", port), key, 1)
    t.join(3)
    assert "m" in box and wait_for(lambda: server.members == 1)
    assert time.monotonic() - t0 < 0.8  # it kept trying, every 50 ms
    box["m"].close()

    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=f"the weight-sync store at 127.0.0.1:{port} did not take "
                                           "this member within 0 s \\(trainer rank 0 not up, or the port "
                                           "unreachable: .*Connection refused"):
        _bounded(lambda: SyncStore("127.0.0.1", port, key, 0.3))
    assert 0.25 <= time.monotonic() - t0 < 2.0


def test_a_member_gives_up_on_a_port_that_accepts_and_says_nothing(monkeypatch):
    """Each try waits for the greeting at most the handshake time; then the member tries again, and at its
    timeout names the store."""
    monkeypatch.setattr(SS, "HANDSHAKE_S", 0.1)
    listener = bind_listener("127.0.0.1", 0)  # the kernel accepts; nobody greets
    port = listener.getsockname()[1]
    with listener:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=f"store at 127.0.0.1:{port} did not take this member"):
            _bounded(lambda: SyncStore("127.0.0.1", port, bytes(32), 0.4))
        assert time.monotonic() - t0 < 2.0


# ------------------------------------------------------------------------------------------ the key semantics
@pytest.fixture
def members():
    server, port, key = _server(world=2)
    a, b = _member(port, key, 0.3), _member(port, key, 0.3)
    yield a, b
    a.close(), b.close()


def test_set_get_check_num_keys_and_delete(members):
    a, b = members
    a.set("text", "value")
    a.set("raw", b"\x00\xff")
    a.set("view", bytearray(b"ba"))
    assert b.get("text") == b"value" and b.get("raw") == b"\x00\xff" and b.get("view") == b"ba"
    assert b.check(["text", "raw"]) is True and b.check(["text", "nope"]) is False and b.check([]) is True
    assert a.num_keys() == 3
    assert a.delete_key("text") is True and b.delete_key("text") is False
    assert b.num_keys() == 2 and b.check(["text"]) is False
    b.set("raw", b"again")  # overwritten
    assert a.get("raw") == b"again" and a.num_keys() == 2


def test_add_counts_from_zero_and_compare_set_swaps_only_on_a_match(members):
    a, b = members
    assert a.add("n", 3) == 3 and b.add("n", -5) == -2 and a.get("n") == b"-2"
    assert a.compare_set("c", "", "first") == b"first"  # missing, expected empty: set
    assert b.get("c") == b"first"
    assert a.compare_set("c", "wrong", "x") == b"first" and b.get("c") == b"first"  # no match: the current
    assert a.compare_set("c", b"first", b"second") == b"second" and b.get("c") == b"second"
    assert a.compare_set("d", "nope", "x") == b"nope" and not a.check(["d"])  # missing: the expected, unset


@pytest.mark.parametrize("how", ["set", "add", "compare_set"])
def test_a_wait_ends_as_soon_as_another_member_writes_the_key(how):
    server, port, key = _server(world=2)
    a, b = _member(port, key, 5.0), _member(port, key, 5.0)

    def write() -> None:
        time.sleep(0.05)
        {"set": lambda: a.set("late", b"v"), "add": lambda: a.add("late", 1),
         "compare_set": lambda: a.compare_set("late", "", "v")}[how]()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    t0 = time.monotonic()
    _bounded(lambda: b.wait(["late"], timedelta(seconds=5)), 2.0)
    assert time.monotonic() - t0 < 1.0
    writer.join(2)
    a.close(), b.close()


def test_a_wait_that_times_out_names_the_keys_still_missing(members):
    a, b = members
    a.set("here", b"1")
    with pytest.raises(TimeoutError, match="weight-sync store: key\\(s\\) gone, later not set within 0 s \\(a "
                                           "member of the group did not join or died\\)"):
        _bounded(lambda: b.wait(["gone", "here", "later"], timedelta(seconds=0.05)))
    b.wait(["here"], timedelta(seconds=0.05))


def test_a_wait_given_a_timeout_longer_than_the_members_own_waits_that_long(members):
    a, b = members  # their own timeout: 0.3 s
    writer = threading.Timer(0.5, lambda: a.set("slow", b"1"))
    writer.start()
    t0 = time.monotonic()
    _bounded(lambda: b.wait(["slow"], timedelta(seconds=3)))
    assert 0.4 <= time.monotonic() - t0 < 2.5
    writer.join(2)


@pytest.mark.parametrize("call", ["get", "wait_default", "wait_zero"])
def test_get_and_a_wait_without_a_timeout_wait_for_the_stores_own(members, call):
    """The member's ``timeout_s`` (0.3 s here): a ``timedelta(0)`` means it too, as torch's stores read it."""
    _, b = members
    fn = {"get": lambda: b.get("never"), "wait_default": lambda: b.wait(["never"]),
          "wait_zero": lambda: b.wait(["never"], timedelta(0))}[call]
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="key\\(s\\) never not set"):
        _bounded(fn)
    assert 0.25 <= time.monotonic() - t0 < 2.0


def test_an_unknown_operation_and_a_key_deleted_while_waited_for_raise(members, monkeypatch):
    a, _ = members
    with pytest.raises(RuntimeError, match="^weight-sync store: unknown operation nope$"):
        a._call(b"nope", b"k")
    monkeypatch.setattr(a, "_wait", lambda keys, timeout: None)  # as if the key went between wait and get
    with pytest.raises(KeyError, match="key gone was deleted while waited for"):
        a.get("gone")


def test_a_member_that_sends_a_malformed_frame_is_dropped_and_the_others_are_still_served():
    server, port, key = _server(world=3)
    good = _member(port, key)
    s, nonce_s = _hello(port)
    with s:
        nonce_c = bytes(SS._NONCE)
        s.sendall(nonce_c + SS._mac(key, b"digen-store-client", nonce_s, nonce_c))
        SS._recv_exact(s, 32)
        s.sendall(struct.pack("<II", 4, 2) + struct.pack("<I", 0))  # two parts announced, one sent
        assert closed(s, timeout=2)
    s, nonce_s = _hello(port)
    with s:
        nonce_c = bytes(SS._NONCE)
        s.sendall(nonce_c + SS._mac(key, b"digen-store-client", nonce_s, nonce_c))
        SS._recv_exact(s, 32)
        SS._send_frame(s, [])  # no operation at all
        assert closed(s, timeout=2)
    good.set("k", b"v")
    assert good.get("k") == b"v" and wait_for(lambda: server.members == 3)
    good.close()
