"""``parallel.devices`` parsed once: "all", a count, or GPU ids, checked against the machine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from project.errors import UserError


@dataclass(frozen=True)
class DeviceRequest:
    """What ``parallel.devices`` asks for: every device (``None``), a count, or explicit GPU ids."""

    raw: Any
    count: int | None = None
    ids: tuple[int, ...] | None = None

    @property
    def size(self) -> int | None:
        """How many devices were asked for; ``None``: all (or the launcher's / the scenario's default)."""
        return self.count if self.count is not None else (len(self.ids) if self.ids is not None else None)


def parse_devices(devices: Any) -> DeviceRequest:
    """Read ``parallel.devices`` ("all", -1, N, "N", [ids], "0,1,2") once; a one-line error for anything else."""
    if devices is None or devices in ("all", -1, "-1"):
        return DeviceRequest(devices)
    value = devices
    if isinstance(value, str):
        text = value.strip().strip("[]")
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            raise UserError(
                f"parallel.devices={devices!r} is not 'all', a count or a list of GPU ids; write e.g. [0, 1, 2]"
            )
        # A lone number is a count (N devices), as Lightning reads it; a comma list is ids.
        value = int(parts[0]) if len(parts) == 1 and "," not in text else [int(p) for p in parts]
    if isinstance(value, bool):
        raise UserError(f"parallel.devices={devices!r} is not 'all', a count or a list of GPU ids")
    if isinstance(value, int):
        if value < 1:
            raise UserError(f"parallel.devices={devices} must be >= 1 (or 'all'); use 1 for one device")
        return DeviceRequest(devices, count=value)
    ids = list(value)
    if not ids:
        raise UserError("parallel.devices=[] is empty; list at least one GPU id, or use 'all'")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise UserError(f"parallel.devices={ids} must list GPU ids (whole numbers >= 0)")
    return DeviceRequest(devices, ids=tuple(ids))


def gpu_ids(request: DeviceRequest, gpus: int) -> list[int] | None:
    """The GPU ids a request names on a machine with ``gpus`` GPUs; ``None`` means "all"."""
    if request.size is None:
        return None
    if request.count is not None:
        if request.count > gpus:
            raise UserError(
                f"parallel.devices={request.raw} asks for more GPUs than this machine has ({gpus}); "
                f"use at most {gpus} or 'all'"
            )
        return list(range(request.count))
    ids = list(request.ids or ())
    if bad := [i for i in ids if i >= gpus]:
        valid = f"0..{gpus - 1}" if gpus else "none: no GPU is visible"
        raise UserError(f"parallel.devices={ids}: GPU id(s) {bad} do not exist (valid ids: {valid})")
    if repeated := sorted({i for i in ids if ids.count(i) > 1}):
        raise UserError(f"parallel.devices={ids} repeats GPU id(s) {repeated}; list each GPU once")
    return ids


def cpu_processes(request: DeviceRequest, scenario: str = "cpu") -> int | None:
    """The number of CPU processes a request names; ``None`` when it leaves it open."""
    if request.raw is None:
        return None
    if request.count is None:
        raise UserError(
            f"parallel.devices={request.raw!r} with scenario '{scenario}' on CPU must be a number of processes "
            "(e.g. 2); GPU ids and 'all' need GPUs"
        )
    return request.count
