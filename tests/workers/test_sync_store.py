"""The weight-sync rendezvous store serves the run's members only (workers/sync_store.py, docs/cluster.md
"What the weight-sync channel protects"): a stranger who connects is dropped before any request is read (a
silent one after the handshake deadline, a wrong proof at once, torch's own ``TCPStore`` client included), a
member refuses a store without the run's secret, the store stops listening once every member joined, and a
stranger who connects while the run syncs neither stalls nor changes the pickup."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from socket_helpers import closed, wait_for

from verl_digen.workers import sync_store as SS
from verl_digen.workers.sync import SyncGroup, bind_listener, new_secret
from verl_digen.workers.sync_store import StoreRefused, StoreServer, SyncStore


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _refused_connect(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_stranger_reads_no_key_and_the_store_closes_once_every_member_joined(monkeypatch):
    monkeypatch.setattr(SS, "HANDSHAKE_S", 0.3)
    port, key = _port(), bytes.fromhex(new_secret())
    server = StoreServer(bind_listener("127.0.0.1", port), key, world=2)
    first = SyncStore("127.0.0.1", port, key, timeout_s=10)
    first.set("run/key", b"the run's value")

    silent = socket.create_connection(("127.0.0.1", port))  # connects, never answers the challenge
    trickled = []

    def trickle() -> None:  # answers a byte at a time, each within the deadline, to hold its slot for ever
        sent = 0
        with socket.create_connection(("127.0.0.1", port)) as t:
            while sent < SS._NONCE + 32 - 1:
                try:
                    t.sendall(b"x")
                except OSError:
                    break
                sent += 1
                time.sleep(0.1)
        trickled.append(sent)

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    wrong = socket.create_connection(("127.0.0.1", port))  # answers with a proof it cannot make
    hello = SS._recv_exact(wrong, 11 + SS._NONCE)
    assert hello.startswith(b"DIGENSTORE1")
    wrong.sendall(bytes(SS._NONCE) + bytes(range(32)))
    wrong.sendall(SS.struct.pack("<II", 0, 1))  # a request it hopes is served
    assert SS._recv_exact(wrong, 32) == SS._REFUSED and closed(wrong)  # refused, then closed
    with pytest.raises((RuntimeError, TimeoutError)):  # torch's TCPStore client (it has list_keys)
        dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=0.5)).list_keys()
    assert wait_for(lambda: any("no answer to the challenge" in r for r in server.refused), 10)
    assert silent.recv(64)[:11] == b"DIGENSTORE1" and closed(silent)  # dropped after the deadline
    assert any("does not hold the run's secret" in r for r in server.refused)
    trickler.join(10)
    assert trickled and trickled[0] < 20, f"a stranger trickling its answer held its slot for {trickled} bytes"
    assert server.members == 1 and server.listening

    second = SyncStore("127.0.0.1", port, key, timeout_s=10)  # the last member: the store stops listening
    assert second.get("run/key") == b"the run's value"  # nobody wrote or removed it
    assert second.num_keys() == 1
    assert wait_for(lambda: _refused_connect(port), 10), "the store still takes connections after every member joined"
    assert not server.listening
    for s in (silent, wrong, first, second):
        s.close()


def test_a_member_refuses_a_store_without_the_run_secret():
    """Both ways: another run's store refuses this member (its proof), and a stranger's store listening on the
    port cannot prove the run's secret; the member fails at once, naming the store, instead of waiting."""
    port, run_key = _port(), bytes.fromhex(new_secret())
    other = StoreServer(bind_listener("127.0.0.1", port), bytes.fromhex(new_secret()), world=2)
    with pytest.raises(StoreRefused, match=f"store at 127.0.0.1:{port} refused this member"):
        SyncStore("127.0.0.1", port, run_key, timeout_s=10)
    assert other.members == 0

    port2 = _port()
    fake = bind_listener("127.0.0.1", port2)

    def impostor() -> None:  # speaks the protocol, but its proof is made without the secret
        conn, _ = fake.accept()
        with conn:
            conn.sendall(b"DIGENSTORE1" + bytes(SS._NONCE))
            SS._recv_exact(conn, SS._NONCE + 32)
            conn.sendall(bytes(range(32)))
            conn.recv(64)

    t = threading.Thread(target=impostor, daemon=True)
    t.start()
    with pytest.raises(StoreRefused, match="does not hold this run's secret"):
        SyncStore("127.0.0.1", port2, run_key, timeout_s=10)
    t.join(10)
    fake.close()


def test_a_stranger_while_the_run_syncs_neither_stalls_nor_changes_the_pickup(monkeypatch):
    """A stranger holds a connection open from before the group formed, and keeps trying to connect while two
    pickups run: both pickups complete, bit-identical, long before the stranger's handshake deadline; every
    connection it tries once the members are in is refused."""
    monkeypatch.setattr(SS, "HANDSHAKE_S", 60.0)
    torch.set_num_threads(1)
    port, secret = _port(), new_secret()
    g = torch.Generator().manual_seed(0)
    versions = {v: {"w": torch.randn(64, 33, generator=g, dtype=torch.float64),
                    "b": torch.randn(7, generator=g, dtype=torch.float64)} for v in (1, 2)}
    got: dict = {}

    def generator() -> None:
        try:
            group = SyncGroup("127.0.0.1", port, 2, 1, timeout_s=30, secret=secret)
            got.update({v: group.recv(v, versions[v]) for v in versions})
        except BaseException as err:  # noqa: BLE001 - inspected below
            got["error"] = err

    source_box: dict = {}

    def source() -> None:
        source_box["g"] = SyncGroup("127.0.0.1", port, 2, 0, timeout_s=30, secret=secret)

    trainer = threading.Thread(target=source)
    trainer.start()
    silent = _connect_when_up(port)  # holds a handshake slot for up to 60 s
    attempts = {"refused": 0, "connected": 0}
    syncing = threading.Event()

    def hammer() -> None:
        while not syncing.is_set():
            time.sleep(0.005)
        while syncing.is_set():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                attempts["connected"] += 1
            except OSError:
                attempts["refused"] += 1

    stranger = threading.Thread(target=hammer, daemon=True)
    stranger.start()
    peer = threading.Thread(target=generator)
    peer.start()
    trainer.join(30)
    group = source_box["g"]
    t0 = time.monotonic()
    syncing.set()
    for v in versions:
        group.send(1, v, versions[v])
    peer.join(30)
    syncing.clear()
    stranger.join(10)
    took = time.monotonic() - t0
    assert "error" not in got, got.get("error")
    for v, state in versions.items():
        for k, t in state.items():
            assert got[v][k].dtype == torch.float64 and torch.equal(got[v][k], t), (v, k)
    assert took < 30, f"the pickups took {took:.1f} s with a stranger on the store"
    assert group.store_server.members == 2 and not group.store_server.listening
    assert attempts["connected"] == 0 and attempts["refused"] >= 1, attempts
    assert not group.store_server.refused  # the silent stranger was still pending: the run did not wait on it
    silent.close()


def _connect_when_up(port: int) -> socket.socket:
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
