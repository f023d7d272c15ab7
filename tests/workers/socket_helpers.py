"""Polling and socket checks shared by the rendezvous store's tests (no Ray, no torch)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def wait_for(cond: Callable[[], bool], seconds: float = 2.0, poll: float = 0.005) -> bool:
    """``cond()`` became true within ``seconds`` (checked once more at the deadline)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(poll)
    return cond()


def closed(sock: socket.socket, timeout: float | None = None) -> bool:
    """The other end closed (or reset) the connection, sending nothing more (within ``timeout``, if given)."""
    if timeout is not None:
        sock.settimeout(timeout)
    try:
        return sock.recv(64) == b""
    except ConnectionResetError:
        return True
