"""The errors ``run_pools.lost_rendezvous_port`` tells apart, made for real without Ray: torch's store failing to bind
a port another socket holds, as a worker raises it and as the driver receives it through Ray. The run that starts
its groups again: test_reliability_runtime.py."""

from __future__ import annotations

import socket

import pytest
import ray
import torch.distributed as dist

from verl_digen.driver.run_pools import lost_rendezvous_port


@pytest.fixture
def held_port():
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        yield s.getsockname()[1]


def _bind_error(port: int) -> BaseException:
    with pytest.raises(dist.DistNetworkError) as err:
        dist.TCPStore("127.0.0.1", port, 1, True, wait_for_workers=False)
    return err.value


def test_a_store_that_cannot_bind_its_port_is_a_lost_port_raised_in_the_worker_or_through_ray(held_port):
    err = _bind_error(held_port)
    assert lost_rendezvous_port(err) == held_port
    through_ray = ray.exceptions.RayTaskError("init_model", "traceback", err).as_instanceof_cause()
    assert lost_rendezvous_port(through_ray) == held_port


def test_other_errors_are_not_a_lost_port():
    assert lost_rendezvous_port(dist.DistNetworkError("connection refused: ECONNREFUSED")) is None
    assert lost_rendezvous_port(RuntimeError("EADDRINUSE, port: 1234")) is None  # not a rendezvous
    assert lost_rendezvous_port(ray.exceptions.RayTaskError("f", "tb", ValueError("x")).as_instanceof_cause()) is None
