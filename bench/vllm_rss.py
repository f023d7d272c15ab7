"""Host memory of a generator process across weight updates with ``rollout.backend=vllm`` (issue 43's target: the
process holds one copy of the policy, the engine's). Runs in the vLLM tier's venv on the CPU hooks
(``/tmp/verl-digen-vllm-venv/bin/python bench/vllm_rss.py``): an SD3 checkpoint whose transformer is >= 200 MB
(float32), one engine, three full-weight updates (each a fresh state, as a pickup hands it over, dropped after).
Prints one JSON line: the model's bytes and the process's resident memory (``/proc/self/status`` VmRSS) before the
first update and after each, and the growth after three updates over the model. Run it with
``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc hands freed tensors back to the OS (with its default, dynamic
threshold the pages of a dropped state stay in the heap and RSS counts them although nothing holds them).
``--bucket-mb`` sets ``digen.sync.bucket_mb`` (the chunks an update goes into the engine in)."""

from __future__ import annotations

import gc
import json
import sys
import tempfile
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parent.parent / "tests" / "workers"


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bucket-mb", type=int, default=2048)
    ap.add_argument("--json", action="store_true", help="accepted for the benches' interface: the figures are "
                    "always one JSON line, the last")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(TESTS))
    import diffusers
    import vllm_cpu_platform
    from vllm_engine_helpers import save_tiny_sd3

    from verl_digen.algo.selection import StepSelection
    from verl_digen.models.arch import MODEL_REGISTRY
    from verl_digen.rollout.sampler import SamplerConfig
    from verl_digen.workers.config import PolicyConfig, WorkerConfig
    from verl_digen.workers.vllm_backend import VllmOmniRollout

    vllm_cpu_platform.install()
    with tempfile.TemporaryDirectory(prefix="digen_vllm_rss_") as tmp:
        ckpt = save_tiny_sd3(Path(tmp) / "sd3", seed=0)
        kwargs = {**MODEL_REGISTRY["sd3"].tiny.transformer_kwargs, "num_layers": 8, "num_attention_heads": 8,
                  "attention_head_dim": 64, "caption_projection_dim": 512}
        big = diffusers.SD3Transformer2DModel(**kwargs)
        big.save_pretrained(str(Path(ckpt) / "transformer"))
        names_shapes = {k: (v.shape, v.dtype) for k, v in big.state_dict().items()}
        model_bytes = sum(v.numel() * v.element_size() for v in big.state_dict().values())
        del big
        gc.collect()
        sampler = SamplerConfig(num_steps=2, shift=3.0, sde="flow_grpo", eta=0.7, guidance_scale=1.0,
                                selection=StepSelection("first_k", k=1), decode=False)
        cfg = WorkerConfig(policy=PolicyConfig(arch="sd3", pretrained=ckpt, dtype="float32", latent_size=8),
                           sampler=sampler, seed=1, rollout_backend="vllm", vllm_max_batch=2,
                           sync_bucket_mb=args.bucket_mb)
        backend = VllmOmniRollout(cfg, "cpu")
        backend.generate(1, 0, [0, 1], [0, 0], ["a red cube", "two cats"])
        gc.collect()
        rss = {"before_updates": rss_bytes()}
        gen = torch.Generator().manual_seed(0)
        for version in (1, 2, 3):
            state = {k: torch.empty(shape, dtype=dtype).normal_(0.0, 0.02, generator=gen)
                     for k, (shape, dtype) in names_shapes.items()}
            backend.load_weights(version, state)
            del state
            gc.collect()
            rss[f"after_update_{version}"] = rss_bytes()
        backend.generate(1, 3, [0, 1], [0, 0], ["a red cube", "two cats"])
        backend.close()
        backend.engine.close()
    growth = rss["after_update_3"] - rss["after_update_1"]
    print(json.dumps({"bucket_mb": args.bucket_mb, "model_bytes": model_bytes, "rss_bytes": rss,
                      "growth_after_3_updates_over_model": round(growth / model_bytes, 3),
                      "first_update_growth_over_model": round((rss["after_update_1"] - rss["before_updates"])
                                                              / model_bytes, 3)}))


if __name__ == "__main__":
    main()
