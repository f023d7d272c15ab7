"""Ulysses sequence parallelism (``models/ulysses.py``): two ranks equal one rank at float64.

For the tiny Wan2.1 and HunyuanVideo (joint attention with a padded text mask), two gloo ranks that each
hold half of the video tokens give the one-process velocity on both ranks, and their parameter gradients
sum to the one-process gradient (what the trainer's FSDP2 sum over ranks does), to 1e-10. The one
exception is upstream's: Wan's blocks add the time embedding to their modulation table as ``temb.float()``,
so its layers' gradients are summed over the tokens in float32 and two halves summed apart round
differently (~1e-8 relative); those layers (the plan's ``float32_reduced``) are held to 1e-6. Also with activation
checkpointing (the recompute runs the all-to-alls again) and with LoRA. The two-rank cases run in one
spawned gloo group (no Ray) whose rank 0 writes its results to a file.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from two_ranks import run_on_two_ranks

from verl_digen.models import apply_lora, build_tiny_model
from verl_digen.models.ulysses import enable_sequence_parallel, plan_for, size_problem, video_tokens

CASES = {  # name: (arch, activation checkpointing, LoRA rank)
    "wan": ("wan", False, 0),
    "wan-checkpointed": ("wan", True, 0),
    "hunyuan_video": ("hunyuan_video", False, 0),
    "hunyuan_video-lora": ("hunyuan_video", False, 2),
}


def _run(arch: str, checkpointing: bool, lora: int, group=None) -> dict:
    """Velocity and parameter gradients of one forward/backward of the tiny ``arch`` (float64)."""
    torch.manual_seed(0)
    model = build_tiny_model(arch, dtype=torch.float64, latent_size=8)
    if lora:
        apply_lora(model, rank=lora, init_lora_weights="gaussian")
    if checkpointing:
        model.transformer.enable_gradient_checkpointing()
    model.transformer.train()
    if group is not None:
        enable_sequence_parallel(model, group)
    g = torch.Generator().manual_seed(1)
    x = torch.randn((2, *model.latent_shape), generator=g, dtype=torch.float64)
    weight = torch.randn(x.shape, generator=g, dtype=torch.float64)
    cond = model.encode_prompts(["a cat", "a dog runs far"])  # text masks of 3 and 5 valid tokens
    v = model.velocity(x, torch.tensor([0.9, 0.4], dtype=torch.float64), cond, guidance_scale=3.0)
    (v * weight).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.transformer.named_parameters() if p.grad is not None}
    return {"velocity": v.detach(), "grads": grads}


def _two_rank_main(rank: int, world: int) -> dict:
    group = dist.new_group(list(range(world)))
    res = {}
    for name, (arch, checkpointing, lora) in CASES.items():
        got = _run(arch, checkpointing, lora, group)
        for grad in got["grads"].values():  # the trainer's FSDP2 sums the ranks' gradients
            dist.all_reduce(grad)
        peer = [torch.empty_like(got["velocity"]) for _ in range(2)]
        dist.all_gather(peer, got["velocity"])
        res[name] = {"velocity": peer, "grads": got["grads"]}
    return res


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_on_two_ranks(_two_rank_main, tmp_path_factory.mktemp("ulysses"))


@pytest.mark.slow  # two spawned processes (about 10 s): not the fast tier's "in this process"
@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_equal_one_rank(two_ranks, name):
    want, got = _run(*CASES[name]), two_ranks[name]
    for rank, velocity in enumerate(got["velocity"]):
        torch.testing.assert_close(velocity, want["velocity"], rtol=1e-12, atol=1e-12, msg=f"velocity on rank {rank}")
    assert want["grads"].keys() == got["grads"].keys() and want["grads"]
    if CASES[name][2]:
        assert all("lora" in n for n in want["grads"]), "LoRA trains the adapters only"
    float32_reduced = plan_for(CASES[name][0]).float32_reduced
    for n, grad in want["grads"].items():
        tol = 1e-6 if n.startswith(float32_reduced) else 1e-10  # relative to the tensor's largest entry
        err = (got["grads"][n] - grad).abs().max().item()
        assert err <= tol * grad.abs().max().item() + 1e-14, f"gradient of {n} differs by {err:.3g}"


def test_size_problem_names_what_the_size_must_divide():
    assert size_problem("wan", heads=40, tokens=75600, size=8) is None
    assert "40 attention heads" in size_problem("wan", heads=40, tokens=75600, size=3)
    assert "75601 video tokens" in size_problem("wan", heads=40, tokens=75601, size=2)
    assert size_problem("flux", heads=24, tokens=4096, size=2).startswith("1 for model.arch=flux")


def test_video_tokens_of_wan_720p():
    # 81 frames at 1280x720: latents of 21 x 90 x 160 (VAE 4x temporal, 8x spatial), patches of 1x2x2
    assert video_tokens((16, 21, 90, 160), patch=2, patch_t=1) == 75600


@pytest.mark.parametrize("world,size", [(4, 2), (6, 3), (4, 1), (4, 4)])
def test_sequence_groups_are_consecutive_ranks_and_the_data_rank_is_the_group_index(monkeypatch, world, size):
    """Each rank's Ulysses group is its run of ``size`` consecutive ranks, and its data-parallel rank the index
    of that group: ranks of one group must train the same rows (a data rank of ``rank % size`` would give them
    different rows, and their collectives would wait for each other forever). Checked on every rank of a
    recorded ``new_group``, so a wrong answer fails here instead of hanging a multi-process test."""
    from verl_digen.models import ulysses

    for rank in range(world):
        made: list[tuple[int, ...]] = []
        monkeypatch.setattr(ulysses.dist, "get_rank", lambda r=rank: r)
        monkeypatch.setattr(ulysses.dist, "get_world_size", lambda group=None: world)
        monkeypatch.setattr(ulysses.dist, "new_group", lambda ranks, m=made: m.append(tuple(ranks)) or tuple(ranks))
        group, dp_rank, dp_world = ulysses.sequence_groups(size)
        assert made == [tuple(range(s, s + size)) for s in range(0, world, size)]  # every rank makes every group
        assert rank in group and group == made[dp_rank]
        assert (dp_rank, dp_world) == (rank // size, world // size)
        assert isinstance(dp_rank, int) and isinstance(dp_world, int)  # sizes and slice bounds downstream
    for bad in (0, world + 1, 5):
        if bad < 1 or world % bad:
            with pytest.raises(ValueError, match=f"ulysses_sequence_parallel_size={bad} must divide the {world}"):
                ulysses.sequence_groups(bad)


def _one_rank_never_joins(rank: int, world: int) -> None:
    if rank == 1:
        import time

        time.sleep(3600)  # rank 0 waits for it in the closing barrier: a hung collective


@pytest.mark.slow
def test_a_hung_collective_fails_the_test_instead_of_hanging_the_suite(tmp_path):
    import time

    from two_ranks import run_on_two_ranks

    start = time.monotonic()
    with pytest.raises(TimeoutError, match="a collective hung"):
        run_on_two_ranks(_one_rank_never_joins, tmp_path, timeout_s=10)  # ranks start in ~3 s when idle
    assert time.monotonic() - start < 60
