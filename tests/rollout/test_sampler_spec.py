"""``algo/sampling.py``'s ``SamplerSpec`` is the sampler without torch: ``RunConfig.trained_steps`` (what a dry run
reads) and the rollout's ``SamplerConfig`` hold the same settings and give the same K or the same error."""

from __future__ import annotations

import dataclasses

import pytest

from verl_digen.algo.sampling import SamplerSpec
from verl_digen.config import compose
from verl_digen.rollout.sampler import SamplerConfig


@pytest.mark.parametrize("overrides", [
    [], ["algorithm.name=mix_grpo", "rollout.selection=window", "rollout.train_steps=2"],
    ["algorithm.name=diffusion_nft"], ["rollout.sde_type=cps", "rollout.cps_log_prob=squared_error"],
    ["rollout.noise_level=0"],
])
def test_the_spec_and_the_sampler_agree(overrides):
    cfg = compose(overrides)
    spec, sampler = cfg.sampler_spec(), cfg.sampler()
    assert type(sampler) is SamplerConfig and isinstance(sampler, SamplerSpec)
    assert dataclasses.astuple(spec) == dataclasses.astuple(sampler)
    outcomes = []
    for s in (spec, sampler, cfg):
        try:
            outcomes.append(s.trained_steps() if s is cfg else s.validate())
        except ValueError as err:
            outcomes.append(str(err))
    assert outcomes[0] == outcomes[1] == outcomes[2]


def test_the_sampler_adds_no_setting_of_its_own():
    assert [f.name for f in dataclasses.fields(SamplerConfig)] == [f.name for f in dataclasses.fields(SamplerSpec)]
    assert SamplerConfig() == SamplerConfig.of(SamplerSpec())
