"""Worker-side policy helpers without Ray: identical policies per config, weight export/import."""

import pytest
import torch
from workers_helpers import tiny_cfg

from verl_digen.workers import policy as P


@pytest.mark.parametrize("lora", [0, 2])
def test_same_config_same_weights_whatever_the_global_rng(lora):
    cfg = tiny_cfg(lora_rank=lora)
    a = P.weights_checksum(P.policy_weights(P.build_policy(cfg), bool(lora)))
    torch.manual_seed(1234)
    torch.randn(100)
    b = P.weights_checksum(P.policy_weights(P.build_policy(cfg), bool(lora)))
    assert a == b


def test_lora_export_is_adapter_only_and_round_trips():
    cfg = tiny_cfg(lora_rank=2)
    src, dst = P.build_policy(cfg), P.build_policy(cfg)
    with torch.no_grad():
        for name, p in src.transformer.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)
    state = P.policy_weights(src, lora=True)
    assert state and all("lora_" in k for k in state)
    assert P.weights_checksum(state) != P.weights_checksum(P.policy_weights(dst, lora=True))
    P.load_policy_weights(dst, state, lora=True)
    assert P.weights_checksum(state) == P.weights_checksum(P.policy_weights(dst, lora=True))
    with pytest.raises(ValueError, match="missing"):
        P.load_policy_weights(dst, {k: v for k, v in list(state.items())[1:]}, lora=True)


def test_full_export_mismatch_is_an_error():
    model = P.build_policy(tiny_cfg())
    state = P.policy_weights(model, lora=False)
    state.pop(next(iter(state)))
    with pytest.raises(ValueError, match="do not match the policy"):
        P.load_policy_weights(model, state, lora=False)


def test_rows_need_one_prompt_each():
    with pytest.raises(ValueError, match="one prompt per row"):
        P.check_rows([(0, 0), (0, 1)], ["a"])


def test_vllm_backend_without_vllm_names_the_extra():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed here")
    from verl_digen.workers.vllm_backend import build_rollout_backend

    cfg = tiny_cfg(rollout_backend="vllm")
    with pytest.raises(ImportError, match=r"pip install verl-digen\[vllm\]"):
        build_rollout_backend(cfg)
