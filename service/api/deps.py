"""FastAPI dependencies shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from service.config import Settings


# `async def`, though nothing here waits: FastAPI runs a plain `def` dependency in its thread pool, and
# each such hop was a visible share of a cached request's CPU (docs/benchmarks.md, "Reads at 500 req/s").
async def get_engine_dep(request: Request) -> Engine:
    return request.app.state.engine


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


EngineDep = Annotated[Engine, Depends(get_engine_dep)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
