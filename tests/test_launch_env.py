"""What the launcher said (reference_train/launch_env.py): the world size it
asked for, the backend MLX picks from its variables, and which backends have
a reduce-scatter. The variables are the ones mlx.launch and mpirun set (each
backend's run in the lab and tests/test_train_*.py start real launches)."""

from __future__ import annotations

import pytest

from reference_train.launch_env import expected_world_size, has_sum_scatter, launched_backend


def test_launcher_world_size_from_environment(tmp_path):
    assert expected_world_size({}) is None
    hostfile = tmp_path / "h.json"
    hostfile.write_text('[["127.0.0.1:5000"], ["127.0.0.1:5001"], ["127.0.0.1:5002"]]')
    assert expected_world_size({"MLX_HOSTFILE": str(hostfile)}) == 3
    assert expected_world_size({"MLX_HOSTFILE": str(hostfile), "OMPI_COMM_WORLD_SIZE": "4"}) == 4
    hostfile.write_text("not json")
    assert expected_world_size({"MLX_HOSTFILE": str(hostfile)}) is None


@pytest.mark.parametrize(("env", "cuda", "backend"), [
    ({"MLX_HOSTFILE": "/tmp/h.json", "MLX_RANK": "1"}, False, "ring"),  # mlx.launch --backend ring
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}, False, "mpi"),  # mpirun
    ({"MLX_IBV_DEVICES": "/tmp/d.json", "MLX_JACCL_COORDINATOR": "10.0.0.1:5000",
      "MLX_RANK": "0"}, False, "jaccl"),                                # mlx.launch --backend jaccl
    ({"MLX_RANK": "0", "MLX_WORLD_SIZE": "2", "NCCL_HOST_IP": "10.0.0.1"}, True, "nccl"),
    ({"MLX_RANK": "0", "MLX_WORLD_SIZE": "2"}, False, "none"),          # nccl's env, no CUDA
    ({}, False, "none"),
])
def test_the_backend_is_read_from_the_launch(env, cuda, backend):
    assert launched_backend(env, cuda) == backend


def test_only_jaccl_and_nccl_are_asked_for_a_reduce_scatter():
    assert not has_sum_scatter("ring", "0.32.4") and not has_sum_scatter("mpi", "0.32.4")
    assert not has_sum_scatter("jaccl", "0.32.0") and has_sum_scatter("jaccl", "0.32.1")
    assert has_sum_scatter("nccl", "0.30.0") and has_sum_scatter("jaccl", "0.33.0.dev20261101")
    assert not has_sum_scatter("none", "0.32.4")
