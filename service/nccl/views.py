"""NCCL endpoints: import a run, list runs and baselines, compare a run with its baseline.

POST needs `operate`: an import can open an alert (it pages on #wrong > 0) and can set a baseline,
which changes what later runs are judged against; read-only clients must not do either.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from service.api.auth import OperateScope, ReadScope
from service.api.deps import EngineDep, SettingsDep
from service.api.params import optional_time, time_query
from service.api.problems import Problem
from service.nccl import service
from service.nccl.parser import NcclParseError, parse_nccl_tests
from service.nccl.schemas import NcclBaselineRead, NcclBaselines, NcclImportRead, NcclRunDetail, NcclRuns

router = APIRouter(prefix="/api/v1/nccl", tags=["nccl"])


class BaselineSet(BaseModel):
    run_id: int
    reason: str = Field(default="", max_length=2000)


@router.post("", summary="Import one nccl-tests text output (the body, text/plain)", response_model=NcclImportRead,
             openapi_extra={"requestBody": {"required": True, "content": {"text/plain": {"schema": {
                 "type": "string", "description": "the output of one nccl-tests run"}}}}})
async def post_run(
    request: Request, engine: EngineDep, settings: SettingsDep, principal: OperateScope,
    source: Annotated[str, Query(max_length=512)] = "body",
    job: Annotated[str | None, Query(max_length=256)] = None,
    hosts: Annotated[str | None, Query(description="comma-separated hostlist; overrides the rank list")] = None,
    test: Annotated[str | None, Query(max_length=64)] = None,
    run_at: Annotated[str | None, time_query("when the run happened (default: now)")] = None,
    tolerance: Annotated[float, Query(gt=0, lt=1)] = service.DEFAULT_TOLERANCE,
) -> dict[str, Any]:
    when = optional_time(run_at, "run_at")  # a bad parameter is refused before the body is read
    body = await request.body()
    if len(body) > settings.max_body_bytes:
        raise Problem(413, "Body too large", f"body exceeds the limit of {settings.max_body_bytes} bytes")
    try:
        text_ = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Problem(400, "Malformed body", f"body is not UTF-8 at byte {exc.start}") from None
    try:
        run = parse_nccl_tests(text_, source, test=test)
    except NcclParseError as exc:
        raise Problem(422, "Unusable nccl-tests output", str(exc), line=exc.line, reason=exc.reason) from None
    host_list = [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None

    def work() -> service.ImportResult:
        with engine.begin() as conn:
            return service.import_run(conn=conn, run=run, actor=principal.name, run_at=when, job=job,
                                      hosts=host_list, tolerance=tolerance)

    try:
        res = await run_in_threadpool(work)
    except service.NcclImportError as exc:
        raise Problem(422, "Cannot store run", str(exc)) from None
    return {"run_id": res.run_id, "created": res.created, "baseline_set": res.baseline_set,
            "alert_id": res.alert_id, "linked_alert_ids": res.linked_alert_ids, "comparison": res.comparison,
            "warnings": run.warnings}


@router.get("/runs", summary="Imported runs, newest first", response_model=NcclRuns)
def get_runs(engine: EngineDep, _: ReadScope, test: str | None = None, scope: str | None = None,
             host: str | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:
    with engine.connect() as conn:
        return {"items": service.list_runs(conn=conn, test=test, scope=scope, host=host, limit=limit)}


@router.get("/runs/{run_id}", summary="One run with its per-size results", response_model=NcclRunDetail)
def get_run(run_id: int, engine: EngineDep, _: ReadScope) -> dict[str, Any]:
    with engine.connect() as conn:
        run = service.get_run(conn=conn, run_id=run_id, with_results=True)
    if run is None:
        raise Problem(404, "Not found", f"nccl run {run_id} does not exist")
    return run


@router.get("/runs/{run_id}/compare", summary="Per-size busbw against the baseline (or ?baseline_run_id=)",
            response_model=service.Comparison)
def get_compare(run_id: int, engine: EngineDep, _: ReadScope, baseline_run_id: int | None = None,
                tolerance: Annotated[float, Query(gt=0, lt=1)] = service.DEFAULT_TOLERANCE,
                min_busbw: Annotated[float, Query(ge=0)] = service.DEFAULT_MIN_BUSBW) -> dict[str, Any]:
    with engine.connect() as conn:
        try:
            cmp = service.compare(conn=conn, run_id=run_id, tolerance=tolerance, min_busbw=min_busbw,
                                  baseline_run_id=baseline_run_id)
        except LookupError as exc:
            raise Problem(404, "Not found", str(exc)) from None
    return cmp.to_dict()


@router.get("/baselines", summary="The baseline run of every (test, scope)", response_model=NcclBaselines)
def get_baselines(engine: EngineDep, _: ReadScope) -> dict[str, Any]:
    with engine.connect() as conn:
        return {"items": service.list_baselines(conn=conn)}


@router.put("/baselines", summary="Pin a run as the baseline of its (test, scope)", response_model=NcclBaselineRead)
def put_baseline(body: BaselineSet, engine: EngineDep, principal: OperateScope) -> dict[str, Any]:
    try:
        with engine.begin() as conn:
            return service.set_baseline(conn=conn, run_id=body.run_id, actor=principal.name, reason=body.reason)
    except LookupError as exc:
        raise Problem(404, "Not found", str(exc)) from None
    except service.NcclImportError as exc:
        raise Problem(409, "Not a valid baseline", str(exc)) from None
