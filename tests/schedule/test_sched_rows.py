"""The row plan (``schedule.rows``) the trainer runs and the cost model prices."""

import math

import pytest

from verl_digen.schedule.costs import passes
from verl_digen.schedule.rows import row_plan


@pytest.mark.parametrize("samples", [1, 3, 8, 13])
@pytest.mark.parametrize("steps", [1, 2, 5])
@pytest.mark.parametrize("ranks", [1, 2, 3, 7, 40])
@pytest.mark.parametrize("degree,cap", [(None, None), (1, None), (2, None), (None, 1), (1, 3)])
def test_every_row_once_equal_pass_counts_and_the_priced_passes(samples, steps, ranks, degree, cap):
    plan = row_plan(samples, steps, ranks, degree, cap)
    order = plan.order()
    assert sorted(order) == [(s, j) for s in range(samples) for j in range(steps)]
    spans = [plan.rank_passes(r) for r in range(ranks)]
    assert {len(s) for s in spans} == {plan.passes}  # every rank runs the same number of passes
    trained = [i for s in spans for p in s for i in p]
    assert sorted(trained) == list(range(len(order)))  # each row on exactly one rank, in one pass
    assert all(len(p) <= plan.cap for s in spans for p in s)
    sizes = [len(plan.share(r)) for r in range(ranks)]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) == plan.most_rows
    loaded = max(range(ranks), key=lambda r: len(plan.share(r)))
    assert plan.pass_rows() == [len(p) for p in spans[loaded] if len(p)]  # what the cost model prices


@pytest.mark.parametrize("samples,steps,degree", [(4, 4, 1), (4, 4, 3), (3, 5, None), (2, 6, 4)])
def test_one_rank_with_the_default_cap_runs_the_tsp_passes(samples, steps, degree):
    """One rank, default cap: the passes are TSP's ``ceil(K / degree)`` chunks of whole steps."""
    plan = row_plan(samples, steps, 1, degree)
    assert plan.pass_rows() == [samples * d for d in passes(steps, degree or steps)]
    order = plan.order()
    for span, d in zip(plan.rank_passes(0), passes(steps, degree or steps)):
        assert {s for s, _ in (order[i] for i in span)} == set(range(samples))  # all samples, d steps each
        assert len({j for _, j in (order[i] for i in span)}) == d


def test_more_ranks_than_rows_pads_and_prices_one_row():
    plan = row_plan(1, 2, 5)
    assert plan.passes == 1 and plan.pass_rows() == [1]
    assert [len(plan.rank_passes(r)[0]) for r in range(5)] == [1, 1, 0, 0, 0]
    assert math.ceil(plan.rows / plan.ranks) == plan.most_rows


@pytest.mark.parametrize("bad", [dict(samples=0), dict(ranks=0), dict(degree=0), dict(cap=0)])
def test_bad_plans_name_the_field(bad):
    args = dict(samples=2, steps=2, ranks=1, degree=None, cap=None) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        row_plan(**args)


def test_the_default_cap_rounds_a_ranks_share_of_a_chunk_up():
    """Default cap ``ceil(S * degree / ranks)``: more ranks never add passes (at most TSP's ``ceil(K / degree)``
    chunks); a cap rounded down would split a rank's share of a chunk into an extra pass."""
    plan = row_plan(3, 4, 2, 1)  # 3 samples x 1 step per chunk over 2 ranks: 1.5 rows each, so 2 per pass
    assert (plan.cap, plan.passes, plan.pass_rows()) == (2, 3, [2, 2, 2])
    for samples in range(1, 9):
        for steps in range(1, 6):
            for ranks in range(1, 8):
                for degree in range(1, steps + 1):
                    plan = row_plan(samples, steps, ranks, degree)
                    assert plan.cap == -(-samples * degree // ranks)
                    assert plan.passes <= -(-steps // degree), (samples, steps, ranks, degree)
