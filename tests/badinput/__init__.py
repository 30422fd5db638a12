"""Bad-input and security tests: fuzzed API calls, property tests of the parsers, hostile sizes and strings."""

from typing import Any

from fastapi import FastAPI


def full_app(settings: Any) -> FastAPI:
    """The whole application, as served."""
    from service.api.app import create_app

    return create_app(settings)
