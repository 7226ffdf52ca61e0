"""What launched the process, and what the plan says about the launch (from the mutation pass,
docs/mutation-plan.md): each launcher's variables, the Ray driver, the ranks of this node, and the layouts that
would hang.
"""

from __future__ import annotations

import pytest

from project.errors import UserError
from project.plan.environment import (
    LaunchEnvironment,
    detect_environment,
    refuse_stray_rank,
    requested_launcher,
)
from project.plan.launch_notes import describe_launch
from project.plan.launchers import read_int
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

RAY_ENV = "ray.train.lightning.RayLightningEnvironment"
KUBEFLOW_ENV = "lightning.pytorch.plugins.environments.KubeflowEnvironment"
POD = {
    "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "3",
    "RANK": "2",
}


def plan(environment: LaunchEnvironment, gpus: int = 0, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), environment, 64)


# --- detection ---------------------------------------------------------------------------------------------------


def test_lightnings_launcher_reads_the_address_port_and_ranks():
    env = detect_environment(
        {
            "MASTER_ADDR": "10.1.2.3",
            "MASTER_PORT": "29500",
            "RAY_ADDRESS": "ray://head:10001",
            "WORLD_SIZE": "8",
            "RANK": "5",
            "LOCAL_RANK": "1",
            "NODE_RANK": "2",
        }
    )
    assert env == LaunchEnvironment(
        launcher="lightning",
        external=False,
        world_size=8,
        rank=5,
        local_rank=1,
        node_rank=2,
        master_addr="10.1.2.3",
        master_port=29500,
        address="ray://head:10001",
    )
    assert detect_environment({"RAY_ADDRESS": ""}).address is None


def test_detection_reads_this_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "29511")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert detect_environment().master_port == 29511


def test_a_ray_train_worker_reads_its_placement():
    env = detect_environment(
        {
            "RAY_RAYLET_PID": "7",
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "NODE_RANK": "1",
        }
    )
    assert (env.launcher, env.external, env.cluster_environment) == ("ray", True, RAY_ENV)
    fields = (env.world_size, env.local_world_size, env.num_nodes, env.rank, env.local_rank, env.node_rank)
    assert fields == (4, 2, 2, 3, 1, 1)
    assert type(env.num_nodes) is int


def test_an_uneven_placement_has_no_node_count():
    uneven = {
        "RAY_RAYLET_PID": "7",
        "RANK": "0",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "0",
    }
    assert detect_environment(uneven).num_nodes is None


def test_a_kubeflow_pod_is_one_process_and_one_node():
    env = detect_environment(POD)
    assert (env.launcher, env.external, env.cluster_environment) == ("kubeflow", True, KUBEFLOW_ENV)
    fields = (env.world_size, env.local_world_size, env.num_nodes, env.rank, env.local_rank, env.node_rank)
    assert fields == (3, 1, 3, 2, 0, 2)


@pytest.mark.parametrize(
    "environ",
    [
        {k: v for k, v in POD.items() if k != "KUBERNETES_SERVICE_HOST"},  # the same variables outside a pod
        {**POD, "LOCAL_RANK": "0"},  # a launcher inside the pod started this process
        {k: v for k, v in POD.items() if k != "MASTER_PORT"},  # not what the training operator sets
    ],
)
def test_what_is_not_a_kubeflow_pod(environ):
    assert detect_environment(environ).launcher == "lightning"


def test_slurm_reads_the_node_count_and_node_id_under_either_name():
    env = detect_environment(
        {"SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NAME": "train"}
    )
    assert (env.launcher, env.num_nodes, env.node_rank) == ("slurm", 2, 1)
    assert detect_environment({"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "interactive"}).launcher == "lightning"


def test_torchrun_reads_its_restarts_and_store():
    base = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    env = detect_environment({**base, "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert (env.max_restarts, env.agent_store) == (3, True)
    env = detect_environment({**base, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"})
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 29400)
    env = detect_environment({**base, "TORCHELASTIC_USE_AGENT_STORE": "False"})
    assert (env.max_restarts, env.agent_store) == (None, False)


def test_one_mpi_process_is_not_an_mpi_launch():
    """Lightning's MPIEnvironment needs more than one process; so does the table."""
    assert detect_environment({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}).launcher == "lightning"


@pytest.mark.parametrize(("value", "number"), [("29500", 29500), ("2(x3)", 2), ("", None), ("abc", None)])
def test_a_variable_is_read_by_its_leading_number(value, number):
    assert read_int({"X": value}, "X") == number


# --- a RANK nobody set, and parallel.launcher: ray ---------------------------------------------------------------


def test_a_stray_rank_is_refused_and_a_launched_one_is_not():
    with pytest.raises(UserError) as info:
        refuse_stray_rank(detect_environment({"RANK": "3"}))
    assert str(info.value).startswith("RANK=3 is set in the environment, but no launcher started this process")
    assert "`unset RANK`" in str(info.value)
    refuse_stray_rank(detect_environment({"RANK": "0"}))
    refuse_stray_rank(detect_environment({"RANK": "3", "LOCAL_RANK": "1"}))  # a rank Lightning's launcher started
    refuse_stray_rank(detect_environment({"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "LOCAL_RANK": "1"}))


def test_launcher_ray_makes_this_process_the_driver():
    driver = requested_launcher("ray", detect_environment({"RAY_ADDRESS": "ray://head:10001", "NODE_RANK": "1"}))
    assert driver == LaunchEnvironment(launcher="ray", external=True, address="ray://head:10001")
    slurm = detect_environment({"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "train"})
    assert requested_launcher("ray", slurm).launcher == "ray"  # the allocation the Ray cluster runs in


def test_inside_a_ray_worker_launcher_ray_keeps_the_worker():
    worker = detect_environment(
        {
            "RAY_RAYLET_PID": "7",
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "NODE_RANK": "1",
        }
    )
    assert requested_launcher("ray", worker) == worker


def test_launcher_ray_under_torchrun_is_refused():
    torchrun = detect_environment({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(UserError) as info:
        requested_launcher("ray", torchrun)
    assert str(info.value).startswith("parallel.launcher=ray in a process that torchrun started")
    assert requested_launcher("auto", torchrun) == torchrun


@pytest.mark.parametrize(
    ("address", "where", "shown"),
    [(None, "a local Ray instance", "local"), ("ray://head:10001", "the Ray cluster at ray://head:10001", None)],
)
def test_the_ray_driver_plan_submits_a_job_of_the_planned_workers(address, where, shown):
    env = LaunchEnvironment(launcher="lightning", external=False, address=address)
    got = plan(env, scenario="cpu", devices=2, num_nodes=2, launcher="ray")
    assert got.launcher == "ray" and got.world_size == 4
    assert got.launch == {"workers": 4, "address": shown or address}
    assert f"ray: this command submits a Ray Train job of 4 worker(s) to {where} and waits" in got.notes[-1]


# --- the launch record and its notes -----------------------------------------------------------------------------


def test_the_launch_record_leaves_out_what_the_plan_shows_elsewhere():
    env = LaunchEnvironment(launcher="lightning", external=False, address="ray://head:10001")
    assert "address" not in plan(env, scenario="cpu", devices=2).launch


def test_one_process_has_no_launch_record():
    assert describe_launch(LaunchEnvironment(launcher="lightning", external=False), 1, 1) == ({}, [])


def test_the_ranks_of_this_node():
    env = LaunchEnvironment(
        launcher="lightning", external=False, node_rank=1, master_addr="10.0.0.1", master_port=29500
    )
    launch, notes = describe_launch(env, 2, 2)
    assert launch == {"node_rank": 1, "ranks_on_this_node": [2, 3], "master_addr": "10.0.0.1", "master_port": 29500}
    assert notes == []
    launch, _ = describe_launch(LaunchEnvironment(launcher="lightning", external=False), 3, 1)
    assert launch == {"node_rank": 0, "ranks_on_this_node": [0, 1, 2], "master_addr": "127.0.0.1"}


def test_torchrun_restarts_on_the_agent_store_are_warned_about():
    def notes(**fields) -> list[str]:
        env = LaunchEnvironment(launcher="torchrun", external=True, world_size=2, local_world_size=2, **fields)
        return describe_launch(env, 2, 1)[1]

    assert "pytorch#135712" in notes(max_restarts=3, agent_store=True)[0]
    assert notes(max_restarts=3, agent_store=False) == []
    assert notes(max_restarts=0, agent_store=True) == []


def test_several_nodes_under_lightnings_launcher_need_the_address_port_and_node_rank():
    def notes(num_nodes: int, **fields) -> list[str]:
        return describe_launch(LaunchEnvironment(launcher="lightning", external=False, **fields), 2, num_nodes)[1]

    missing = notes(2)
    assert len(missing) == 1 and missing[0].startswith("num_nodes=2 with Lightning's launcher"), missing
    assert "NODE_RANK (0..1); MASTER_ADDR, MASTER_PORT, NODE_RANK not set here" in missing[0]
    assert "; MASTER_PORT not set here" in notes(2, master_addr="10.0.0.1", node_rank=0)[0]
    assert notes(2, master_addr="10.0.0.1", master_port=29500, node_rank=1) == []
    assert notes(1) == []


def test_a_node_rank_outside_the_nodes_is_named():
    env = {"master_addr": "10.0.0.1", "master_port": 29500}
    assert notes_of(2, node_rank=2, **env) == ["NODE_RANK=2 is not a node of num_nodes=2; use 0..1"]
    assert notes_of(2, node_rank=1, **env) == []


def test_a_local_rank_zero_without_a_launcher_would_wait_forever():
    assert notes_of(1, local_rank=0)[0].startswith("LOCAL_RANK=0 is set but no torchrun/SLURM launch was detected")
    assert notes_of(1) == []


def notes_of(num_nodes: int, **fields) -> list[str]:
    return describe_launch(LaunchEnvironment(launcher="lightning", external=False, **fields), 2, num_nodes)[1]
