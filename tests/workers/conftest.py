"""One Ray session for the whole test session (actors are expensive on 2 cores), CPU platform."""

import os

os.environ["VERL_PLATFORM"] = "cpu"  # the driver resolves verl's platform too (placement groups)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import pytest  # noqa: E402

WORKER_ENV = {
    "VERL_PLATFORM": "cpu",
    "OMP_NUM_THREADS": "1",
    "RAY_AUTH_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance; the job-level runtime_env reaches every actor (Ray merges it with the
    per-actor env_vars verl's worker groups set: RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=8, include_dashboard=False, log_to_driver=False,
            runtime_env={"env_vars": WORKER_ENV},
        )
    yield ray
    ray.shutdown()
