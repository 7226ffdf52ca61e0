"""``parallel.launcher: ray``: the same command as a Ray Train job of one worker per rank.

``python -m project fit --config ... --parallel.launcher ray`` parses, checks and plans in this process (the
driver), exactly as under any other launcher, then submits a ``TorchTrainer`` job of ``plan.world_size``
workers to the Ray cluster at ``RAY_ADDRESS`` (or to a local Ray instance it starts) and waits. The driver
never trains. Each worker changes into the driver's working directory and runs the same command through
:func:`project.cli.execute`, so the plan, the samplers, exactly-once evaluation, checkpoints, export and the
run directory are those of every other launcher; rank 0 returns its run directory to the driver. The core asks
:func:`submitter` (the layer's ``submit`` hook, :mod:`project.launch.submit`) and hands the job to it.

In a worker, Ray Train has created the process group (with the plan's backend and ``timeout_s``, given to
``TorchConfig``) and set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and NODE_RANK;
:mod:`project.plan.environment` detects the worker and the plan hands the table's strategy Ray's
``RayLightningEnvironment``, so Lightning's ranks are the ones Ray assigned (also inside a SLURM job that hosts
the Ray cluster, whose variables Lightning would otherwise read). The strategy stays the
table's (Lightning's ``DDPStrategy`` with the plan's arguments) rather than ``RayDDPStrategy``, whose two
additions do not apply here: DistributedSampler arguments (the layer installs its own samplers) and the GPU
from ``ray.train.torch.get_device()`` (Ray shows each worker all GPUs of its node's workers, so Lightning's
``cuda:<local rank>`` is one of them, a different one per worker).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable
from typing import Any

from project.errors import RankFailure, RunFailure, UserError, first_line
from project.plan.launchers import RAY
from project.plan.resolve import Plan
from project.plan.scenarios import SCENARIOS

INSTALL = "pip install -e .[ray]"
# The template's own switches (PROJECT_DEBUG, PROJECT_ALLOW_PICKLE, ...) and the import path of the user's code
# reach the workers, whose environment is otherwise the Ray cluster's.
_FORWARDED_PREFIX = "PROJECT_"
_FORWARDED = ("PYTHONPATH",)
_NOT_FORWARDED = ("PROJECT_LEGACY_LAUNCH",)


def submitter(launcher: str) -> Callable[..., None] | None:
    """:func:`run_on_ray` for ``parallel.launcher: ray``, asked by the core where Ray did not start this process."""
    return run_on_ray if launcher == RAY else None


def _import_ray() -> Any:
    try:
        import ray
        import ray.train.torch  # ray[train]: the extra's dependencies, not only ray's core
    except ImportError as error:
        raise UserError(
            f"parallel.launcher=ray needs Ray Train, which is not installed here ({error}); install the extra: "
            f"`{INSTALL}` (or run without --parallel.launcher ray)"
        ) from None
    return ray


def check_ray_plan(plan: Plan) -> None:
    """Refuse, before Ray starts, a layout that Ray's workers cannot take.

    Raises:
        UserError: scenario ``fork`` (its ranks are forked from one process; Ray starts each worker itself), or
            GPU ids other than ``0..N-1`` (Ray chooses which GPUs each worker gets: give a count).
    """
    if SCENARIOS[plan.scenario].forks_itself:
        raise UserError(
            "parallel.scenario='fork' forks the ranks from this process, but under parallel.launcher=ray Ray "
            "starts every worker itself; use scenario 'cpu' or 'ddp' (or drop parallel.launcher)"
        )
    if isinstance(plan.devices, list) and plan.devices != list(range(len(plan.devices))):
        raise UserError(
            f"parallel.devices={plan.devices} names GPUs, but under parallel.launcher=ray Ray chooses the GPUs of "
            f"each worker; give a count (parallel.devices={len(plan.devices)})"
        )


def _forwarded_env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if (key.startswith(_FORWARDED_PREFIX) or key in _FORWARDED) and key not in _NOT_FORWARDED
    }


def _start_ray(ray: Any, plan: Plan) -> None:
    """Connect to ``RAY_ADDRESS``, or start a local Ray instance with a CPU (and GPU) for every worker."""
    runtime_env = {"env_vars": _forwarded_env()}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=runtime_env, configure_logging=False)
        return
    # Ray's logical CPUs only count workers: as many as there are workers even on a smaller machine, as
    # Lightning's own launcher would start that many processes.
    cpus = max(os.cpu_count() or 1, plan.world_size)
    ray.init(num_cpus=cpus, include_dashboard=False, runtime_env=runtime_env, configure_logging=False)


def _warn_if_cluster_too_small(ray: Any, plan: Plan) -> None:
    resource = "GPU" if plan.accelerator == "gpu" else "CPU"
    has = ray.cluster_resources().get(resource, 0)
    if has < plan.world_size:
        print(
            f"warning: the Ray cluster has {has:g} {resource}s and the job needs {plan.world_size} (one per worker); "
            "Ray waits until an autoscaler adds them (Ctrl+C stops the job)",
            flush=True,
        )


def run_on_ray(argv: list[str], command: str, plan: Plan, run: Callable[[list[str]], str | None]) -> None:
    """Run ``argv`` (the command line, as given) as a Ray Train job of ``plan.world_size`` workers and wait.

    Each worker calls ``run(argv)`` (a module-level function, which Ray ships by reference): the command, whose
    rank 0 returns its run directory. The launcher is handed it and so never imports the CLI.

    Ends, as a run under any other launcher does, with ``Run directory: logs/<name>/version_<n>`` (rank 0's).

    Raises:
        UserError: Ray is not installed, a layout Ray cannot take, or bad input a worker found (named by rank).
        RunFailure: a worker failed while running (named by rank).
    """
    check_ray_plan(plan)
    ray = _import_ray()
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    _start_ray(ray, plan)
    try:
        _warn_if_cluster_too_small(ray, plan)
        timeout_s = plan.strategy_args.get("timeout_s")
        trainer = TorchTrainer(
            _worker,
            train_loop_config={"argv": list(argv), "cwd": os.getcwd(), "run": run},
            scaling_config=ScalingConfig(num_workers=plan.world_size, use_gpu=plan.accelerator == "gpu"),
            torch_config=TorchConfig(
                backend=plan.backend, **({"timeout_s": math.ceil(timeout_s)} if timeout_s is not None else {})
            ),
            # A failed worker fails the job, as under every other launcher; `fit --resume auto` continues it.
            run_config=RunConfig(
                name=f"project-{command}-{time.strftime('%Y%m%d-%H%M%S')}", failure_config=FailureConfig(max_failures=0)
            ),
        )
        try:
            result = trainer.fit()
        except Exception as error:
            failure = failure_from_ray(error, plan.world_size)
            if failure is None:
                raise
            raise failure from None
    finally:
        ray.shutdown()
    if result.return_value:
        print(f"Run directory: {result.return_value}", flush=True)


def failure_from_ray(error: BaseException, world_size: int) -> UserError | RunFailure | None:
    """One line for a failed Ray Train job, naming the worker (rank) where it started.

    Ray Train reports every failed worker; the first cause is chosen: a worker's bad input (stays a
    :class:`UserError`, exit code 2), then a worker whose process died (killed, out of memory, crashed),
    then a worker's own error; a lost peer in a collective (``RankFailure``) only follows from another
    worker's failure. ``None``: not a Ray Train error.
    """
    failures: dict[int, BaseException] | None = getattr(error, "worker_failures", None)
    if not failures:
        controller = getattr(error, "controller_failure", None)
        if controller is None:
            return None
        return RunFailure(f"the Ray Train job failed before its workers ran: {first_line(controller)}")
    rank = min(failures, key=lambda r: (_precedence(failures[r]), r))
    cause = _original(failures[rank])
    where = f"rank {rank} of {world_size} Ray workers"
    resume = "then resume with `fit --resume auto`"
    if isinstance(cause, UserError):
        return UserError(f"{where}: {first_line(cause)}")
    died = getattr(cause, "health_check_failure", None)
    if died is not None:
        pid = re.search(r"\bpid[:=]\s*(\d+)", str(died))
        return RunFailure(
            f"{where} died{f' (pid {pid.group(1)})' if pid else ''}: its process ended without a Python error "
            "(killed by a signal or the out-of-memory killer: see `dmesg` on its node; or crashed), and Ray stopped "
            f"the others. Read Ray's report above, {resume}"
        )
    if isinstance(cause, RunFailure):
        return RunFailure(f"{where}: {first_line(cause)}")
    return RunFailure(
        f"{where} failed: {type(cause).__name__}: {first_line(cause)} (its traceback is in Ray's output above); "
        f"fix it, {resume}"
    )


def _precedence(error: BaseException) -> int:
    cause = _original(error)
    if isinstance(cause, UserError):
        return 0
    if getattr(cause, "health_check_failure", None) is not None:
        return 1
    return 3 if isinstance(cause, RankFailure) else 2


def _original(error: BaseException) -> BaseException:
    """The exception the worker raised, without Ray's wrappers (which keep it as ``cause``)."""
    for _ in range(10):
        inner = getattr(error, "cause", None)
        if not isinstance(inner, BaseException) or inner is error:
            break
        error = inner
    return error


def _worker(config: dict[str, Any]) -> str | None:
    """One Ray Train worker: the same command, from the driver's working directory; rank 0 returns the run directory."""
    # Ray starts workers in a folder of its session; relative paths (configs, logs/) are the command's.
    if not os.path.isdir(config["cwd"]):
        raise UserError(
            f"the command's working directory {config['cwd']} does not exist on this Ray worker's node; run it "
            "from a folder every node shares (the run directory and checkpoints are written there)"
        )
    os.chdir(config["cwd"])
    return config["run"](config["argv"])
