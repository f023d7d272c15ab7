"""TAG's context switch on one trainer rank (workers/switch.py): the training state leaves and comes back
bit-identical, without Ray (the same functions bench/gpu_check.py times on a GPU)."""

import torch

from verl_digen.models import build_tiny_model
from verl_digen.workers import switch


def _trained_state():
    torch.manual_seed(0)
    model = build_tiny_model("flux", dtype=torch.float32, latent_size=8)
    params = [(n, p) for n, p in model.transformer.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in params], lr=1e-3)
    for _ in range(2):  # a step (AdamW state exists), then gradients accumulated for the next one
        for _, p in params:
            p.grad = torch.randn_like(p)
        if not opt.state:
            opt.step()
    return params, opt


def test_stash_frees_the_training_state_and_restore_brings_it_back_bit_identical():
    params, opt = _trained_state()
    grads = {n: p.grad.clone() for n, p in params}
    state = {n: {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()} for n, p in params}
    stashed = switch.TrainingStash()
    switch.stash(params, opt, torch.device("cpu"), stashed)
    assert stashed and all(p.grad is None for _, p in params) and not opt.state  # the live tensors are gone
    switch.restore(params, opt, torch.device("cpu"), stashed)
    assert not stashed
    for n, p in params:
        assert torch.equal(p.grad, grads[n])
        assert opt.state[p].keys() == state[n].keys()
        for k, v in state[n].items():
            assert torch.equal(opt.state[p][k], v) if torch.is_tensor(v) else opt.state[p][k] == v
    switch.move_optimizer_state(opt, "cpu")  # the optimizer offload's move: every state tensor, in place
    assert all(v.device.type == "cpu" for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
