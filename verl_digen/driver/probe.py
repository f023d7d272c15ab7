"""The runtime's after-run probe: what a run's own actions never sized, measured so its profile can
predict other modes and TAG policies (``DigenRuntime(probe=True)``, see its docstring). It gets the
run's worker groups and row mapping as arguments, as the Ray backend does."""

from __future__ import annotations

import time
from typing import Any

import ray
from verl.single_controller.ray.base import RayWorkerGroup

from verl_digen.config import RunConfig
from verl_digen.driver.ray_backend import WORKER_METHODS, Rows
from verl_digen.schedule.actions import GENERATE, SCORE, SWITCH_TO_GEN, SWITCH_TO_TRAIN, TAG_GENERATE, UPDATE
from verl_digen.schedule.costs import ALL_GATHER, SHARDED_CALLS


def probe_costs(cfg: RunConfig, gen_wg: RayWorkerGroup, trn_wg: RayWorkerGroup, rows_of: Rows, step: int,
                reps: int = 3) -> list[dict[str, Any]]:
    """Profile samples (``profile_io`` format) of the probe described in the class docstring.

    Runs after the last optimizer step, on the prompts of the next (untrained) global step
    ``step``, one action at a time: generation, scoring and a training pass at the run's micro-batch
    size and at a second size (up to 4 micro-batches), then a switch to generation, one micro-batch
    generated on trainer rank 0 and the switch back; ``reps`` times after one cold repetition (new
    sizes are cold starts, as the run's first step is). The training pass has loss scale 0: the
    full forward + backward, adding zero to the gradients, and no optimizer step follows. Nothing
    here enters the timeline or the step reports. Run alone, these calls do not contend with the
    other pool for the host as the run's do, so the profile takes from them the cost's shape and
    the level from the run (``measured_profile``). With one CPU trainer rank, last: the trainer's collective
    counts and an all-gather between it and generator 0 at two sizes (``costs.Sharded``: what sharding the
    trainer adds). ``rows_of`` maps (prompt-in-step, sample) pairs to rows as the run did (``RayBackend``'s
    ``rows``)."""
    mb, batch = cfg.rollout.micro_batch_size, cfg.batch
    # a wide lever arm (up to the whole batch, which separate trains in one update) keeps the
    # fitted per-sample / per-row slope stable against host noise
    second = min(batch, 4 * mb) if batch > mb else max(1, mb // 2)
    pairs = [(p, s) for p in range(cfg.data.train_batch_size) for s in range(cfg.rollout.n)]
    gen = gen_wg.workers[0]
    trainers = trn_wg.workers
    gen_version = ray.get(gen.weights_version.remote())
    trn_version = ray.get(trainers[0].weights_version.remote())
    degree = cfg.digen.tsp.degree or cfg.trained_steps()

    def timed(refs: list[ray.ObjectRef]) -> float:
        t0 = time.perf_counter()
        ray.wait(refs, num_returns=len(refs))
        return time.perf_counter() - t0

    out: list[dict[str, Any]] = []
    for rep in range(reps + 1):
        measured: list[dict[str, Any]] = []
        for size in sorted({mb, second}):
            rows, texts = rows_of(step, pairs[:size])
            t0 = time.perf_counter()
            traj = gen.generate.remote(step, gen_version, rows, texts)
            ray.wait([traj])
            t_gen = time.perf_counter() - t0
            scored, ids = gen.score_rows.options(num_returns=2).remote(traj)
            t_score = timed([scored, ids])
            measured += [{"pool": "generator", "kind": GENERATE, "size": size, "seconds": t_gen},
                         {"pool": "generator", "kind": SCORE, "size": size, "seconds": t_score}]
            zero_adv = {(pid, s): 0.0 for pid, s in rows}  # any size: the ranks split its rows (schedule.rows)
            t_update = timed(trn_wg.execute_all_async("update", (scored,), 0.0, zero_adv))
            measured.append({"kind": UPDATE, "size": size, "tsp_degree": degree, "seconds": t_update})
        rows, texts = rows_of(step, pairs[:mb])
        t_to_gen = timed(trn_wg.execute_all_async(WORKER_METHODS[SWITCH_TO_GEN]))
        t_tag = timed([trainers[0].tag_generate.remote(step, trn_version, rows, texts)])
        t_to_train = timed(trn_wg.execute_all_async(WORKER_METHODS[SWITCH_TO_TRAIN]))
        measured += [{"kind": SWITCH_TO_GEN, "seconds": t_to_gen},
                     {"kind": TAG_GENERATE, "size": mb, "seconds": t_tag},
                     {"kind": SWITCH_TO_TRAIN, "seconds": t_to_train}]
        if rep > 0:
            out += measured
    # what sharding the trainer would add, which this run's unsharded rank never did (CPU ranks gather over
    # gloo, as timed here; a GPU pool's NCCL is not)
    if len(trainers) == 1 and cfg.trainer.device == "cpu":
        out += _sharded_samples(trainers[0], gen)
    return out


def _sharded_samples(trainer: Any, gen: Any) -> list[dict[str, Any]]:
    """The trainer's collective counts and an all-gather between it and a generator (two processes of the
    run on their hosts) of one element and of the whole model (half per rank), as profile samples."""
    counts = ray.get(trainer.sharded_calls.remote())
    host, port = ray.get(trainer.get_available_master_addr_port.remote())
    numels = [1, max(2, counts["switch_bytes"] // 8)]
    timed = ray.get([w.time_all_gather.remote(host, int(port), r, 2, numels) for r, w in enumerate((trainer, gen))])
    return [*({"kind": ALL_GATHER, "size": b, "seconds": t} for b, t in timed[0]), {"kind": SHARDED_CALLS, **counts}]
