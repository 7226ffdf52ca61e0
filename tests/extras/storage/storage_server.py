"""A real S3-compatible server on 127.0.0.1 for the object-storage tests: moto's server, no mocked client.

``s3_server()`` starts moto's threaded server on a free port of 127.0.0.1 in this process, and the tests talk
to it over HTTP the way a run talks to S3, MinIO or any S3-compatible store: through s3fs, with the endpoint and
credentials in the standard environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), which the
CLI subprocesses inherit. The credentials are fake on purpose: a test greps every record for them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: Fake credentials a test can look for in every record (none may hold them).
FAKE_KEY_ID = "AKIAFAKEKEYID4TESTS00"
FAKE_SECRET = "fake-secret-access-key-for-the-tests-0000"


@dataclass(frozen=True)
class S3Server:
    """A running server: its endpoint and the environment a run needs to reach it."""

    endpoint: str
    env: dict[str, str]

    def fs(self):
        """An s3fs file system on this server (a fresh instance: no listings cached between a run and a check)."""
        import s3fs

        return s3fs.S3FileSystem(
            key=FAKE_KEY_ID,
            secret=FAKE_SECRET,
            endpoint_url=self.endpoint,
            skip_instance_cache=True,
            use_listings_cache=False,
        )


@contextlib.contextmanager
def s3_server(bucket: str = "runs") -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 (a free port), make ``bucket``; stop it at the end."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": FAKE_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    running = S3Server(endpoint, env)
    try:
        # moto keeps its buckets in this process's memory, shared by every server it starts: begin empty.
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30)
        running.fs().mkdir(bucket)
        yield running
    finally:
        server.stop()


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in this process for the block (the in-process storage calls read it as a run does)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def attached_store(scratch: str) -> Iterator[Any]:
    """This process's store: a fresh prefix of the ``runs`` bucket, cached in ``scratch`` (in-process tests)."""
    from project.extras.storage import location

    saved = os.environ.get(location.SCRATCH_ENV)
    os.environ[location.SCRATCH_ENV] = scratch
    try:
        yield location.attach(f"s3://runs/{uuid.uuid4().hex[:8]}")
    finally:
        location.detach()
        if saved is None:
            os.environ.pop(location.SCRATCH_ENV, None)
        else:
            os.environ[location.SCRATCH_ENV] = saved
