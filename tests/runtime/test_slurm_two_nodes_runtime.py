"""recipes/slurm/digen.sbatch as a 2-node Slurm job on one machine (issue 49): the script itself, with real
``ray start`` processes and a real tiny digen run; only Slurm is stood in for.

- ``srun``: runs the step's command here as the node ``-w`` names would, with the ``SLURM_*`` variables Slurm
  sets per node, in a session of its own whose leftovers it kills when the command ends (slurmstepd ends a
  step's processes with it);
- ``ray`` (the script's ``RAY``): ``ray start`` with what a node of its own would have, ports and a temp dir,
  started again when Ray's fixed 30 s raylet wait runs out on a loaded machine (driver/cluster.py does the same);
- ``scontrol``: the job's node list.

The generator pool asks for a resource only node 1 advertises and the trainer pool one only node 2 does
(``NODE_RESOURCES``): each pool's workers run on its node (the nodes' worker logs), the run's trace says its
weight pickups crossed nodes, and its profile fits each pool's hardware, named by its resource, from that pool's
own workers. No process the job started
may be alive 5 s after the script ends (checked until none is)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "recipes" / "slurm" / "digen.sbatch"
NODES = ["node1", "node2"]
JOB_TIMEOUT_S = 420  # the whole job on a loaded 2-core machine (about 60 s when idle)

SRUN = '''#!{python}
import os, signal, subprocess, sys, time
args, node = sys.argv[1:], None
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if flag == "-w":
        node = args.pop(0)
nodes = os.environ["FAKE_NODES"].split()
node = node or nodes[0]
env = dict(os.environ, SLURMD_NODENAME=node, SLURM_NODEID=str(nodes.index(node)), SLURM_STEP_NODELIST=node,
           SLURM_STEP_NUM_NODES="1", SLURM_STEP_NUM_TASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0")
child = subprocess.Popen(args, env=env, start_new_session=True)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(sig, lambda s, _: child.send_signal(s))
rc = child.wait()


def left():
    found = []
    for entry in os.listdir("/proc"):
        try:
            fields = open(f"/proc/{{entry}}/stat").read().rsplit(")", 1)[-1].split()
        except (OSError, ValueError):
            continue
        if fields[0] != "Z" and int(fields[3]) == child.pid:
            found.append(int(entry))
    return found


for _ in range(50):  # the step's leftovers, as slurmstepd kills them
    pids = left()
    if not pids:
        break
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(f"srun on {{node}}: killed {{len(pids)}} process(es) left by its step\\n")
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.1)
sys.exit(rc)
'''

RAY = '''#!{python}
import os, signal, socket, subprocess, sys


def free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


node = int(os.environ["SLURM_NODEID"])
child = None
signal.signal(signal.SIGTERM, lambda s, _: child and child.send_signal(s))
for attempt in range(3):
    ports = [f"--{{p}}-port={{free()}}" for p in ("node-manager", "object-manager", "metrics-export",
                                                 "dashboard-agent-listen", "dashboard-agent-grpc", "runtime-env-agent")]
    if "--head" in sys.argv:
        ports.append(f"--ray-client-server-port={{free()}}")
    cmd = [sys.executable, "-m", "ray.scripts.scripts", *sys.argv[1:], "--node-ip-address=127.0.0.1",
           f"--temp-dir={{os.environ['FAKE_DIR']}}/n{{node}}", *ports]
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(f"ray on node {{node}}: {{' '.join(sys.argv[1:])}}\\n")
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    slow = False
    for line in child.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        slow = slow or "timed out during startup" in line
    rc = child.wait()
    if not slow:
        sys.exit(rc)
sys.exit(rc)
'''

SCONTROL = ('#!/bin/bash\necho "scontrol $*" >> "$FAKE_LOG"\n'
            '[[ "$1 $2" == "show hostnames" ]] && printf "%s\\n" $FAKE_NODES\nexit 0\n')

RECIPE = """# the tiny run on two nodes: the generator where gen_node is, the trainer where trn_node is
defaults:
  - digen
  - _self_
hydra:
  searchpath:
    - pkg://verl_digen.config
model: {dtype: float64, latent_size: 8, lora_rank: 2}
rollout: {num_steps: 3, train_steps: 2, n: 2, micro_batch_size: 2}
data: {train_batch_size: 2}
trainer: {total_steps: 2, save_freq: 2, progress: false, logger: [console]}
resources:
  generator: {workers: 1, node_resource: gen_node}
  trainer: {workers: 1, node_resource: trn_node}
digen: {sync: {backend: collective}}
"""


def _job_processes(marker: str) -> list[str]:
    """Live processes whose environment carries ``marker`` (every process the job started inherits it)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:150]
        except OSError:
            continue
        if state != "Z":
            found.append(f"{entry.name}: {cmd}")
    return found


def test_the_sbatch_script_runs_a_two_node_job_placing_generator_and_trainer_on_different_nodes(tmp_path):
    fake = Path(tempfile.mkdtemp(prefix="dg2n-"))  # short: Ray's socket paths live under the nodes' temp dirs
    marker = f"DIGEN_FAKE_JOB={uuid.uuid4().hex}"
    try:
        _run_job(tmp_path, fake, marker)
    finally:
        for line in _job_processes(marker):  # a failed run's leftovers (a passing one has none)
            try:
                os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(fake, ignore_errors=True)


def _run_job(tmp_path: Path, fake: Path, marker: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"srun": SRUN, "ray-node": RAY, "scontrol": SCONTROL}.items():
        (bin_dir / name).write_text(text.format(python=sys.executable) if name != "scontrol" else text)
        (bin_dir / name).chmod(0o755)
    digen_dir = tmp_path / "digen"
    (digen_dir / "recipes").mkdir(parents=True)
    (digen_dir / "recipes" / "tiny2node.yaml").write_text(RECIPE)
    out_dir, log = tmp_path / "out", fake / "log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM_"))}
    env.update({
        "PATH": f"{bin_dir}:{env['PATH']}", "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
        "DIGEN_FAKE_JOB": marker.split("=", 1)[1], "FAKE_LOG": str(log), "FAKE_DIR": str(fake),
        "FAKE_NODES": " ".join(NODES), "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "42",
        "RECIPE": "tiny2node", "DIGEN_DIR": str(digen_dir), "OUTPUT_DIR": str(out_dir), "PYTHON": sys.executable,
        "RAY": str(bin_dir / "ray-node"), "HEAD_IP": "127.0.0.1", "HEAD_WAIT_S": "2", "JOIN_TIMEOUT_S": "300",
        "RAY_PORT": str(_free_port()), "RAY_START_ARGS": "--num-cpus=2",
        "NODE_RESOURCES": '{"gen_node": 1};{"trn_node": 1}', "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
    })
    job_out = tmp_path / "job.out"
    started = time.monotonic()
    with open(job_out, "w") as out:
        proc = subprocess.Popen(["bash", str(SBATCH), "hydra.run.dir=" + str(tmp_path / "hydra")], env=env,
                                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(timeout=JOB_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ended = time.monotonic()
    text = job_out.read_text(errors="replace")
    fake_log = log.read_text() if log.exists() else ""
    assert rc == 0, f"{text[-5000:]}\n{fake_log}"
    print(f"the 2-node job took {ended - started:.1f} s; the stand-ins' log:\n{fake_log}")
    # both nodes joined, each with its own resource, and the run joined that cluster
    assert "all 2 node(s) joined the Ray cluster" in text and "(2 node(s)), from RAY_ADDRESS" in text, text[-5000:]
    assert "ray on node 0: start --head" in fake_log and '--resources={"gen_node": 1}' in fake_log, fake_log
    assert "ray on node 1: start --block --address=" in fake_log and '--resources={"trn_node": 1}' in fake_log
    assert "step 2/2" in text and "scontrol requeue" not in fake_log, text[-5000:]
    assert ckpt_steps(out_dir / "checkpoints" / "tiny2node") == [2], text[-5000:]
    # the generator and the trainer ran on different nodes: every weight pickup crossed nodes (the sync group
    # records each member's Ray node and counts a peer elsewhere as inter-node)
    events = json.loads((out_dir / "trace" / "tiny2node" / "digen_trace.json").read_text())["traceEvents"]
    moved = [e["args"]["bytes"] for e in events if e.get("cat") == "weight_sync"]
    assert moved and all(m.get("inter_node", 0) > 0 and not m.get("intra_node") for m in moved), moved
    # ... each pool on the node that advertises its resource: a Ray worker's log (in its node's temp dir) names
    # the actor it hosts
    assert _actors_by_node(fake) == {0: {"GeneratorWorker"}, 1: {"HybridWorker"}}, fake_log
    # per-pool cost profiles are kept apart: each pool's hardware, named by its resource, is fitted from its own
    # workers (one hardware type would pool both pools' samples into one fit)
    profile = json.loads((out_dir / "trace" / "tiny2node" / "digen_profile.json").read_text())
    gen, trn = profile["generator"]["hardware"], profile["trainer"]["hardware"]
    assert (gen["name"], trn["name"]) == ("gen_node", "trn_node") and gen["generate"] != trn["generate"], profile
    # nothing the job started outlives it by 5 s (Ray's GCS, raylets, agents and workers on both "nodes"): every
    # process it started inherits the marker, so once none is alive none can appear, and the check ends there
    while left := _job_processes(marker):
        assert time.monotonic() < ended + 5.0, f"processes alive 5 s after the job ended: {left}\n{fake_log}"
        time.sleep(0.1)


def _actors_by_node(fake: Path) -> dict[int, set[str]]:
    """Fake node index -> the actor classes its Ray workers hosted (Ray writes ``:actor_name:<class>`` at the
    top of an actor's worker log, under the temp dir of the node it runs on)."""
    found: dict[int, set[str]] = {}
    for log in fake.glob("n*/session_*/logs/worker-*.out"):
        node = int(log.relative_to(fake).parts[0][1:])
        names = {line.split(":actor_name:", 1)[1].strip() for line in log.read_text(errors="replace").splitlines()
                 if line.startswith(":actor_name:")}
        found.setdefault(node, set()).update(names)
    return {node: names for node, names in found.items() if names}


def ckpt_steps(root: Path) -> list[int]:
    from verl_digen.workers import checkpoint as ckpt

    return [s for s, _ in ckpt.complete_checkpoints(root)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
