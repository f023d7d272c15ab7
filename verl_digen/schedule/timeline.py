"""The execution record shared by the simulator and the runtime, and its invariant checker.

Both executors append one :class:`Record` per (worker, action) when the action completes. Worker
names: ``gen0 .. gen{G-1}`` for generator workers, ``trainer`` for the trainer pool as one training
unit, ``tag0 .. tag{R-1}`` for its ranks as TAG generation slots. The timeline carries what judging it
needs (batch shape, staleness bound, trainer ranks); ``check_timeline`` verifies the scheduling
invariants listed in docs/architecture.md ("The scheduling core") and raises :class:`TimelineError`
naming the first violation. Every simulated and real run calls it at its end.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, fields, replace

from .actions import (
    GENERATE,
    OPTIMIZER_STEP,
    SCORE,
    SWITCH_TO_GEN,
    SWITCH_TO_TRAIN,
    TAG_GENERATE,
    UPDATE,
    WEIGHT_SYNC,
    ends_step,
)
from .config import stale_budget

TRAINER = "trainer"
TAG_PREFIX = "tag"
EPS = 1e-9


def gen_worker(i: int) -> str:
    return f"gen{i}"


def tag_slot(j: int) -> str:
    """Trainer rank ``j`` as a TAG generation slot."""
    return f"{TAG_PREFIX}{j}"


def is_tag_slot(worker: str) -> bool:
    return worker.startswith(TAG_PREFIX) and worker[len(TAG_PREFIX):].isdigit()


def is_trainer_side(worker: str) -> bool:
    return worker == TRAINER or is_tag_slot(worker)


@dataclass(frozen=True, slots=True)
class Record:
    """One executed action on one worker. ``version`` is the policy version of the weights used
    (generation), trained (update / optimizer step) or installed (weight sync). Slotted: a run holds
    every record of its timeline, so each costs about 110 bytes, not 350 (``bench/soak.py``)."""

    worker: str
    kind: str
    mb: int | None
    step: int
    version: int
    start: float
    end: float
    stale: bool = False
    count: int = 1  # micro-batches covered (an update of a whole release unit)
    samples: int = 0  # samples the action covered (0 for actions without data)
    # bytes the action moved, by kind ((kind, bytes) pairs of ``ledger.KINDS``; empty where nothing moved):
    # publishes, pickups and switches on the runtime, their priced moves on the simulator
    moved: tuple[tuple[str, int], ...] = ()
    mini_batch: int | None = None  # an optimizer step of a mini-batch before the step's last: its index
    # when the backend launched the action (the runtime's driver, before its Ray call; the simulator at
    # ``start``); None in files of earlier versions. ``issued - start``: the driver's dispatch latency
    issued: float | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def dispatch(self) -> float:
        """Seconds from the scheduler's decision to the backend's launch (0 where not recorded)."""
        return 0.0 if self.issued is None else self.issued - self.start


@dataclass
class Timeline:
    """Records plus what is needed to judge them: the workers and the batch structure."""

    workers: list[str]
    micro_batches: int  # per step
    steps: int
    mode: str = "digen"
    records: list[Record] = field(default_factory=list)
    staleness: float = 0.0  # TCSS bound the run was configured with
    trainer_ranks: int = 1
    mini_batches: int = 1  # optimizer steps per step (``ScheduleConfig.mini_batches``)

    def add(self, record: Record) -> None:
        self.records.append(record)

    @property
    def makespan(self) -> float:
        return max((r.end for r in self.records), default=0.0)

    @property
    def start(self) -> float:
        return min((r.start for r in self.records), default=0.0)

    def by_worker(self) -> dict[str, list[Record]]:
        out: dict[str, list[Record]] = {w: [] for w in self.workers}
        for r in self.records:
            out.setdefault(r.worker, []).append(r)
        for rs in out.values():
            rs.sort(key=lambda r: (r.start, r.end))
        return out

    def busy(self, worker: str) -> float:
        return sum(r.duration for r in self.records if r.worker == worker)

    def step_ends(self) -> list[float]:
        """End of each step: the end of its optimizer step (generators pick the version up on their own)."""
        ends: dict[int, float] = {}
        for r in self.records:
            if ends_step(r.kind, r.mini_batch):
                ends[r.step] = max(ends.get(r.step, 0.0), r.end)
        return [ends[s] for s in sorted(ends)]

    def to_dicts(self) -> list[dict]:
        return [record_dict(r) for r in self.records]


RECORD_FIELDS = tuple(f.name for f in fields(Record))


def record_dict(record: Record) -> dict:
    """A record's fields as a plain dict (what the timeline files hold; ``moved`` as a {kind: bytes} map)."""
    out = {name: getattr(record, name) for name in RECORD_FIELDS}
    out["moved"] = dict(record.moved)
    return out


def record_of(d: dict) -> Record:
    """A record read back from :func:`record_dict`'s form (``moved`` absent in files of earlier versions, whose
    mini-batch optimizer steps carried their index in ``mb``)."""
    if "mini_batch" not in d and d.get("kind") == OPTIMIZER_STEP:
        d = {**d, "mb": None, "mini_batch": d.get("mb")}
    moved = d.get("moved") or {}
    return Record(**{**d, "moved": tuple(sorted(moved.items()) if isinstance(moved, dict) else
                                         (tuple(p) for p in moved))})


class TimelineError(AssertionError):
    """A timeline violates a scheduling invariant."""


def _fail(msg: str) -> None:
    raise TimelineError(msg)


def concat_timelines(parts: list[tuple[int, Timeline]]) -> Timeline:
    """Segments of one run, each scheduled from its own step 0, as one timeline: a part's records get
    its offset added to their step and version (the runtime cuts a run at its validation steps). One
    part at offset 0 is returned as it is."""
    if not parts:
        raise ValueError("concat_timelines needs at least one (offset, timeline) part")
    if len(parts) == 1 and parts[0][0] == 0:
        return parts[0][1]
    first = parts[0][1]
    out = Timeline(workers=list(first.workers), micro_batches=first.micro_batches,
                   steps=sum(tl.steps for _, tl in parts), mode=first.mode, staleness=first.staleness,
                   trainer_ranks=first.trainer_ranks, mini_batches=first.mini_batches)
    for offset, tl in parts:
        out.records.extend(replace(r, step=r.step + offset, version=r.version + offset) for r in tl.records)
    return out


def check_timeline(timeline: Timeline, staleness_bound: float | None = None) -> None:
    """Check the invariants every execution must keep (``staleness_bound``: the timeline's own).

    - nothing overlaps on one worker; TAG slots work only in the trainer's generation mode (between a
      ``switch_to_gen`` and the next ``switch_to_train``), never alongside a training action;
    - each micro-batch of each step generated once, scored once, updated once, in that order;
      optimizer step of a step after all its updates; with several mini-batches, each mini-batch's
      optimizer step (``mini_batch`` = its index, the last one's None) after its updates and before the next
      mini-batch's, and no TAG generation of the step starts after the first one;
    - scoring has priority: no generation starts while a generated micro-batch waits for scoring;
    - no trajectory spans two versions (generation never overlaps its worker's weight sync and uses
      the worker's current weights; TAG uses the trainer's); staleness <= 1 version; stale fraction
      per step <= bound (0: synchronous, nothing stale).
    """
    if staleness_bound is None:
        staleness_bound = timeline.staleness
    if not 0 <= staleness_bound <= 1:
        raise ValueError(f"staleness bound must be in [0, 1], got {staleness_bound}")
    _check_no_overlap(timeline)
    if timeline.mode == "colocated":
        return
    _check_tag_windows(timeline)
    seen = _check_once_in_order(timeline)
    _check_scoring_priority(timeline, seen)
    _check_versions(timeline, staleness_bound)


def _check_no_overlap(timeline: Timeline) -> None:
    """One thing at a time on each worker, and nothing that ends before it starts."""
    for w, rs in timeline.by_worker().items():
        for a, b in zip(rs, rs[1:]):
            if b.start < a.end - EPS:
                _fail(f"{w}: {a.kind} (step {a.step}, mb {a.mb}) [{a.start:.6g}, {a.end:.6g}] overlaps "
                      f"{b.kind} (step {b.step}, mb {b.mb}) starting at {b.start:.6g}")
        for r in rs:
            if r.end < r.start - EPS:
                _fail(f"{w}: {r.kind} ends before it starts ({r.start} > {r.end})")


def _check_once_in_order(timeline: Timeline) -> dict[tuple[str, int, int], list[Record]]:
    """Each micro-batch generated, scored and updated exactly once, in that order, by its step's version,
    and each step's optimizer step after its updates; returns the records by (stage, step, micro-batch)."""
    recs = timeline.records
    m, steps = timeline.micro_batches, timeline.steps
    seen: dict[tuple[str, int, int], list[Record]] = defaultdict(list)
    for r in recs:
        if r.kind in (GENERATE, TAG_GENERATE):
            seen[("gen", r.step, r.mb)].append(r)
        elif r.kind == SCORE:
            seen[(r.kind, r.step, r.mb)].append(r)
        elif r.kind == UPDATE:
            for i in range(r.mb, r.mb + r.count):
                seen[(r.kind, r.step, i)].append(r)
    for s in range(steps):
        for i in range(m):
            g, sc, up = seen.get(("gen", s, i), []), seen.get((SCORE, s, i), []), seen.get((UPDATE, s, i), [])
            for name, lst in (("generated", g), ("scored", sc), ("updated", up)):
                if len(lst) != 1:
                    _fail(f"step {s} micro-batch {i} {name} {len(lst)} times (expected once)")
            if sc[0].start < g[0].end - EPS:
                _fail(f"step {s} mb {i} scored at {sc[0].start:.6g} before its generation ended at {g[0].end:.6g}")
            if up[0].start < sc[0].end - EPS:
                _fail(f"step {s} mb {i} updated at {up[0].start:.6g} before its scoring ended at {sc[0].end:.6g}")
            if up[0].version != s:
                _fail(f"step {s} mb {i} trained by policy version {up[0].version}, expected {s}")
    opts = {r.step: r for r in recs if ends_step(r.kind, r.mini_batch) and r.worker == TRAINER}
    for s in range(steps):
        if s not in opts:
            _fail(f"step {s} has no optimizer step")
        last_update = max(seen[(UPDATE, s, i)][0].end for i in range(m))
        if opts[s].start < last_update - EPS:
            _fail(f"step {s} optimizer step starts at {opts[s].start:.6g} before its last update ends")
    if timeline.mini_batches > 1:
        _check_mini_batches(timeline, seen, opts)
    extra = {k for k in seen if not (0 <= k[1] < steps and 0 <= k[2] < m)}
    if extra:
        _fail(f"records for unknown micro-batches: {sorted(extra)[:5]}")
    return seen


def _check_scoring_priority(timeline: Timeline, seen: dict[tuple[str, int, int], list[Record]]) -> None:
    """Scoring first: a generator worker starts no generation while a generated micro-batch waits for
    scoring (a zero-length generation dispatched at the same instant was not there to be seen)."""
    m, steps = timeline.micro_batches, timeline.steps
    gen = {(s, i): seen[("gen", s, i)][0] for s in range(steps) for i in range(m)}
    score_start = {(s, i): seen[(SCORE, s, i)][0].start for s in range(steps) for i in range(m)}
    waiting = sorted((g.end, g.start, score_start[k], k) for k, g in gen.items())
    for r in timeline.records:
        if r.kind != GENERATE:
            continue
        t = r.start
        for ge, gs, ss, k in waiting:
            if ge > t + EPS:
                break
            if ss > t + EPS and gs < t - EPS:
                _fail(f"{r.worker} started generating step {r.step} mb {r.mb} at {t:.6g} while step {k[0]} "
                      f"mb {k[1]} waited for scoring (generated {ge:.6g}, scored {ss:.6g})")


def _check_versions(timeline: Timeline, staleness_bound: float) -> None:
    """Generation uses its worker's current weights, never across a sync; at most one version stale, and
    no more stale micro-batches per step than the bound allows."""
    m = timeline.micro_batches
    stale_count: dict[int, int] = defaultdict(int)
    for w, rs in timeline.by_worker().items():
        version = 0
        for r in rs:
            if r.kind == WEIGHT_SYNC:
                version = r.version
            elif r.kind in (GENERATE, TAG_GENERATE):
                expected = version if not is_trainer_side(w) else r.step
                if r.version != expected:
                    _fail(f"{w} generated step {r.step} mb {r.mb} with version {r.version} but held {expected}")
                if not r.step - 1 <= r.version <= r.step:
                    _fail(f"step {r.step} mb {r.mb} generated by version {r.version}: staleness above one version")
                if r.version < r.step:
                    stale_count[r.step] += 1
    for s, c in stale_count.items():
        if c > stale_budget(staleness_bound, m):
            _fail(f"step {s}: {c}/{m} micro-batches stale, above the bound {staleness_bound}")


def _check_mini_batches(timeline: Timeline, seen: dict, opts: dict[int, Record]) -> None:
    """Each mini-batch trains between the previous one's optimizer step and its own; TAG stops at the
    first (its weights are the step's no longer)."""
    n, m = timeline.mini_batches, timeline.micro_batches
    per = m // n
    mids: dict[int, list[Record]] = defaultdict(list)
    for r in timeline.records:
        if r.kind == OPTIMIZER_STEP and r.worker == TRAINER and r.mini_batch is not None:
            mids[r.step].append(r)
    for s in range(timeline.steps):
        steps_of = sorted(mids.get(s, []), key=lambda r: r.start) + [opts[s]]
        if [r.mini_batch for r in steps_of] != [*range(n - 1), None]:
            _fail(f"step {s}: mini-batch optimizer steps {[r.mini_batch for r in steps_of]}, expected "
                  f"{[*range(n - 1), None]}")
        for c, opt in enumerate(steps_of):
            ups = [seen[(UPDATE, s, i)][0] for i in range(c * per, (c + 1) * per)]
            if max(u.end for u in ups) > opt.start + EPS:
                _fail(f"step {s} mini-batch {c}: an update ends after its optimizer step starts at {opt.start:.6g}")
            if c and min(u.start for u in ups) < steps_of[c - 1].end - EPS:
                _fail(f"step {s} mini-batch {c}: an update starts before mini-batch {c - 1}'s optimizer step ends "
                      f"at {steps_of[c - 1].end:.6g}")
        late = [r for r in timeline.records if r.kind == TAG_GENERATE and r.step == s
                and r.start > steps_of[0].end - EPS]
        if late:
            _fail(f"step {s}: TAG generated mb {late[0].mb} at {late[0].start:.6g}, after the first mini-batch's "
                  f"optimizer step moved the weights at {steps_of[0].end:.6g}")


def _check_tag_windows(timeline: Timeline) -> None:
    """TAG slot records lie inside the trainer's generation-mode windows."""
    windows: list[tuple[float, float]] = []
    opened: float | None = None
    for r in timeline.by_worker().get(TRAINER, []):
        if r.kind == SWITCH_TO_GEN:
            opened = r.end
        elif r.kind == SWITCH_TO_TRAIN and opened is not None:
            windows.append((opened, r.start))
            opened = None
        elif opened is not None:
            _fail(f"trainer ran {r.kind} (step {r.step}) at {r.start:.6g} while in generation mode")
    if opened is not None:
        windows.append((opened, float("inf")))
    for w, rs in timeline.by_worker().items():
        if not is_tag_slot(w):
            continue
        for r in rs:
            if not any(a - EPS <= r.start and r.end <= b + EPS for a, b in windows):
                _fail(f"{w}: {r.kind} (step {r.step}, mb {r.mb}) [{r.start:.6g}, {r.end:.6g}] outside the "
                      "trainer's generation mode (TAG needs a switch_to_gen first)")
