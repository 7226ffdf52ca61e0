"""Every way the seed's users launch: Lightning's launcher, torchrun, torch.distributed.launch, several nodes, SLURM,
Kubeflow, the Ray driver's plan (Ray itself: the ray layer's tests; a real SLURM: tests/distributed/test_slurm.py).

Each test starts real processes (CPU, gloo) the way a user would and reads the ``plan.json`` of the
run: the layout it took from the launcher and what Lightning itself detected.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from project.errors import UserError
from project.launch.legacy import strip_legacy_local_rank
from project.plan.environment import LaunchEnvironment, detect_environment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

from helpers import CPU_DDP, DIGITS, FAST, REPO, cli_env, free_port, read_plan, run_cli, run_dirs

# A few steps are enough to prove the processes found each other and trained together.
SHORT = ["--config", FAST, "--trainer.max_steps", "4", "--trainer.limit_val_batches", "1", "--test_after_fit", "false"]
FIT_DDP = ["fit", "--config", DIGITS, "--config", CPU_DDP, *SHORT]
TORCHRUN = ("-m", "torch.distributed.run")
# What Lightning must detect for each launcher (plan.json runtime.cluster_environment).
LIGHTNING_SEES = {
    "lightning": "LightningEnvironment",
    "torchrun": "TorchElasticEnvironment",
    "torch.distributed.launch": "TorchElasticEnvironment",
    "slurm": "SLURMEnvironment",
    "kubeflow": "KubeflowEnvironment",
}
# What the Kubeflow training operator sets in each PyTorchJob pod (with the kubelet's KUBERNETES_* variables).
POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_PORT": "tcp://10.96.0.1:443"}
PYTORCHJOB = REPO / "scripts" / "kubeflow" / "pytorchjob.yaml"


def start_cli(args: list[str], cwd: Path, env: dict[str, str], module: tuple[str, ...]) -> subprocess.Popen[str]:
    """Start ``python MODULE ARGS`` without waiting: one "node" of a job whose nodes all run on this machine."""
    return subprocess.Popen(
        [sys.executable, *module, *args],
        cwd=cwd,
        env=cli_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(processes: list[subprocess.Popen[str]], timeout: float = 240) -> list[str]:
    """Wait for every process; fail with the output of any that did not exit 0."""
    outputs = [p.communicate(timeout=timeout)[0] for p in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output
    return outputs


def assert_layout(cwd: Path, launcher: str, world_size: int, num_nodes: int = 1) -> dict:
    """One run directory (only global rank 0 writes) whose plan.json has this layout, as Lightning also saw it."""
    (run,) = run_dirs(cwd)
    plan = read_plan(run)
    assert (plan["launcher"], plan["world_size"], plan["num_nodes"]) == (launcher, world_size, num_nodes), plan
    runtime = plan["runtime"]
    assert (runtime["world_size"], runtime["num_nodes"]) == (world_size, num_nodes), runtime
    assert runtime["cluster_environment"] == LIGHTNING_SEES[launcher], runtime
    return plan


# ------------------------------------------------------------------------------ pure, no processes
def test_legacy_local_rank_is_accepted_anywhere_and_checked():
    args = ["fit", "--local_rank", "1", "--config", "a.yaml", "--local-rank=1"]
    assert strip_legacy_local_rank(args, {"LOCAL_RANK": "1"}) == (["fit", "--config", "a.yaml"], True)
    assert strip_legacy_local_rank(["fit"], {}) == (["fit"], False)
    with pytest.raises(UserError, match=r"--local_rank=0 disagrees with LOCAL_RANK=1"):
        strip_legacy_local_rank(["--local-rank=0", "fit"], {"LOCAL_RANK": "1"})


def _plan(environ: dict[str, str], **fields):
    config = ParallelConfig(scenario="cpu", devices=2, **fields)
    return resolve_plan(config, Hardware(0), detect_environment(environ), 64)


def test_plan_shows_ranks_and_master_of_this_node():
    node1 = _plan({"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "NODE_RANK": "1"}, num_nodes=2)
    assert node1.launch["ranks_on_this_node"] == [2, 3]
    assert (node1.launch["master_addr"], node1.launch["master_port"]) == ("node0", 29500)
    assert not [n for n in node1.notes if "NODE_RANK" in n]
    local = _plan({})
    assert local.launch["master_addr"] == "127.0.0.1" and local.launch["ranks_on_this_node"] == [0, 1]


@pytest.mark.parametrize(
    ("environ", "fields", "words"),
    [
        ({}, {"num_nodes": 2}, ["num_nodes=2", "MASTER_ADDR, MASTER_PORT, NODE_RANK not set"]),
        ({"MASTER_ADDR": "h", "MASTER_PORT": "1", "NODE_RANK": "2"}, {"num_nodes": 2}, ["NODE_RANK=2", "0..1"]),
        ({"LOCAL_RANK": "0"}, {}, ["LOCAL_RANK=0", "unset LOCAL_RANK"]),
    ],
)
def test_plan_warns_when_lightnings_launch_would_hang(environ, fields, words):
    notes = " ".join(_plan(environ, **fields).notes)
    assert all(word in notes for word in words), notes


def test_plan_warns_when_torchrun_restarts_would_reuse_a_stale_store():
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    torchrun["TORCHELASTIC_MAX_RESTARTS"] = "1"
    shared = " ".join(_plan({**torchrun, "TORCHELASTIC_USE_AGENT_STORE": "True"}).notes)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in shared and "--standalone" in shared
    assert not _plan({**torchrun, "TORCHELASTIC_USE_AGENT_STORE": "False"}).notes


def test_slurm_mismatch_names_the_sbatch_option():
    slurm = {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "1", "SLURM_JOB_NAME": "train"}
    with pytest.raises(UserError, match=r"parallel.devices=2 disagrees with slurm, which started 4 \(--ntasks-per"):
        _plan(slurm)
    assert detect_environment(slurm) == LaunchEnvironment("slurm", True, 4, 4, 1)


@pytest.mark.parametrize(
    ("environ", "launcher"),
    [
        ({**POD, "MASTER_ADDR": "digits-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}, "kubeflow"),
        # The same variables outside a pod, or with LOCAL_RANK (a launcher that starts processes itself): not Kubeflow.
        ({"MASTER_ADDR": "h", "MASTER_PORT": "1", "WORLD_SIZE": "3", "RANK": "2"}, "lightning"),
        (
            {**POD, "MASTER_ADDR": "h", "MASTER_PORT": "1", "WORLD_SIZE": "3", "RANK": "2", "LOCAL_RANK": "0"},
            "lightning",
        ),
        # torchrun in a pod (a PyTorchJob with nprocPerNode) is torchrun.
        (
            {**POD, "MASTER_ADDR": "h", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "0", "TORCHELASTIC_RUN_ID": "x"},
            "torchrun",
        ),
        # A Ray Train worker, also inside a SLURM job (a Ray cluster on SLURM) or a pod (KubeRay), is Ray's.
        (
            {"RAY_RAYLET_PID": "7", "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
            | {"NODE_RANK": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "ray", **POD, "MASTER_ADDR": "h"}
            | {"MASTER_PORT": "1"},
            "ray",
        ),
    ],
)
def test_kubeflow_and_ray_workers_are_told_apart_from_the_other_launchers(environ, launcher):
    assert detect_environment(environ).launcher == launcher


def test_kubeflow_pod_is_one_process_of_world_size_nodes():
    pod = {**POD, "MASTER_ADDR": "digits-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
    plan = resolve_plan(ParallelConfig(scenario="cpu"), Hardware(0), detect_environment(pod), 64)
    assert (plan.launcher, plan.devices, plan.num_nodes, plan.world_size) == ("kubeflow", 1, 3, 3)
    assert plan.launch["ranks_on_this_node"] == [2] and plan.launch["master_addr"] == "digits-master-0"
    # Lightning does not detect Kubeflow itself (its KubeflowEnvironment must be given): the plan names it.
    assert plan.cluster_environment == "lightning.pytorch.plugins.environments.KubeflowEnvironment"
    with pytest.raises(UserError, match=r"parallel.devices=2 disagrees with kubeflow, which started 1 \(one process"):
        _plan(pod)


def test_pytorchjob_manifest_runs_the_template_in_every_pod():
    job = yaml.safe_load(PYTORCHJOB.read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"} and replicas["Master"]["replicas"] == 1
    commands = []
    for spec in replicas.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"  # the container the operator sets the variables in
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1  # one process, one GPU per pod
        commands.append(container["command"])
    assert commands[0] == commands[1] and commands[0][:4] == ["python", "-m", "project", "fit"]
    configs = [commands[0][i + 1] for i, arg in enumerate(commands[0]) if arg == "--config"]
    assert configs and all((REPO / config).is_file() for config in configs)


def test_ray_plan_submits_a_job_of_world_size_workers():
    driver = _plan({"RAY_ADDRESS": "10.0.0.1:6379", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "ray"}, launcher="ray")
    # In the driver (even inside the SLURM job that hosts the Ray cluster) no rank runs: Ray starts the workers.
    assert (driver.launcher, driver.world_size, driver.launch) == ("ray", 2, {"workers": 2, "address": "10.0.0.1:6379"})
    assert driver.cluster_environment is None and "submits a Ray Train job of 2 worker(s)" in driver.notes[-1]
    assert _plan({}, launcher="ray").launch["address"] == "local"
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    with pytest.raises(UserError, match=r"parallel.launcher=ray in a process that torchrun started"):
        _plan(torchrun, launcher="ray")


def pytorchjob_command() -> list[str]:
    """The manifest's command after ``python -m project``."""
    job = yaml.safe_load(PYTORCHJOB.read_text())
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"][3:]


def test_sbatch_script_is_valid_bash_and_launches_with_srun():
    script = REPO / "scripts" / "slurm" / "train.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "#SBATCH --ntasks-per-node=" in text and "#SBATCH --nodes=" in text
    assert 'srun "${PYTHON}" -m project fit' in text and "--resume auto" in text


# --------------------------------------------------------------------------- real processes
def test_plan_under_torchrun_reports_a_mismatch_as_a_note(tmp_path):
    env = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    env |= {"GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}
    result = run_cli(
        ["plan", "--config", DIGITS, "--config", CPU_DDP, "--parallel.devices", "3", "--json"], tmp_path, env
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout.strip().splitlines()[-1])
    assert plan["launcher"] == "torchrun" and plan["launch"]["master_addr"] == "127.0.0.1"
    assert any("will not start under torchrun" in n and "devices=3" in n and "started 2" in n for n in plan["notes"])


@pytest.mark.fast
@pytest.mark.distributed
def test_torchrun_takes_the_layout_from_the_launcher(tmp_path):
    launcher = [*TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()), "-m", "project"]
    result = run_cli(FIT_DDP, tmp_path, module=launcher)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_layout(tmp_path, "torchrun", 2)


@pytest.mark.distributed
def test_legacy_torch_distributed_launch_passes_local_rank_and_works(tmp_path):
    launcher = ["-m", "torch.distributed.launch", "--nproc_per_node", "2", "--master_port", str(free_port())]
    result = run_cli(FIT_DDP, tmp_path, module=[*launcher, "-m", "project"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert_layout(tmp_path, "torch.distributed.launch", 2)


@pytest.mark.distributed
def test_torchrun_with_a_config_that_disagrees_stops_naming_both(tmp_path):
    launcher = [*TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()), "-m", "project"]
    result = run_cli([*FIT_DDP, "--parallel.devices", "3"], tmp_path, module=launcher)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "error: parallel.devices=3 disagrees with torchrun, which started 2" in output, output
    assert run_dirs(tmp_path) == []


@pytest.mark.distributed
def test_two_nodes_with_lightnings_launcher(tmp_path):
    job = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    args = [
        "fit",
        "--config",
        DIGITS,
        "--config",
        CPU_DDP,
        *SHORT,
        "--parallel.num_nodes",
        "2",
        "--parallel.devices",
        "1",
    ]
    nodes = [start_cli(args, tmp_path, {**job, "NODE_RANK": str(n)}, ("-m", "project")) for n in (0, 1)]
    finish(nodes)
    plan = assert_layout(tmp_path, "lightning", 2, num_nodes=2)
    assert plan["launch"]["node_rank"] == 0 and plan["launch"]["ranks_on_this_node"] == [0]


@pytest.mark.distributed
def test_two_nodes_of_two_processes_with_torchrun_rendezvous(tmp_path):
    rendezvous = ["--nnodes", "2", "--nproc_per_node", "2", "--rdzv-backend", "c10d"]
    rendezvous += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "two-by-two"]
    agents = [start_cli(FIT_DDP, tmp_path, {}, (*TORCHRUN, *rendezvous, "-m", "project")) for _ in range(2)]
    finish(agents)
    plan = assert_layout(tmp_path, "torchrun", 4, num_nodes=2)
    assert plan["devices"] == 2 and plan["global_batch_size"] == 4 * plan["per_device_batch_size"]


@pytest.mark.distributed
def test_slurm_variables_are_detected_by_lightning_and_the_plan(tmp_path):
    job = {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0"}
    job |= {"SLURM_JOB_NAME": "digits", "SLURM_JOB_ID": "4242", "SLURM_NODELIST": "localhost"}
    job |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    tasks = [
        start_cli(FIT_DDP, tmp_path, {**job, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}, ("-m", "project"))
        for r in (0, 1)
    ]
    finish(tasks)
    plan = assert_layout(tmp_path, "slurm", 2)
    assert plan["launch"]["ranks_on_this_node"] == [0, 1]


@pytest.mark.distributed
def test_kubeflow_pytorchjob_of_two_pods_as_two_processes(tmp_path):
    """The manifest's own command in two "pods" on localhost, with the operator's variables (one process each)."""
    job = {**POD, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    # On CPU: 2 CPU processes over gloo instead of the manifest's GPUs; one per pod, as Kubeflow starts them.
    args = [*pytorchjob_command(), "--config", CPU_DDP, "--parallel.devices", "1", *SHORT]
    (tmp_path / "configs").symlink_to(REPO / "configs")  # the manifest's relative paths, as in its workingDir
    pods = [start_cli(args, tmp_path, {**job, "RANK": str(rank)}, ("-m", "project")) for rank in (0, 1)]
    finish(pods)
    plan = assert_layout(tmp_path, "kubeflow", 2, num_nodes=2)
    assert plan["devices"] == 1 and plan["launch"]["ranks_on_this_node"] == [0]
