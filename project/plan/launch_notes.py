"""What the plan says about the launch: the ranks of this node, the master address, and layouts that would hang."""

from __future__ import annotations

from typing import Any

from project.plan.environment import LaunchEnvironment
from project.plan.launchers import RAY


def describe_launch(environment: LaunchEnvironment, per_node: int, num_nodes: int) -> tuple[dict[str, Any], list[str]]:
    """The plan's ``launch`` record (ranks on this node, master address), and notes for layouts that would hang."""
    own = ("launcher", "external", "cluster_environment", "address")  # shown elsewhere in the plan
    launch = {k: v for k, v in environment.to_dict().items() if k not in own and v is not None}
    world_size = per_node * num_nodes
    if environment.launcher == RAY and environment.rank is None:  # the Ray driver: it runs no rank itself
        where = f"the Ray cluster at {environment.address}" if environment.address else "a local Ray instance"
        return {"workers": world_size, "address": environment.address or "local"}, [
            f"ray: this command submits a Ray Train job of {world_size} worker(s) to {where} and waits; each "
            "worker runs the same command (no rank runs in this process)"
        ]
    if world_size == 1:
        return launch, []
    node_rank = environment.node_rank or 0
    launch["node_rank"] = node_rank
    launch["ranks_on_this_node"] = list(range(node_rank * per_node, (node_rank + 1) * per_node))
    if environment.external and environment.max_restarts and environment.agent_store:
        return launch, [
            "torchrun --max-restarts with the workers on the agent's rendezvous store: restarted workers can "
            "read the dead ones' addresses and fail to connect (pytorch#135712); launch torchrun with "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and --standalone (one node) or --rdzv-backend c10d"
        ]
    if environment.external:
        return launch, []
    launch.setdefault("master_addr", "127.0.0.1")  # Lightning's own launcher: this machine, and a free port
    return launch, _lightning_launcher_notes(environment, num_nodes, node_rank)


def _lightning_launcher_notes(environment: LaunchEnvironment, num_nodes: int, node_rank: int) -> list[str]:
    """Notes on Lightning's own launcher: its defaults (this machine, a free port) hang on several nodes."""
    notes: list[str] = []
    missing = [key for key in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK") if getattr(environment, key.lower()) is None]
    if num_nodes > 1 and missing:
        notes.append(
            f"num_nodes={num_nodes} with Lightning's launcher: run the same command on every node with "
            f"MASTER_ADDR (node 0's address), MASTER_PORT and NODE_RANK (0..{num_nodes - 1}); "
            f"{', '.join(missing)} not set here, so the nodes would wait for each other until the timeout"
        )
    if node_rank >= num_nodes:
        notes.append(f"NODE_RANK={node_rank} is not a node of num_nodes={num_nodes}; use 0..{num_nodes - 1}")
    if environment.local_rank == 0:
        notes.append(
            "LOCAL_RANK=0 is set but no torchrun/SLURM launch was detected: Lightning would wait for "
            "processes that nobody starts; unset LOCAL_RANK (or launch with torchrun)"
        )
    return notes
