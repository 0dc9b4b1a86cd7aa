"""Standard Webhooks signatures, checked by an independent implementation: the
``standardwebhooks`` package from PyPI (the spec authors' reference library)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from alarm.config import ConfigError
from exporters.notify import Notifications
from exporters.signing import sign_headers
from tests.fakes.kit import change, notify_config, record, running_notifications, wait_for
from tests.fakes.receiver import Receiver
from tests.fakes.server import serve


def new_secret() -> tuple[str, bytes]:
    key = os.urandom(32)
    return "whsec_" + base64.b64encode(key).decode(), key


BODY = json.dumps({"type": "alert.firing", "data": {"x": 1}}).encode()


def test_signature_verifies_with_the_reference_library():
    secret, key = new_secret()
    headers = sign_headers([key], "msg_abc", int(time.time()), BODY)
    assert Webhook(secret).verify(BODY.decode(), headers) == json.loads(BODY)
    tampered = BODY.replace(b"1", b"2")
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(tampered.decode(), headers)


def test_rotation_signs_with_every_secret():
    (old, old_key), (new, new_key), (other, _) = new_secret(), new_secret(), new_secret()
    headers = sign_headers([old_key, new_key], "msg_rot", int(time.time()), BODY)
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(BODY.decode(), headers)  # a receiver not yet rotated
    Webhook(new).verify(BODY.decode(), headers)  # a receiver already rotated
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(BODY.decode(), headers)


def test_stale_timestamp_is_rejected_by_the_reference_verifier():
    secret, key = new_secret()
    stale = sign_headers([key], "msg_old", int(time.time()) - 600, BODY)
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(secret).verify(BODY.decode(), stale)


async def test_a_notification_queued_long_ago_is_signed_when_it_is_sent(tmp_path):
    """A row written 15 minutes ago (an outage) still verifies: the timestamp and signature
    are made per attempt, while webhook-id stays the row's idempotency key."""
    secret, _ = new_secret()
    (tmp_path / "secret").write_text(secret + "\n")
    rx = Receiver(secret=secret)
    async with serve(rx.app()) as srv:
        cfg = {
            "destinations": [
                {
                    "type": "webhook",
                    "name": "signed",
                    "url": f"{srv.base}/hook",
                    "secrets": [{"file": str(tmp_path / "secret")}],
                }
            ]
        }
        async with running_notifications(tmp_path / "state", cfg) as n:
            old = time.time() - 900
            await asyncio.to_thread(n.record, [change(at=old, started_at=old - 10)], old)
            n.wake()
            await wait_for(lambda: rx.received, timeout=10)
    assert rx.bad_signatures == []
    receipt = rx.received[0]
    assert receipt.webhook_id.startswith("msg_") and len(receipt.webhook_id) == 36
    assert receipt.payload["type"] == "alert.firing"
    assert receipt.payload["data"]["id"] == receipt.webhook_id.removeprefix("msg_")


async def test_secrets_from_env_and_file_rotate_on_reload_and_are_never_logged(
    tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.DEBUG)
    (a, _), (b, _), (c, _) = new_secret(), new_secret(), new_secret()
    monkeypatch.setenv("CAPALARM_TEST_SECRET", a)
    secret_file = tmp_path / "secrets"
    secret_file.write_text(f"{b}\n")
    rx = Receiver(secret=a)
    async with serve(rx.app()) as srv:

        def cfg() -> dict:
            return {
                "destinations": [
                    {
                        "type": "webhook",
                        "name": "rot",
                        "url": f"{srv.base}/hook",
                        "secrets": [{"env": "CAPALARM_TEST_SECRET"}, {"file": str(secret_file)}],
                    }
                ],
                "outbox": {"base_backoff": "50ms", "max_backoff": "200ms"},
            }

        async with running_notifications(tmp_path / "state", cfg()) as n:
            rx.fail_next(["500"])  # a failure, so that retry lines are logged too
            await record(n, change(target="one"))
            await wait_for(lambda: len(rx.received) == 1, timeout=10)
            # Rotation: the receiver moves to the file's secret; the old env secret is retired
            # and a new one added to the file.
            rx.secret = b
            monkeypatch.delenv("CAPALARM_TEST_SECRET")
            secret_file.write_text(f"{b}\n{c}\n")
            conf = cfg()
            conf["destinations"][0]["secrets"] = [{"file": str(secret_file)}]
            n.reload(notify_config(tmp_path / "state", conf))
            await record(n, change(target="two"))
            await wait_for(lambda: len(rx.received) == 2, timeout=10)
            api = json.dumps(await n.api())
    assert rx.bad_signatures == []
    text = caplog.text + api
    for s in (a, b, c):
        assert s not in text and s.removeprefix("whsec_") not in text


def test_a_bad_or_missing_secret_is_named_by_where_it_comes_from_never_by_value(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("CAPALARM_BAD_SECRET", "whsec_!!not-base64!!")
    cfg = notify_config(
        tmp_path,
        {
            "destinations": [
                {
                    "type": "webhook",
                    "name": "w",
                    "url": "http://127.0.0.1:9/hook",
                    "secrets": [{"env": "CAPALARM_BAD_SECRET"}, {"file": str(tmp_path / "none")}],
                }
            ]
        },
    )
    with pytest.raises(ConfigError) as err:
        Notifications(cfg)
    text = str(err.value)
    assert "notifications.destinations[0] (w)" in text and "not-base64" not in text
