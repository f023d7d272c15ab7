"""Trainer checkpoints at global-step boundaries: safe to load, atomic, owned by one run.

Layout of ``<root>/global_step_<N>/`` (a *complete* checkpoint):

- ``trainer.pt`` (rank 0): tensors only -- the full (gathered) trainable weights and the optimizer's
  per-parameter tensors;
- ``rng_rank<r>.pt`` (every rank): that rank's RNG streams as tensors, plus the Python / numpy
  scalars as one JSON string;
- ``config.yaml`` (rank 0, when the driver passes it): the resolved run config, for people;
- ``meta.json`` (rank 0, written last): everything else as JSON -- format, run id, step, policy
  version, data position, LoRA flag, optimizer hyper-parameters and the config fingerprint a resume
  is checked against;
- ``<file>.xxh3`` beside each of these: the file's xxh3-64 digest, computed from the bytes as they are
  written (no second pass), so ``verify`` finds a file whose bytes changed at the same size.

Why: ``torch.load(weights_only=True)`` refuses any pickled object that is not a tensor or a plain
container, so a crafted file given to ``trainer.resume_from`` cannot run code. Every rank writes into
``<root>/.partial-global_step_<N>``; rank 0 writes ``meta.json`` after a barrier and renames the
directory, so a run killed mid-save leaves only a ``.partial-*`` directory, which is never taken for
a checkpoint. Full state dicts make a checkpoint independent of the trainer pool's size; every rank
reads the same directory, so on a multi-node pool the root must be on a shared filesystem. A
checkpoint saved before the digests existed has no ``meta.json.xxh3``: it loads, unverified.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash  # torch and numpy are imported where tensors are saved or loaded: a config check reads directories

FORMAT = 2
TRAINER_FILE = "trainer.pt"
META_FILE = "meta.json"
STEP_PREFIX = "global_step_"
PARTIAL_PREFIX = ".partial-"
#: a complete checkpoint of a step being saved again, renamed out of the way; it counts as that step's
#: checkpoint until the new one is in place (a kill between the two renames leaves it, and only it)
REPLACED_PREFIX = ".replaced-"
LOCK_FILE = ".digen-run.lock"
#: the resolved run config, as YAML, next to the weights (for people; a resume checks ``extra["config"]``)
CONFIG_FILE = "config.yaml"
#: the key of ``extra`` whose text rank 0 writes to ``CONFIG_FILE`` instead of meta.json
CONFIG_YAML_KEY = "config_yaml"
#: the digest file beside each checkpoint file, and the hash it holds (hex)
CHECKSUM_SUFFIX = ".xxh3"
CHECKSUM_ALGO = "xxh3_64"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, unsafe or does not match the run; the message says which."""


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


# -- RNG as tensors + JSON ------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Every random stream this process may draw from, as tensors plus one JSON string."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "json": json.dumps({"python": [version, list(internal), gauss_next],
                            "numpy": [kind, int(pos), int(has_gauss), float(cached)]}),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    meta = json.loads(state["json"])
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = meta["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, state["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- paths ----------------------------------------------------------------------------------------
def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{STEP_PREFIX}{step}"


def partial_dir(path: str | Path) -> Path:
    p = Path(path)
    return p.parent / f"{PARTIAL_PREFIX}{p.name}"


def step_of(path: str | Path) -> int | None:
    name = Path(path).name.removeprefix(REPLACED_PREFIX)
    if not name.startswith(STEP_PREFIX) or not name[len(STEP_PREFIX):].isdigit():
        return None
    return int(name[len(STEP_PREFIX):])


def problem(path: str | Path) -> str | None:
    """Why ``path`` is not a complete checkpoint (None when it is one). Cheap: reads only meta.json."""
    p = Path(path)
    if not p.exists():
        return "the path does not exist"
    if not p.is_dir():
        return "the path is not a directory"
    if p.name.startswith(PARTIAL_PREFIX):
        return "it is a partial checkpoint (a save that did not finish)"
    for f in (META_FILE, TRAINER_FILE, rng_file(0)):
        if not (p / f).is_file():
            inner = complete_checkpoints(p) if f == META_FILE else []
            if inner:  # a run's checkpoint directory (trainer.default_local_dir), not one checkpoint
                return f"it holds checkpoints but is not one: pass one of them, e.g. {inner[-1][1]} (the latest)"
            hint = " (a checkpoint of an older verl-digen, or a save that did not finish)" if f == META_FILE else ""
            return f"it has no {f}{hint}"
    try:
        meta = json.loads((p / META_FILE).read_text())
    except (OSError, ValueError) as err:
        return f"its {META_FILE} is unreadable ({err})"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not meta.get("complete"):
        return f"its {META_FILE} is not a complete verl-digen checkpoint of format {FORMAT}"
    for name, size in (meta.get("files") or {}).items():  # a truncated or missing file, found without reading it
        f = p / name
        have = f.stat().st_size if f.is_file() else None
        if have != size:
            return f"{name} is {'missing' if have is None else f'{have} bytes, but {size} were written'}"
    return None


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, dir) of every complete checkpoint under ``root``, oldest first."""
    r = Path(root)
    if not r.is_dir():
        return []
    out = [(s, d) for d in r.iterdir() if (s := step_of(d)) is not None and problem(d) is None
           and not (d.name.startswith(REPLACED_PREFIX) and step_dir(r, s).exists())]
    return sorted(out)


def foreign_step_dirs(root: str | Path) -> list[tuple[Path, str]]:
    """(dir, why) of every ``global_step_<N>`` folder under ``root`` that is not a complete verl-digen
    checkpoint (another trainer's, e.g. verl-omni's, or a damaged one): a run that saves step N would
    replace it."""
    r = Path(root)
    if not r.is_dir():
        return []
    return sorted((d, why) for d in r.iterdir() if d.name.startswith(STEP_PREFIX) and step_of(d) is not None
                  and (why := problem(d)) is not None)


def latest(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root`` (partial ones never count)."""
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def read_meta(path: str | Path) -> dict[str, Any]:
    why = problem(path)
    if why is not None:
        raise CheckpointError(f"no trainer checkpoint at {str(path)!r}: {why}")
    return json.loads((Path(path) / META_FILE).read_text())


# -- write ----------------------------------------------------------------------------------------
#: copies of the trained tensors a checkpoint keeps beside them: the EMA, DiffusionNFT's old policy
TENSOR_COPIES = ("ema", "nft_old")


def _split(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors for trainer.pt, the JSON rest) of the trainer's payload."""
    import torch

    tensors: dict[str, Any] = {"params": dict(payload["params"]), "optim": {}}
    for key in TENSOR_COPIES:  # the EMA (actor.ema_decay), DiffusionNFT's old copy: by parameter name
        if payload.get(key) is not None:
            tensors[key] = dict(payload[key])
    optim_scalars: dict[str, dict[str, Any]] = {}
    for name, state in payload["optim"].items():
        tensors["optim"][name] = {k: v for k, v in state.items() if torch.is_tensor(v)}
        scalars = {k: v for k, v in state.items() if not torch.is_tensor(v)}
        if scalars:
            optim_scalars[name] = scalars
    rest = {k: v for k, v in payload.items() if k not in ("params", "optim", *TENSOR_COPIES)}
    rest["optim_scalars"] = optim_scalars
    return tensors, rest


def non_finite(tensors: dict[str, Any], prefix: str = "") -> str | None:
    """The name of the first tensor holding NaN/Inf (nested dicts), or None."""
    import torch

    for k, v in tensors.items():
        if isinstance(v, dict):
            bad = non_finite(v, f"{prefix}{k}.")
            if bad:
                return bad
        elif torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all()):
            return f"{prefix}{k}"
    return None


def _fsync_dir(p: Path) -> None:
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _HashingWriter:
    """A binary file that hashes what goes through ``write``: the digest of a save costs no re-read."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.hash = xxhash.xxh3_64()

    def write(self, data: Any) -> int:
        self.hash.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def checksum_file(path: Path) -> Path:
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def _write_digest(dst: Path, digest: str) -> None:
    with open(checksum_file(dst), "w") as f:
        f.write(digest + "\n")
        f.flush()
        os.fsync(f.fileno())


def _save_file(obj: Any, dst: Path) -> None:
    import torch

    with open(dst, "wb") as f:
        out = _HashingWriter(f)
        torch.save(obj, out)
        f.flush()
        os.fsync(f.fileno())
    _write_digest(dst, out.hash.hexdigest())


def _save_bytes(data: bytes, dst: Path) -> None:
    with open(dst, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    _write_digest(dst, xxhash.xxh3_64_hexdigest(data))


def save(path: str | Path, rank: int, payload: dict[str, Any] | None, extra: dict[str, Any],
         barrier: Callable[[], None], keep: int | None = None) -> None:
    """Every rank writes its RNG state (rank 0 also the payload) into the partial directory; after
    ``barrier`` rank 0 writes ``meta.json``, renames the directory into place and prunes old
    checkpoints down to ``keep``; a last barrier so nobody returns before the checkpoint exists."""
    final = Path(path)
    tmp = partial_dir(final)
    if rank == 0:
        if tmp.exists():  # a leftover of a save that was killed
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier()
    tmp.mkdir(parents=True, exist_ok=True)  # single-rank pools and ranks that raced the barrier
    _save_file(rng_state(), tmp / rng_file(rank))
    rest: dict[str, Any] = {}
    if payload is not None:
        tensors, rest = _split(payload)
        _save_file(tensors, tmp / TRAINER_FILE)
    barrier()
    if rank == 0:
        extra = dict(extra)
        config_yaml = extra.pop(CONFIG_YAML_KEY, None)
        if config_yaml is not None:  # listed in ``files`` below like the tensors, so a truncated one is seen
            _save_bytes(str(config_yaml).encode(), tmp / CONFIG_FILE)
        files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
        meta = {"format": FORMAT, "complete": True, "saved_at": time.time(), "files": files, **rest,
                "checksum": CHECKSUM_ALGO, "extra": dict(extra)}
        _save_bytes(json.dumps(meta, indent=1, sort_keys=True, default=_json_default).encode(), tmp / META_FILE)
        _fsync_dir(tmp)
        old = final.parent / f"{REPLACED_PREFIX}{final.name}"
        if final.exists():  # the same step saved again (a resumed run): replaced whole, and a complete
            shutil.rmtree(old, ignore_errors=True)  # copy is there at every moment (the old one counts as
            final.rename(old)  # the step's checkpoint until the new one is in place)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)  # the replaced copy, or one a killed re-save left
        _fsync_dir(final.parent)
        if keep is not None and keep > 0:
            prune(final.parent, keep)
    barrier()


def _json_default(v: Any) -> Any:
    import torch

    if isinstance(v, tuple):
        return list(v)
    if torch.is_tensor(v) and v.numel() == 1:
        return v.item()
    raise TypeError(f"checkpoint metadata holds a {type(v).__name__}, which is not JSON")


def prune(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest complete checkpoints under ``root``; returns what went."""
    found = complete_checkpoints(root)
    gone = [d for _, d in found[:-keep]] if len(found) > keep else []
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone


# -- read -----------------------------------------------------------------------------------------
def _digest_of(file: Path) -> str:
    h = xxhash.xxh3_64()
    with open(file, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _check_digest(file: Path) -> None:
    side = checksum_file(file)
    try:
        want = side.read_text().strip()
    except OSError as err:
        raise CheckpointError(f"{str(file)!r} has no readable checksum file {side.name} ({err.strerror or err}): "
                              "its bytes cannot be verified") from None
    have = _digest_of(file)
    if have != want:
        raise CheckpointError(f"{str(file)!r} is corrupt: its {CHECKSUM_ALGO} is {have}, but {want} was written "
                              f"when it was saved ({side.name}); refused")


_VERIFIED: dict[str, tuple] = {}  # checkpoint -> its files' (name, size, mtime) when this process verified it


def _signature(p: Path) -> tuple:
    return tuple(sorted((f.name, st.st_size, st.st_mtime_ns) for f in p.iterdir() if f.is_file()
                        for st in (f.stat(),)))


def verify(path: str | Path) -> bool:
    """Check every file of the complete checkpoint at ``path`` against the digest written beside it at save
    time; raises ``CheckpointError`` naming the first file whose bytes changed. False: the checkpoint
    predates the digests (nothing to verify against), True: every file verified. Reads every file once per
    process (the command line and the runtime both validate): again only when a file's size or mtime moved."""
    p = Path(path)
    key, started = str(p.resolve()), time.time_ns()
    if _VERIFIED.get(key) == _signature(p):
        return True
    meta_sum = checksum_file(p / META_FILE)
    if not meta_sum.is_file():
        meta = read_meta(p)
        if meta.get("checksum"):
            raise CheckpointError(f"{str(p / META_FILE)!r} records {meta['checksum']} digests, but {meta_sum.name} "
                                  "is missing: its bytes cannot be verified")
        return False
    _check_digest(p / META_FILE)
    meta = read_meta(p)
    for name in sorted(meta.get("files") or {}):
        if not name.endswith(CHECKSUM_SUFFIX):
            _check_digest(p / name)
    signature = _signature(p)
    if all(mtime < started - 2 * 10**9 for _, _, mtime in signature):  # mtimes are coarse: a file written
        _VERIFIED[key] = signature  # within the last ticks could change again without its mtime moving
    return True


def safe_load(file: str | Path) -> Any:
    """``torch.load(weights_only=True)``: tensors and plain containers only, never arbitrary code."""
    import torch

    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError for foreign objects, RuntimeError / EOFError for torn files
        raise CheckpointError(
            f"cannot load {str(file)!r} as a verl-digen checkpoint file: it is corrupt, truncated, or holds "
            f"objects other than tensors (refused without running them): {type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}") from None


def read(path: str | Path, rank: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(trainer payload in ``save``'s shape, this rank's RNG state or None when the checkpoint came
    from a smaller pool)."""
    meta = read_meta(path)
    tensors = safe_load(Path(path) / TRAINER_FILE)
    if not isinstance(tensors, dict) or not isinstance(tensors.get("params"), dict):
        raise CheckpointError(f"{str(Path(path) / TRAINER_FILE)!r} is not a verl-digen trainer file")
    optim = {name: dict(state) for name, state in tensors.get("optim", {}).items()}
    for name, scalars in meta.get("optim_scalars", {}).items():
        optim.setdefault(name, {}).update(scalars)
    groups = []
    for g in meta.get("param_groups", []):
        g = dict(g)
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    payload = {**{k: v for k, v in meta.items() if k not in ("optim_scalars", "param_groups")},
               "params": tensors["params"], "optim": optim, "param_groups": groups,
               **{key: tensors.get(key) for key in TENSOR_COPIES}}
    rng_path = Path(path) / rng_file(rank)
    return payload, (safe_load(rng_path) if rng_path.is_file() else None)


# -- ownership: one live run per checkpoint directory ------------------------------------------------
_HELD: set[str] = set()  # run ids whose lock this process holds


def _alive(info: dict[str, Any]) -> bool:
    if info.get("host") != socket.gethostname():
        return True  # cannot check another host's process: a lock is honoured until removed
    pid = int(info.get("pid", -1))
    if pid == os.getpid():
        return info.get("run_id") in _HELD
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def acquire_lock(root: str | Path, run_id: str) -> Path:
    """Claim ``root`` for ``run_id``; raises ``CheckpointError`` when another live run holds it (a
    lock left by a dead process on this host is taken over)."""
    r = Path(root)
    r.mkdir(parents=True, exist_ok=True)
    lock = r / LOCK_FILE
    info = {"run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                held = json.loads(lock.read_text())
            except (OSError, ValueError):
                held = {}
            if held and _alive(held):
                raise CheckpointError(
                    f"trainer.default_local_dir={str(r)!r} is in use by run {held.get('run_id')} (pid "
                    f"{held.get('pid')} on {held.get('host')}); two runs writing one directory would mix "
                    f"their checkpoints. Use another directory, or remove {str(lock)!r} if that run is gone") from None
            lock.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        _HELD.add(run_id)
        return lock
    raise CheckpointError(f"could not take the checkpoint lock {str(lock)!r}")


def release_lock(root: str | Path, run_id: str) -> None:
    lock = Path(root) / LOCK_FILE
    _HELD.discard(run_id)
    try:
        if json.loads(lock.read_text()).get("run_id") == run_id:
            lock.unlink()
    except (OSError, ValueError):
        pass
