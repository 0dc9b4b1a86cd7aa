"""Standard Webhooks signatures (https://www.standardwebhooks.com/, spec v1).

Three headers go with every request:

- ``webhook-id``: the message's idempotency key, the same on every retry, so a receiver can
  drop duplicates;
- ``webhook-timestamp``: unix seconds *of this attempt*, so a receiver can reject stale or
  replayed requests (the reference verifiers allow five minutes);
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, one per secret,
  space-separated, so a receiver that knows either the old or the new secret verifies during
  a rotation.

Secrets are ``whsec_`` + base64 of the key bytes, as the spec and its libraries write them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence

from pydantic import SecretStr

SECRET_PREFIX = "whsec_"
# The spec recommends keys of 24 to 64 bytes; shorter keys are refused rather than used.
MIN_SECRET_BYTES = 16


def decode_secret(secret: SecretStr) -> bytes:
    """The key bytes of a ``whsec_...`` secret.  The error never contains the secret."""
    text = secret.get_secret_value().strip().removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a signing secret must be 'whsec_' followed by base64") from None
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(f"a signing secret must be at least {MIN_SECRET_BYTES} bytes of key")
    return key


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def sign_headers(keys: Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp)}
    if keys:
        headers["webhook-signature"] = " ".join(signature(k, msg_id, timestamp, body) for k in keys)
    return headers
