"""Credential references (env var or file) resolved at collection time, and collector Targets.

The inventory and the database only ever hold references; the value is read here, just
before a poll, and lives only in `Target.secrets` (excluded from repr and serialisation).
Every error names the reference and never the value.
"""

from __future__ import annotations

import os
from typing import Any

from collectors.base import Target
from service.inventory import models
from service.inventory.schemas import Device, Endpoint, SecretRef

# Fields of Endpoint.config that hold references, and where the collector finds the value.
_SECRET_KEYS = {"community": "community", "password": "password"}
_V3_SECRET_KEYS = {"auth_key": "auth_key", "priv_key": "priv_key"}
# Endpoint fields with their own slot on Target, so not repeated in params.
_TARGET_FIELDS = {"protocol", "address", "port", "timeout_s", "retries"}


class SecretError(RuntimeError):
    """A secret reference could not be resolved. The message names the reference, never a value."""


def describe_ref(ref: SecretRef) -> str:
    """'env:NAME' or 'file:/path', for messages."""
    return f"env:{ref.env}" if ref.env is not None else f"file:{ref.file}"


def resolve_secret(ref: SecretRef) -> str:
    """Read the secret a reference points at; raise SecretError naming the reference on failure."""
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if value is None:
            raise SecretError(f"secret {describe_ref(ref)}: environment variable {ref.env} is not set")
        if value == "":
            raise SecretError(f"secret {describe_ref(ref)}: environment variable {ref.env} is empty")
        return value
    assert ref.file is not None  # SecretRef guarantees exactly one of env/file
    try:
        with open(ref.file, encoding="utf-8") as fh:
            value = fh.read()
    except OSError as e:
        raise SecretError(f"secret {describe_ref(ref)}: cannot read {ref.file}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise SecretError(f"secret {describe_ref(ref)}: {ref.file} is not UTF-8 text") from None
    # `echo secret > file` adds a newline that is not part of the secret.
    value = value.rstrip("\r\n")
    if value == "":
        raise SecretError(f"secret {describe_ref(ref)}: {ref.file} is empty")
    return value


def schema_endpoint(row: models.Endpoint) -> Endpoint:
    """The file-format Endpoint of a stored endpoint row."""
    return Endpoint.model_validate({**row.config, "protocol": row.protocol, "address": row.address,
                                    "port": row.port})


def target_for(endpoint: models.Endpoint | Endpoint,
               device: models.Device | Device | str | None = None) -> Target:
    """The collector Target for an endpoint, with its secrets resolved (SecretError if one fails).

    `params` are the endpoint's settings as written in the inventory, less the secret
    references and the fields that Target has its own slot for (address, port, timeout_s,
    retries). Secrets land in Target.secrets as "community", "auth_key", "priv_key", "password".
    """
    if isinstance(endpoint, models.Endpoint):
        device = device if device is not None else endpoint.device
        ep = schema_endpoint(endpoint)
    else:
        ep = endpoint
    if device is None:
        raise ValueError("target_for needs the device for a schema Endpoint")
    device_name = device if isinstance(device, str) else device.name
    name = f"{device_name}/{ep.protocol}"

    params: dict[str, Any] = ep.model_dump(mode="json", exclude=_TARGET_FIELDS | set(_SECRET_KEYS),
                                           exclude_none=True)
    secrets: dict[str, str] = {}
    try:
        for key, slot in _SECRET_KEYS.items():
            ref = getattr(ep, key)
            if ref is not None:
                secrets[slot] = resolve_secret(ref)
        if ep.v3 is not None:
            # Collectors read the v3 user and protocols as flat params, beside `version`.
            params.pop("v3", None)
            params.update(ep.v3.model_dump(mode="json", exclude=set(_V3_SECRET_KEYS)))
            for key, slot in _V3_SECRET_KEYS.items():
                secrets[slot] = resolve_secret(getattr(ep.v3, key))
    except SecretError as e:
        raise SecretError(f"target {name}: {e}") from None
    if ep.protocol == "gnmi" and ep.intervals.counters and "sample_interval_s" not in params:
        params["sample_interval_s"] = ep.intervals.counters  # the stream's SAMPLE period
    return Target(name=name, device=device_name, protocol=ep.protocol, address=ep.address, port=ep.port,
                  params=params, secrets=secrets, timeout_s=ep.timeout_s, retries=ep.retries)
