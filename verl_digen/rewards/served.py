"""A served reward model (verl-omni's ``reward.reward_model``): an OpenAI-compatible chat server that a
user's reward function posts images to (verl-omni's ``genrm_ocr.compute_score_ocr`` asks a VLM judge to
read the text in each image).

The server runs next to the generator that scores (on the generator pool, where every reward model
lives): the first score call of a generator process starts it, every reward function of that process
shares it (as verl-omni's reward functions share one ``reward_router_address``), and it stops with the
process. By default it is vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``, the
engine verl-omni serves its judge with), tensor parallel as configured; ``command`` replaces it (any
program that serves ``/v1/chat/completions`` and ``/v1/models`` on the port given as ``{port}``).
Each function then gets ``reward_router_address`` (``host:port``), ``reward_model_tokenizer`` and
``model_name`` by keyword, as verl-omni's reward loop passes them.

A judge of ``tensor_parallel_size`` > 1, or one on a pool of its own (``resources.reward.workers``), runs apart
from the scoring processes (``config/judge.py``): the driver starts its replicas as named Ray actors
(``JudgeReplica``, one server each, ``start_replicas``) on the generator pool's GPUs (``tensor_parallel_size``
GPUs of consecutive generator ranks) or on GPUs of their own, and every scoring process routes its samples
across them in turn (``Router``), as verl's router spreads a batch over the replicas behind
``reward_router_address``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: what verl-omni's reward loop passes a function when a reward model is served
SERVED_PARAMS = ("reward_router_address", "reward_model_tokenizer", "model_name")
#: packages a served judge's reward function imports (verl-omni's genrm_ocr: openai's types, aiohttp, and
#: Levenshtein for its score), import name -> pip name
JUDGE_PACKAGES = {"openai": "openai", "aiohttp": "aiohttp", "Levenshtein": "levenshtein"}
JUDGE_EXTRA = "verl-digen[judge]"
LOCAL, ANY = "127.0.0.1", "0.0.0.0"


@dataclass(frozen=True)
class ServedSpec:
    """What to serve and how: ``model_path`` (the judge's checkpoint, also the served model name),
    ``tensor_parallel_size``, ``gpu_memory_utilization`` (the share of the generator GPU vLLM may take),
    ``command`` (replaces vLLM's server; ``{port}`` and ``{model_path}`` are filled in) and
    ``startup_timeout_s``."""

    model_path: str
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    command: tuple[str, ...] | None = None
    startup_timeout_s: float = 600.0
    seconds_per_image: float | None = None  # the plans' price of an image (config/judge.py); not used here
    replicas: int = 0  # > 0: the judge runs apart, as this many Ray actors the driver starts (module docstring)
    pool: str | None = None  # their names' prefix (the driver's, per run); set when ``replicas`` > 0

    def argv(self, port: int, host: str = LOCAL) -> list[str]:
        """The server's command line. ``host``: the address it listens on (a replica apart listens on every
        interface, so generators on other nodes reach it); a ``command`` gets it as ``{host}``."""
        if self.command:
            return [part.format(port=port, model_path=self.model_path, host=host) for part in self.command]
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_path,
                "--served-model-name", self.model_path, "--host", host, "--port", str(port),
                "--tensor-parallel-size", str(self.tensor_parallel_size),
                "--gpu-memory-utilization", str(self.gpu_memory_utilization)]

    @property
    def apart(self) -> bool:
        return self.replicas > 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The server gets SIGTERM when the generator process that started it dies (Linux), so a killed
    generator leaves no judge behind holding its GPU."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class JudgeServer:
    """One served reward model process (see the module docstring)."""

    def __init__(self, spec: ServedSpec, host: str = LOCAL, advertise: str | None = None,
                 devices: str | None = None) -> None:
        """``host``: where the server listens; ``advertise``: the host others reach it at (default ``host``);
        ``devices``: its ``CUDA_VISIBLE_DEVICES`` (a replica across several generator GPUs; None: inherited)."""
        self.spec = spec
        self.port = _free_port()
        self.address = f"{advertise or host}:{self.port}"
        self.host = host
        argv = spec.argv(self.port, host)
        env = None if devices is None else {**os.environ, "CUDA_VISIBLE_DEVICES": devices}
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent, env=env)
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        logger.info("reward model %s served at %s (started in %.1f s; reward.served.startup_s prices it)",
                    spec.model_path, self.address, self.startup_s)

    def _wait_ready(self, t0: float) -> None:
        url = f"http://{LOCAL if self.host in (LOCAL, ANY) else self.host}:{self.port}/v1/models"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the reward model server exited with code {self.proc.returncode} before it "
                                   f"served {url} (command: {' '.join(self.spec.argv(self.port, self.host))})")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if time.perf_counter() - t0 > self.spec.startup_timeout_s:
                raise TimeoutError(f"the reward model server did not answer {url} within "
                                   f"{self.spec.startup_timeout_s:.0f} s (reward.served.startup_timeout_s)")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_SERVERS: dict[ServedSpec, JudgeServer] = {}


def server(spec: ServedSpec) -> JudgeServer:
    """This process's server for ``spec``, started on first use (shared by every reward function here)."""
    if spec not in _SERVERS:
        import atexit

        _SERVERS[spec] = JudgeServer(spec)
        atexit.register(_SERVERS[spec].stop)
    return _SERVERS[spec]


def stop_all() -> None:
    """Stop every server this process started."""
    _ROUTERS.clear()
    while _SERVERS:
        _SERVERS.popitem()[1].stop()


def tokenizer(model_path: str) -> Any:
    """The judge's tokenizer, as verl-omni hands it to reward functions (``reward_model_tokenizer``); None
    when the checkpoint has none that transformers can load offline (no function of verl-omni's uses it)."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.path.expanduser(model_path), local_files_only=True)
    except Exception as err:  # a checkpoint without a tokenizer, or transformers missing
        logger.info("reward model %s: no tokenizer loaded (%s); reward_model_tokenizer=None", model_path, err)
        return None


def missing_packages() -> list[str]:
    """The judge packages (``JUDGE_PACKAGES``) that do not import here."""
    import importlib.util

    return [pip for module, pip in JUDGE_PACKAGES.items() if importlib.util.find_spec(module) is None]


def spec_of(cfg: Any, replicas: int = 0) -> ServedSpec | None:
    """``reward.served`` as a ``ServedSpec`` (None when no model is served); ``replicas`` > 0: it runs apart as
    that many replicas (``config.judge.JudgePlacement.pooled``), named once the driver gives them a ``pool``."""
    if cfg is None or not cfg.model_path:
        return None
    spi = cfg.seconds_per_image
    return ServedSpec(model_path=str(cfg.model_path), tensor_parallel_size=int(cfg.tensor_parallel_size),
                      gpu_memory_utilization=float(cfg.gpu_memory_utilization),
                      command=tuple(str(c) for c in cfg.command) if cfg.command else None,
                      startup_timeout_s=float(cfg.startup_timeout_s),
                      seconds_per_image=None if spi is None else float(spi), replicas=int(replicas))


def spec_from(served: dict[str, Any]) -> ServedSpec:
    """A worker spec's ``served`` dict (``custom.with_served``) as a ``ServedSpec``."""
    command = served.get("command")
    return ServedSpec(**{**served, "command": tuple(command) if command else None})


# -- a judge apart: replicas as Ray actors, routed across ------------------------------------------------------
def replica_name(pool: str, k: int) -> str:
    return f"{pool}{k}"


class JudgeReplica:
    """One replica of a judge that runs apart: a Ray actor holding one server (``JudgeServer``), listening on
    every interface of its node (``devices``: its GPUs when they are generator GPUs Ray gave to others)."""

    def __init__(self, served: dict[str, Any], devices: str | None = None) -> None:
        import ray

        spec = spec_from(served)
        node = ray.util.get_node_ip_address()
        # vLLM listens everywhere and is reached at the node's address; a replacement command does so only
        # where it takes {host} (otherwise it is reached on this node's loopback, as it listens)
        wide = spec.command is None or any("{host}" in c for c in spec.command)
        self.server = JudgeServer(spec, host=ANY if wide else LOCAL, advertise=node if wide else LOCAL,
                                  devices=devices)

    def address(self) -> str:
        return self.server.address

    def startup_s(self) -> float:
        return self.server.startup_s

    def stop(self) -> None:
        self.server.stop()


def replica_devices(visible: list[str], tp: int) -> list[tuple[int, str | None]]:
    """The generator pool's replicas: (the rank whose placement bundle holds it, its ``CUDA_VISIBLE_DEVICES``)
    per replica, ``tp`` consecutive ranks each (``visible``: each rank's ``CUDA_VISIBLE_DEVICES``, as Ray set it;
    None where the ranks have none, a CPU run)."""
    if len(visible) % tp:
        raise ValueError(f"{len(visible)} generator ranks are not replicas of {tp} GPUs")
    out = []
    for first in range(0, len(visible), tp):
        ids = [v for v in visible[first:first + tp] if v and v != "not set"]
        out.append((first, ",".join(ids) if len(ids) == tp else None))
    return out


def start_replicas(spec: ServedSpec, placements: list[tuple[dict[str, Any], str | None]]) -> list[Any]:
    """The driver's part: one named ``JudgeReplica`` actor per ``(Ray options, devices)`` in ``placements``,
    started and answering before this returns (their start-up is logged; a failure stops the run here)."""
    import ray

    if not spec.pool:
        raise ValueError("a judge apart needs its pool name (the run's)")
    cls = ray.remote(JudgeReplica)
    served = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.__dict__.items()}
    actors = [cls.options(name=replica_name(spec.pool, k), max_concurrency=2, **{"num_cpus": 0, **opts})
              .remote(served, devices) for k, (opts, devices) in enumerate(placements)]
    try:
        starts = ray.get([a.startup_s.remote() for a in actors])
    except Exception:
        for a in actors:
            ray.kill(a)
        raise
    addresses = ray.get([a.address.remote() for a in actors])
    logger.info("reward model %s served by %d replica(s) at %s (started in %.1f s at most; reward.served.startup_s "
                "prices it)", spec.model_path,
                len(actors), ", ".join(addresses), max(starts))
    return actors


def stop_replicas(actors: list[Any]) -> None:
    import ray

    for a in actors:
        try:
            ray.get(a.stop.remote(), timeout=60)
        except Exception:  # already gone: its server died with it (PR_SET_PDEATHSIG)
            pass
        ray.kill(a)


class Router:
    """A scoring process's view of the judge's replicas: each sample goes to the next replica in turn (over
    calls too), so the micro-batches of every generator spread evenly over them."""

    def __init__(self, addresses: list[str]) -> None:
        if not addresses:
            raise ValueError("a router needs at least one replica")
        self.addresses = list(addresses)
        self._next = 0

    def take(self, n: int) -> list[str]:
        out = [self.addresses[(self._next + i) % len(self.addresses)] for i in range(n)]
        self._next = (self._next + n) % len(self.addresses)
        return out


_ROUTERS: dict[ServedSpec, Router] = {}


def router(spec: ServedSpec) -> Router:
    """This process's router for ``spec``: its own server's address, or (a judge apart) its replicas'."""
    if spec not in _ROUTERS:
        if not spec.apart:
            _ROUTERS[spec] = Router([server(spec).address])
        else:
            if not spec.pool:
                raise RuntimeError(f"the reward model {spec.model_path} runs apart ({spec.replicas} replica(s) of "
                                   f"{spec.tensor_parallel_size} GPU(s)): the run's driver starts it, not a scoring "
                                   "process")
            import ray

            actors = [ray.get_actor(replica_name(spec.pool, k)) for k in range(spec.replicas)]
            _ROUTERS[spec] = Router(ray.get([a.address.remote() for a in actors]))
    return _ROUTERS[spec]
