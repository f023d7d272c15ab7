"""Heterogeneous placement check, run as a subprocess by test_runtime.py (it needs its own cluster).

Starts a two-node local Ray cluster whose nodes advertise custom resources ``nodeA`` / ``nodeB``
(standing in for two GPU types), runs one digen step with the generator pool on ``nodeA`` and the
trainer pool on ``nodeB``, and prints a JSON report: which node each worker ran on and the per-pool
profile the run measured.
"""

import json
import os
import sys

os.environ["VERL_PLATFORM"] = "cpu"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from runtime_helpers import compose_run  # noqa: E402

from verl_digen.driver.runtime import DigenRuntime  # noqa: E402


def node_of(actor) -> str:
    return ray.get(actor.execute_func_rank_zero.remote(lambda: ray.get_runtime_context().get_node_id()))


def main(tmp: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"nodeA": 2}})
    cluster.add_node(num_cpus=2, resources={"nodeB": 2})
    ray.init(address=cluster.address, runtime_env={"env_vars": {"VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "1"}},
             log_to_driver=False)
    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    node_a = next(i for i, r in nodes.items() if "nodeA" in r)
    node_b = next(i for i, r in nodes.items() if "nodeB" in r)
    cfg = compose_run("resources.generator.node_resource=nodeA", "resources.trainer.node_resource=nodeB",
                      "digen.tag.policy=static:1", f"trainer.trace_dir={tmp}/trace",
                      f"trainer.default_local_dir={tmp}/ckpt")
    trainer = DigenRuntime(cfg, log=lambda _: None)
    try:
        result = trainer.fit()
        report = {
            "node_a": node_a,
            "node_b": node_b,
            "generator_nodes": [node_of(w) for w in trainer.gen_wg.workers],
            "trainer_nodes": [node_of(w) for w in trainer.trn_wg.workers],
            "profile": json.loads(open(result.profile_path).read()),
        }
    finally:
        trainer.shutdown()
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
