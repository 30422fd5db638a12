"""Bad-input and security tests: fuzzed API calls, property tests of the parsers, hostile sizes and strings."""

from typing import Any

from fastapi import FastAPI


def full_app(settings: Any) -> FastAPI:
    """create_app plus the inventory router where create_app does not include it yet."""
    from service.api.app import create_app
    from service.inventory.views import router as inventory_router

    app = create_app(settings)
    if not any(getattr(r, "path", "") == "/api/v1/devices" for r in app.routes):
        app.include_router(inventory_router)
    return app
