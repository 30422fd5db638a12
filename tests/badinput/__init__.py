"""Bad-input and security tests: fuzzed API calls, property tests of the parsers, hostile sizes and strings."""

from typing import Any

import schemathesis
from fastapi import FastAPI


@schemathesis.serializer("application/x-protobuf")
def _raw_bytes(_ctx: Any, value: Any) -> bytes:
    """Remote write's body as generated (format: binary): random bytes, so the fuzzers reach its 4xx paths."""
    return value if isinstance(value, bytes) else str(value).encode()


def full_app(settings: Any) -> FastAPI:
    """The whole application, as served."""
    from service.api.app import create_app

    return create_app(settings)
