"""Shared settings of the runtime tests (a plain module, importable from the subprocess script too)."""

from verl_digen.config import RunConfig, compose

#: a tiny float64 run: 2 prompts x 2 samples, 3 sampling steps of which 2 are trained
TINY = [
    "model.dtype=float64", "model.latent_size=8", "rollout.num_steps=3", "rollout.train_steps=2",
    "data.train_batch_size=2", "rollout.n=2", "rollout.micro_batch_size=2", "trainer.total_steps=1",
    "trainer.progress=false", "trainer.logger=[]",
]


def compose_run(*overrides: str, tmp_path=None) -> RunConfig:
    """The tiny run with ``overrides``; outputs under ``tmp_path`` when given."""
    extra = []
    if tmp_path is not None:
        extra = [f"trainer.trace_dir={tmp_path}/trace", f"trainer.default_local_dir={tmp_path}/ckpt"]
    return compose([*TINY, *extra, *overrides])


def train(cfg: RunConfig):
    """Run ``cfg`` through the Ray runtime; returns (result, rank 0's trained parameters)."""
    from verl_digen.driver.runtime import DigenRuntime  # not at import: the subprocess script needs no runtime

    trainer = DigenRuntime(cfg, log=lambda _: None)
    try:
        result = trainer.fit()
        params = trainer.trn_wg.full_state()[0]["params"]
    finally:
        trainer.shutdown()
    return result, params
