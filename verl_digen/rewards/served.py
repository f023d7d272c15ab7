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

    def argv(self, port: int) -> list[str]:
        if self.command:
            return [part.format(port=port, model_path=self.model_path) for part in self.command]
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_path,
                "--served-model-name", self.model_path, "--host", "127.0.0.1", "--port", str(port),
                "--tensor-parallel-size", str(self.tensor_parallel_size),
                "--gpu-memory-utilization", str(self.gpu_memory_utilization)]


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

    def __init__(self, spec: ServedSpec) -> None:
        self.spec = spec
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        argv = spec.argv(self.port)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        logger.info("reward model %s served at %s (started in %.1f s)", spec.model_path, self.address, self.startup_s)

    def _wait_ready(self, t0: float) -> None:
        url = f"http://{self.address}/v1/models"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the reward model server exited with code {self.proc.returncode} before it "
                                   f"served {url} (command: {' '.join(self.spec.argv(self.port))})")
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


def spec_of(cfg: Any) -> ServedSpec | None:
    """``reward.served`` as a ``ServedSpec`` (None when no model is served)."""
    if cfg is None or not cfg.model_path:
        return None
    return ServedSpec(model_path=str(cfg.model_path), tensor_parallel_size=int(cfg.tensor_parallel_size),
                      gpu_memory_utilization=float(cfg.gpu_memory_utilization),
                      command=tuple(str(c) for c in cfg.command) if cfg.command else None,
                      startup_timeout_s=float(cfg.startup_timeout_s))
