"""``storage_options`` of the config: the store opens with them, and what a record keeps of them holds no credential.

Against moto's S3 server on 127.0.0.1 with nothing in the environment: the endpoint and keys reach s3fs only
through the options.
"""

from __future__ import annotations

import pytest
from storage_server import FAKE_KEY_ID, FAKE_SECRET, s3_server

from project.extras.storage import location, objects, shards


@pytest.fixture(autouse=True)
def no_store():
    yield
    location.detach()


def test_credentials_are_redacted_at_any_depth_and_the_rest_is_kept():
    options = {
        "endpoint_url": "http://minio:9000",
        "anon": False,
        "key": FAKE_KEY_ID,
        "secret": FAKE_SECRET,
        "client_kwargs": {"region_name": "eu-west-1", "aws_session_token": "t0k3n"},
        "config_kwargs": [{"sas_token": "s"}],
    }
    assert location.redacted(options) == {
        "endpoint_url": "http://minio:9000",
        "anon": False,
        "key": location.REDACTED,
        "secret": location.REDACTED,
        "client_kwargs": {"region_name": "eu-west-1", "aws_session_token": location.REDACTED},
        "config_kwargs": [{"sas_token": location.REDACTED}],
    }
    assert options["secret"] == FAKE_SECRET  # the options the store opens with are left whole


def test_a_store_opens_with_the_options_alone(monkeypatch, tmp_path):
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(location.SCRATCH_ENV, str(tmp_path))
    with s3_server() as s3:
        location.configure({"endpoint_url": s3.endpoint, "key": FAKE_KEY_ID, "secret": FAKE_SECRET})
        store = location.attach("s3://runs/options")
        objects.write(store.fs, f"{store.root}/hello", b"there")
        assert s3.fs().cat_file("runs/options/hello") == b"there"
        assert shards.in_store(store.scratch / "x" / "version_0" / "checkpoints" / "last.ckpt")
        assert location.shown(store.scratch / "x") == f"s3://runs/options/x (cache: {store.scratch / 'x'})"
