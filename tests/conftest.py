"""Shared test settings: one thread (2-core CI machines), the verl CPU platform, and one Ray session
for the whole test run (each worker actor costs ~0.5 GB and 5-10 s to start on 2 cores)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["VERL_PLATFORM"] = "cpu"  # the driver resolves verl's platform too (placement groups)

import pytest  # noqa: E402


def pytest_configure(config):
    """One torch thread in every process that runs tests; xdist's controller runs none and skips torch's import
    (~1.5 s of CPU)."""
    if getattr(config, "workerinput", None) is None and config.getoption("numprocesses", None):
        return
    import torch

    torch.set_num_threads(1)
    _parse_each_yaml_once()


def _parse_each_yaml_once() -> None:
    """Hydra parses every config file again at every compose (eight files, digen.yaml twice): ~20 ms of a
    compose's ~75 ms, and the suite composes thousands of times. In the test processes, a file Hydra reads is
    parsed once per distinct text and each compose gets its own deep copy; files loaded by path, and any text
    that fails to parse, go through OmegaConf as before (a changed file is new text, parsed afresh)."""
    import copy
    import io

    from omegaconf import OmegaConf

    load = OmegaConf.load
    parsed: dict[str, object] = {}

    def load_once(file_):
        if not hasattr(file_, "read"):  # a path: what the package and the tests load themselves
            return load(file_)
        text = file_.read()
        if text not in parsed:
            parsed[text] = load(io.StringIO(text))
        return copy.deepcopy(parsed[text])

    OmegaConf.load = staticmethod(load_once)


#: what every worker process gets: Ray merges it with the per-actor env verl's worker groups set
#: (RANK, WORLD_SIZE, MASTER_ADDR/PORT)
WORKER_ENV = {
    "VERL_PLATFORM": "cpu",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by every test that needs one; shut down at the end of the run."""
    import ray

    for attempt in range(3):  # Ray gives its raylet a fixed 30 s to register, which a loaded machine can miss
        if ray.is_initialized():
            break
        try:
            # "local": a Ray instance of this test process's own (each xdist worker has one)
            ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": WORKER_ENV})
        except Exception as err:
            if "timed out during startup" not in str(err) or attempt == 2:
                raise
            ray.shutdown()
    yield ray
    ray.shutdown()


@pytest.fixture
def weights_on_this_machine(monkeypatch):
    """Validate GPU launch lines as on the machine that runs them: their hub model ids count as in the Hugging
    Face cache (a run without a Ray address is one node, where a missing one is refused; this machine has none)."""
    from verl_digen.config import checks

    monkeypatch.setattr(checks, "hub_cached", lambda repo_id: True)


@pytest.fixture(scope="session")
def verl_omni_snapshots(tmp_path_factory):
    """verl-omni and the verl it pins, extracted once per test run, plus the vllm / vllm_omni import stubs
    (see tests/verl_omni_helpers.py); skips when the snapshots are absent."""
    from verl_omni_helpers import SKIP_REASON, extract_snapshots, tarballs_present

    if not tarballs_present():
        pytest.skip(SKIP_REASON)
    return extract_snapshots(tmp_path_factory.mktemp("third_party"))


VLLM_SKIP = "vllm-omni not importable: run scripts/vllm_tier.sh"


def _vllm_omni_error() -> str | None:
    """Why ``vllm_omni`` cannot be used here (None: it imports). Not installed is decided without importing."""
    import importlib.util

    if importlib.util.find_spec("vllm_omni") is None:
        return "not installed"
    try:
        import vllm_omni.entrypoints.omni  # noqa: F401
    except Exception as err:  # e.g. CUDA torchvision beside a CPU torch
        return f"{type(err).__name__}: {err}"
    return None


def pytest_collection_modifyitems(items):
    """``vllm`` tests skip, with the reason, where vllm-omni cannot be imported (the opt-in tier's venv,
    ``scripts/vllm_tier.sh``, is where they run). A test that uses the shared Ray session is a ``ray`` test, and
    every ``ray`` test is ``slow``.

    Then files with ``ray`` tests run first, then files with other ``slow`` tests, then the rest (each
    group in collection order): xdist hands out whole files in this order (``--no-loadscope-reorder`` in
    pytest.ini), so the long files start early and the many short ones fill the gaps at the end."""
    vllm_items = [item for item in items if item.get_closest_marker("vllm")]
    error = _vllm_omni_error() if vllm_items else None
    if error is not None:
        skip = pytest.mark.skip(reason=f"{VLLM_SKIP} ({error})")
        for item in vllm_items:
            item.add_marker(skip)
    for item in items:
        if "ray_session" in item.fixturenames:
            item.add_marker(pytest.mark.ray)
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.slow)
    rank: dict[object, int] = {}  # test file -> group
    for item in items:
        weight = 0 if item.get_closest_marker("ray") else 1 if item.get_closest_marker("slow") else 2
        rank[item.path] = min(rank.get(item.path, 2), weight)
    items.sort(key=lambda item: rank[item.path])  # stable: collection order within a group
