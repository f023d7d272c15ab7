"""The Ray cluster a run uses: one it was told to join (``RAY_ADDRESS``), or a head of its own.

A run never joins a cluster it found by chance (another user's ``ray start`` on the same machine). Its own
head is ``ray start --head --block`` in a session of its own, so a signal to the run's process group
(``timeout``, ``kill -- -PGID``, a pod stop of the driver's group) reaches the driver and not Ray's GCS:
the driver finishes or abandons its step with a checkpoint and a resume line, then stops the head. On a normal
stop every process of the head's session is killed before the driver exits; when the driver dies without
a stop (SIGKILL, the OOM killer), a watchdog leading that session (``watch``) kills it, Ray's dashboard
and runtime-env agents included, so none outlives the run (docs/cluster.md, "How a run stops").
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: how long the head may take to say it started (Ray's own start on a loaded machine: 5-15 s)
HEAD_START_TIMEOUT_S = 120.0
#: the line ``ray start`` prints once the head's processes run
_STARTED = "Ray runtime started"
#: what ``ray start`` says when its raylet did not register within Ray's fixed 30 s (a loaded machine), and
#: how many heads a run starts before it gives up
_SLOW_START = "timed out during startup"
HEAD_START_ATTEMPTS = 3
#: how often the watchdog looks for its driver
WATCH_S = 0.5


def own_head_auth() -> None:
    """Token authentication for the run's own head, with a secret of the run's own, unless the user chose a
    mode (``RAY_AUTH_MODE``): the head, its workers and the driver read it from the environment they inherit
    (``RAY_AUTH_TOKEN``), so nobody else reaches the head's ports. A cluster the run joins keeps whatever
    its owner set up: the run changes nothing there."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    from ray._raylet import AuthenticationTokenLoader, Config

    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    Config.initialize("")  # this process cached Ray's settings when it imported Ray: read them again
    AuthenticationTokenLoader.instance().reset_cache()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_processes(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``, from /proc (empty where there is no /proc)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after "(comm)": state ppid pgrp session ...
        if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


class OwnHead:
    """A Ray head started for this run alone; ``stop`` ends every process of its session."""

    def __init__(self, proc: subprocess.Popen, address: str, log_path: str, temp_dir: str) -> None:
        self.proc, self.address, self.log_path, self.temp_dir = proc, address, log_path, temp_dir

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, num_cpus: int | None, timeout_s: float = HEAD_START_TIMEOUT_S,
              attempts: int = HEAD_START_ATTEMPTS) -> OwnHead:
        """``ray start --head --block`` on free ports, in a new session led by ``watch``; returns once it
        runs. Ray gives its raylet a fixed 30 s to register, which a loaded machine can miss: such a head is
        started again on fresh ports, saying so, up to ``attempts`` times."""
        for attempt in range(2, attempts + 1):
            try:
                return cls._start_once(num_cpus, timeout_s)
            except RuntimeError as err:
                if _SLOW_START not in str(err):
                    raise
                print(f"the run's own Ray head did not register within Ray's 30 s (a loaded machine); starting "
                      f"it again ({attempt} of {attempts})", flush=True)
        return cls._start_once(num_cpus, timeout_s)

    @classmethod
    def _start_once(cls, num_cpus: int | None, timeout_s: float) -> OwnHead:
        own_head_auth()
        port = _free_port()
        # a temp dir of its own: ``ray start`` records its address in <temp dir>/ray_current_cluster, and a plain
        # ``ray.init()`` anywhere on the machine connects to the address in /tmp/ray's (another user's job would
        # join this run's head, or, once it is gone, fail on its dead address)
        temp_dir = tempfile.mkdtemp(prefix="digen-ray-")
        ray_cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
                   f"--temp-dir={temp_dir}",
                   f"--ray-client-server-port={_free_port()}", "--include-dashboard=false",
                   "--disable-usage-stats", "--block"]
        if num_cpus is not None:
            ray_cmd.append(f"--num-cpus={num_cpus}")
        cmd = [sys.executable, "-m", __name__, "watch", str(os.getpid()), *ray_cmd]
        fd, log_path = tempfile.mkstemp(prefix="digen-ray-head-", suffix=".log")
        with os.fdopen(fd, "w") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        head = cls(proc, f"127.0.0.1:{port}", log_path, temp_dir)
        atexit.register(head.stop)  # any exit path the runtime's shutdown did not cover
        deadline = time.monotonic() + timeout_s
        while _STARTED not in Path(log_path).read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = Path(log_path).read_text(errors="replace")[-2000:]
                head.stop()
                what = (f"exited with {proc.returncode}" if proc.returncode is not None
                        else f"did not start within {timeout_s:g} s")
                raise RuntimeError(f"the run's own Ray head ({' '.join(ray_cmd[2:])}) {what}; its output:\n{tail}")
            time.sleep(0.2)
        return head

    def stop(self, timeout_s: float = 5.0) -> None:
        """Kill the head's whole session (GCS, raylet, agents, workers) and wait until none is left.
        The driver has disconnected by now, so nothing needs Ray's graceful drain (30 s)."""
        sid = self.proc.pid
        deadline = time.monotonic() + timeout_s
        while True:
            alive = session_processes(sid) + ([sid] if self.proc.poll() is None else [])
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if self.proc.poll() is None:
                try:
                    self.proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
            if not session_processes(sid) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        Path(self.log_path).unlink(missing_ok=True)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        atexit.unregister(self.stop)


def watch(driver: int, cmd: list[str]) -> None:
    """The head session's leader: run ``cmd`` (``ray start --head --block``) until it ends or the driver
    ``driver`` (this process's parent) is gone without stopping it, then kill every other process of the
    session (Ray's agents outlive the GCS by minutes otherwise)."""
    child = subprocess.Popen(cmd)
    while child.poll() is None and os.getppid() == driver:
        time.sleep(WATCH_S)
    me = os.getpid()
    for _ in range(50):
        left = [pid for pid in session_processes(os.getsid(0)) if pid != me]
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        child.poll()  # reap it once dead
        time.sleep(0.1)


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "watch":
    watch(int(sys.argv[2]), sys.argv[3:])
