"""Runtime tests share one Ray session (workers cost ~0.5 GB and 5-10 s each on 2 cores)."""

import os

import pytest


@pytest.fixture(scope="session")
def ray_cpu():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["VERL_PLATFORM"] = "cpu"
    if not ray.is_initialized():
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "1"}})
    yield ray
