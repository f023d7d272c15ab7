"""The weight-sync group's rendezvous store: a key-value store that serves only the run's members.

torch's ``TCPStore`` serves anyone who reaches its port: a stranger can list the keys (``list_keys``), read
them, overwrite or delete them, and a member then waits on a key that never comes (a stalled setup or, with
NCCL's lazily made communicators, a stalled pickup). This store is what the group's process group rendezvous
through instead (a ``torch.distributed.Store``, so gloo and NCCL use it as they would a ``TCPStore``):

- the server runs in group rank 0 (trainer rank 0) and listens on the pool's address only;
- every connection starts with a mutual challenge-response over fresh nonces (HMAC-SHA256 keyed with the
  run's secret, which the driver hands only to the members, through their Ray actors): a client that does
  not answer within ``HANDSHAKE_S`` or answers wrong is dropped before any request is read, and counted in
  ``refused``; a client also checks the server's answer, so a member never talks to a stranger's store;
- once all ``world`` members have connected, the server stops listening: nothing can connect while the run
  syncs, and the members keep their connections for the whole run.

Not covered: the bytes on an authenticated connection are neither encrypted nor signed message by message, so
someone who can read or alter the pool's network traffic is out of scope (as for the transfers themselves,
whose handshake the secret authenticates); a flood of connections before every member joined can delay the
setup (each stranger holds a slot for at most ``HANDSHAKE_S``; past ``MAX_PENDING`` pending connections new
ones are closed at once, and a member retries until its timeout, which names the store).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import threading
import time
from datetime import timedelta

import torch.distributed as dist

#: seconds a new connection has to prove it holds the run's secret
HANDSHAKE_S = 5.0
#: connections still in their handshake at once; more are closed at once
MAX_PENDING = 32
_NONCE = 32
_REFUSED = bytes(32)  # the server's answer to a wrong proof (an HMAC is never all zeros in practice)
_MAX_FRAME = 64 << 20  # a rendezvous value is a few hundred bytes (an address, an NCCL id)


class StoreRefused(RuntimeError):
    """A connection to the weight-sync store refused: the other end does not hold the run's secret."""


def _mac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, label + b"".join(parts), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes; with ``deadline`` (``time.monotonic()``) all of them by then, however they trickle in."""
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer in time")
            sock.settimeout(left)
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the weight-sync store connection closed")
        out += chunk
    return bytes(out)


def _send_frame(sock: socket.socket, parts: list[bytes]) -> None:
    body = b"".join(struct.pack("<I", len(p)) + p for p in parts)
    sock.sendall(struct.pack("<II", len(body), len(parts)) + body)


def _recv_frame(sock: socket.socket) -> list[bytes]:
    size, count = struct.unpack("<II", _recv_exact(sock, 8))
    if size > _MAX_FRAME:
        raise ConnectionError(f"weight-sync store frame of {size} bytes (at most {_MAX_FRAME})")
    body, parts, at = _recv_exact(sock, size), [], 0
    for _ in range(count):
        (n,) = struct.unpack_from("<I", body, at)
        parts.append(body[at + 4:at + 4 + n])
        at += 4 + n
    return parts


class StoreServer:
    """The store's server (group rank 0): a thread per member connection, the keys in one dict."""

    def __init__(self, listener: socket.socket, key: bytes, world: int) -> None:
        self._listener, self._key, self.world = listener, key, world
        self._data: dict[str, bytes] = {}
        self._cv = threading.Condition()
        self.members = 0  # authenticated connections so far
        self.refused: list[str] = []  # why each refused connection was dropped (its address and cause)
        self._pending = threading.BoundedSemaphore(MAX_PENDING)
        self.listening = True
        self._listener.settimeout(0.2)  # the accept loop looks at ``listening`` this often
        threading.Thread(target=self._accept, daemon=True, name="digen-sync-store").start()

    def _accept(self) -> None:
        with self._listener:
            while self.listening:
                try:
                    conn, addr = self._listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return  # the group is gone
                if not self.listening:  # every member joined meanwhile
                    conn.close()
                    return
                self._admit(conn, addr)

    def _stop_listening(self) -> None:
        """Refuse every connection from now on (on Linux ``shutdown`` ends the listening at once; elsewhere the
        accept loop closes the listener within its 0.2 s poll)."""
        self.listening = False
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _admit(self, conn: socket.socket, addr: tuple) -> None:
        conn.setblocking(True)
        if not self._pending.acquire(blocking=False):
            conn.close()
            self.refused.append(f"{addr[0]}:{addr[1]} (too many pending connections)")
            return
        threading.Thread(target=self._serve, args=(conn, addr), daemon=True).start()

    def _authenticate(self, conn: socket.socket, addr: tuple) -> bool:
        try:
            deadline = time.monotonic() + HANDSHAKE_S  # in all: a stranger trickling bytes is dropped too
            conn.settimeout(HANDSHAKE_S)
            nonce_s = secrets.token_bytes(_NONCE)
            conn.sendall(b"DIGENSTORE1" + nonce_s)
            answer = _recv_exact(conn, _NONCE + 32, deadline)
            nonce_c, mac_c = answer[:_NONCE], answer[_NONCE:]
            if not hmac.compare_digest(mac_c, _mac(self._key, b"digen-store-client", nonce_s, nonce_c)):
                self.refused.append(f"{addr[0]}:{addr[1]} (does not hold the run's secret)")
                conn.sendall(_REFUSED)  # a member of another run learns why at once, and nothing else
                return False
            conn.sendall(_mac(self._key, b"digen-store-server", nonce_c, nonce_s))
            conn.settimeout(None)
            return True
        except (OSError, ConnectionError) as err:
            self.refused.append(f"{addr[0]}:{addr[1]} (no answer to the challenge: {type(err).__name__})")
            return False
        finally:
            self._pending.release()

    def _serve(self, conn: socket.socket, addr: tuple) -> None:
        with conn:
            if not self._authenticate(conn, addr):
                return
            with self._cv:
                self.members += 1
                if self.members >= self.world:  # everyone is in: nobody else may connect
                    self._stop_listening()
            try:
                while True:
                    _send_frame(conn, self._handle(_recv_frame(conn)))
            except (OSError, ConnectionError, struct.error, IndexError, ValueError):
                return  # the member left (or sent a frame no member sends)

    def _handle(self, req: list[bytes]) -> list[bytes]:
        op, args = req[0], req[1:]
        key = args[0].decode() if args else ""
        with self._cv:
            if op == b"set":
                self._data[key] = args[1]
                self._cv.notify_all()
                return [b"ok"]
            if op == b"wait":  # keys..., timeout in ms (last argument)
                timeout_ms = int(args[-1])
                names = [a.decode() for a in args[:-1]]
                ok = self._cv.wait_for(lambda: all(k in self._data for k in names), timeout_ms / 1000)
                return [b"ok"] if ok else [b"timeout", *(k.encode() for k in names if k not in self._data)]
            if op == b"get":
                return [b"ok", self._data[key]] if key in self._data else [b"missing"]
            if op == b"add":
                value = int(self._data.get(key, b"0")) + int(args[1])
                self._data[key] = str(value).encode()
                self._cv.notify_all()
                return [b"ok", str(value).encode()]
            if op == b"compare_set":
                current = self._data.get(key)
                if (current is None and args[1] == b"") or current == args[1]:
                    self._data[key] = args[2]
                    self._cv.notify_all()
                    return [b"ok", args[2]]
                return [b"ok", args[1] if current is None else current]
            if op == b"check":
                return [b"ok", b"1" if all(a.decode() in self._data for a in args) else b"0"]
            if op == b"delete":
                return [b"ok", b"1" if self._data.pop(key, None) is not None else b"0"]
            if op == b"num_keys":
                return [b"ok", str(len(self._data)).encode()]
        return [b"error", b"unknown operation " + op[:32]]


class SyncStore(dist.Store):
    """A member's client of the weight-sync store (a ``torch.distributed.Store`` for gloo and NCCL).

    ``connect`` retries until ``timeout_s`` (rank 0's server may start after this member), then proves the
    secret and checks the server's proof; a server that fails it raises :class:`StoreRefused`. A ``get`` or
    ``wait`` whose keys do not come within the timeout names them and the likely cause."""

    def __init__(self, host: str, port: int, key: bytes, timeout_s: float) -> None:
        super().__init__()
        self.host, self.port, self._key, self._timeout_s = host, port, key, timeout_s
        self._lock = threading.Lock()
        self._sock = self._connect()

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self._timeout_s
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=HANDSHAKE_S)
            except OSError as err:
                last = err
                time.sleep(0.05)
                continue
            try:
                hello = _recv_exact(sock, 11 + _NONCE)
                if hello[:11] != b"DIGENSTORE1":
                    raise StoreRefused(f"{self.host}:{self.port} is not a weight-sync store of verl-digen")
                nonce_s, nonce_c = hello[11:], secrets.token_bytes(_NONCE)
                sock.sendall(nonce_c + _mac(self._key, b"digen-store-client", nonce_s, nonce_c))
                proof = _recv_exact(sock, 32)
                if proof == _REFUSED:
                    raise StoreRefused(f"the weight-sync store at {self.host}:{self.port} refused this member: "
                                       "its secret is not the store's (another run's store on this port?)")
                if not hmac.compare_digest(proof, _mac(self._key, b"digen-store-server", nonce_c, nonce_s)):
                    raise StoreRefused(f"the weight-sync store at {self.host}:{self.port} does not hold this "
                                       "run's secret (a stranger's store on this port?)")
            except StoreRefused:
                sock.close()
                raise
            except (OSError, ConnectionError) as err:  # dropped: another run's store, or a flood; try again
                sock.close()
                last = err
                time.sleep(0.05)
                continue
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        raise TimeoutError(f"the weight-sync store at {self.host}:{self.port} did not take this member within "
                           f"{self._timeout_s:.0f} s (trainer rank 0 not up, or the port unreachable: {last})")

    def _call(self, *parts: bytes) -> list[bytes]:
        with self._lock:
            _send_frame(self._sock, list(parts))
            reply = _recv_frame(self._sock)
        if reply[0] == b"error":
            raise RuntimeError(f"weight-sync store: {reply[1].decode()}")
        return reply

    def _wait(self, keys: list[str], timeout: timedelta | None) -> None:
        seconds = self._timeout_s if timeout is None or timeout == timedelta(0) else timeout.total_seconds()
        reply = self._call(b"wait", *(k.encode() for k in keys), str(int(seconds * 1000)).encode())
        if reply[0] == b"timeout":
            missing = ", ".join(k.decode() for k in reply[1:])
            raise TimeoutError(f"weight-sync store: key(s) {missing} not set within {seconds:.0f} s (a member of "
                               "the group did not join or died)")

    # -- the torch.distributed.Store interface --------------------------------------------------------------
    def set(self, key: str, value: bytes | str) -> None:  # noqa: A003 - the Store interface
        self._call(b"set", key.encode(), value.encode() if isinstance(value, str) else bytes(value))

    def get(self, key: str) -> bytes:
        self._wait([key], None)
        reply = self._call(b"get", key.encode())
        if reply[0] != b"ok":
            raise KeyError(f"weight-sync store: key {key} was deleted while waited for")
        return reply[1]

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._wait(list(keys), timeout)

    def add(self, key: str, amount: int) -> int:
        return int(self._call(b"add", key.encode(), str(int(amount)).encode())[1])

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        def b(v: bytes | str) -> bytes:
            return v.encode() if isinstance(v, str) else bytes(v)

        return self._call(b"compare_set", key.encode(), b(expected), b(desired))[1]

    def check(self, keys: list[str]) -> bool:
        return self._call(b"check", *(k.encode() for k in keys))[1] == b"1"

    def delete_key(self, key: str) -> bool:
        return self._call(b"delete", key.encode())[1] == b"1"

    def num_keys(self) -> int:
        return int(self._call(b"num_keys")[1])

    def close(self) -> None:
        """Close this member's connection (the group's end)."""
        self._sock.close()
