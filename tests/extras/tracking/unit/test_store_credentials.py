"""A tracking store's credentials are never shown: every message that shows its URI hides the password."""

from __future__ import annotations

import socket

import pytest

from project.errors import UserError
from project.extras.tracking.config import Store, redact


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://me:s3cret@db.example:5432/mlflow", "postgresql://me:***@db.example:5432/mlflow"),
        ("mysql+pymysql://me:p@ss:w0rd@host/db", "mysql+pymysql://me:***@host/db"),
        ("store http://a:b@c:5000 (and https://d:e@f/)", "store http://a:***@c:5000 (and https://d:***@f/)"),
        ("https://host/api?token=abc123&x=1", "https://host/api?token=***&x=1"),
        ("postgresql://host/db?user=me&password=s3cret", "postgresql://host/db?user=me&password=***"),
        ("http://me@host:5000", "http://me@host:5000"),  # a user without a password: nothing secret
        ("sqlite:////work/logs/mlflow.db", "sqlite:////work/logs/mlflow.db"),
    ],
)
def test_credentials_in_a_uri_are_hidden_and_nothing_else_changes(text, shown):
    assert redact(text) == shown


def test_a_store_that_cannot_be_reached_is_one_line_without_its_password():
    from project.extras.tracking.store import check_store

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = Store(f"http://me:s3cret@127.0.0.1:{port}", None, "unit")
    assert store.shown == f"http://me:***@127.0.0.1:{port}"
    with pytest.raises(UserError) as refused:
        check_store(store)
    message = str(refused.value)
    assert f"MLflow cannot use the store http://me:***@127.0.0.1:{port}" in message, message
    assert "s3cret" not in message and "\n" not in message
