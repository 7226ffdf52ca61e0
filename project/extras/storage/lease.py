"""One training per run without ``fcntl``: a lease object in the store, renewed by a heartbeat, with an expiry.

``fcntl`` locks protect nothing across nodes that share no file system. The lease is ``<run>/.training.lease``:
taken with a write-if-absent (S3's ``If-None-Match: *``), renewed every ``ttl/3`` seconds with a
write-if-unchanged (``If-Match`` on its ETag) and removed when the command ends. A second training finds it and
is refused in one line naming the holder, unless it has expired (no heartbeat for ``ttl`` seconds: the holder
died or lost the store) or its holder is a process of this host that is gone; then it is taken over with a
write-if-unchanged, so of two runs taking over at once one wins. The expiry is compared with this host's clock:
keep the nodes' clocks in sync (NTP), as any lease does.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from project.errors import UserError
from project.extras.storage import objects
from project.extras.storage.location import Store

#: The lease object, in the run folder of the store.
LEASE_NAME = ".training.lease"
#: Seconds without a heartbeat after which a lease is free (``PROJECT_LEASE_TTL_S``).
TTL_ENV = "PROJECT_LEASE_TTL_S"
_DEFAULT_TTL_S = 60.0


#: The shortest time to live: the heartbeat renews every third of it, at most once a second.
_MIN_TTL_S = 3.0


def ttl_s() -> float:
    """The lease's time to live: ``PROJECT_LEASE_TTL_S``, default 60 s.

    Raises:
        UserError: not a number, or below 3 s (``0`` would renew in a busy loop, a negative one never hold).
    """
    text = os.environ.get(TTL_ENV) or str(_DEFAULT_TTL_S)
    try:
        ttl = float(text)
    except ValueError:
        ttl = float("nan")
    if not ttl >= _MIN_TTL_S or ttl == float("inf"):
        raise UserError(
            f"{TTL_ENV}={text!r}: the lease's time to live must be a number of seconds >= {_MIN_TTL_S:g} "
            f"(its heartbeat renews every third of it); unset it for {_DEFAULT_TTL_S:g} s"
        )
    return ttl


@dataclass
class Lease:
    """The lease of one run folder, held by this process while ``tag`` is set."""

    store: Store
    remote: str
    ttl: float = field(default_factory=ttl_s)
    tag: Any = None
    record: dict[str, Any] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def take(cls, store: Store, run_dir: Path) -> Lease:
        """Take the lease of ``run_dir`` (a run folder of the scratch cache) and start its heartbeat.

        Raises:
            UserError: another training holds it: who, since when, until when, and what to do.
        """
        remote = f"{store.remote(run_dir)}/{LEASE_NAME}"
        lease = cls(store, remote)
        lease.record = lease._fresh()
        lease.tag = objects.create(store.fs, remote, lease.record)
        if lease.tag is None:
            held, tag = objects.read_json(store.fs, remote)
            if held is not None and not _free(held):
                raise UserError(_refusal(store, remote, held))
            lease.tag = objects.replace(store.fs, remote, lease.record, tag) if tag is not None else None
            if lease.tag is None:  # taken over by another run a moment before us, or removed: say who holds it
                now, _ = objects.read_json(store.fs, remote)
                raise UserError(_refusal(store, remote, now or {}))
        lease._thread = threading.Thread(target=lease._beat, name="lease-heartbeat", daemon=True)
        lease._thread.start()
        return lease

    def _fresh(self) -> dict[str, Any]:
        now = time.time()
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "token": self.record.get("token") or uuid.uuid4().hex,
            "since": self.record.get("since") or _iso(now),
            "expires": now + self.ttl,
        }

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            record = self._fresh()
            try:
                tag = objects.replace(self.store.fs, self.remote, record, self.tag)
            except Exception as error:  # the store did not answer (any client's error): try again at the next beat
                sys.stderr.write(f"warning: could not renew the run's lease {self.remote}: {error}\n")
                continue
            if tag is None:
                sys.stderr.write(
                    f"warning: the run's lease {self.store.url_of(self.remote)} was taken by another training "
                    f"(no heartbeat reached the store for {self.ttl:.0f} s)\n"
                )
                return
            self.tag, self.record = tag, record

    def release(self) -> None:
        """Stop the heartbeat and remove the lease if it is still ours (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.tag is None:
            return
        held, _ = objects.read_json(self.store.fs, self.remote)
        if held is not None and held.get("token") == self.record.get("token"):
            objects.remove(self.store.fs, self.remote)
        self.tag = None


def _free(held: dict[str, Any]) -> bool:
    """An expired lease, or one whose holder was a process of this host that no longer runs."""
    if float(held.get("expires", 0)) < time.time():
        return True
    if held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int):
        try:
            os.kill(held["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False


def _refusal(store: Store, remote: str, held: dict[str, Any]) -> str:
    pid, host = held.get("pid", "?"), held.get("host", "?")
    left = max(0.0, float(held.get("expires", 0)) - time.time())
    return (
        f"{store.url_of(remote.rsplit('/', 1)[0])} is training already (pid {pid} on host {host}, since "
        f"{held.get('since', '?')}; its lease expires in {left:.0f} s without a heartbeat); a second training there "
        f"would overwrite its checkpoints and events: wait for it to end, or stop it (`kill {pid}` on {host}: it "
        "saves and stops), then run this command again"
    )


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).astimezone().isoformat(timespec="seconds")
