"""Where an API worker's time goes under bench/load.py: loaded by every Python process started with this
folder on PYTHONPATH, and active only where FWTRACE_DIR is set. Not a test, not for production.

    PYTHONPATH=$PWD/bench/api_trace FWTRACE_DIR=/tmp/trace python bench/load.py --rates 500
    python bench/api_trace/report.py /tmp/trace

Each process (the uvicorn workers, and the bench's own process: its generator and ingest thread) appends
JSON lines to FWTRACE_DIR/trace-<pid>.jsonl, every 0.5 s from a thread of its own:
- "req": each HTTP request Starlette gets: path, server port, arrival and return (perf_counter, which is
  CLOCK_MONOTONIC: comparable across processes), and for each run_in_threadpool call in it, when it was
  submitted, started and ended in its thread, when the event loop took the result back, and the thread's CPU;
- "gc": each garbage collection: generation, wall and CPU time (of the thread that ran it);
- "lag": each time the event loop came back more than 4 ms late from a 2 ms sleep, with the CPU the whole
  process and the loop's own thread used meanwhile (the rest of a stall the process was not running);
- "objs" (only with FWTRACE_OBJECTS=1): every 5 s, the objects each generation holds. Listing them holds
  the GIL for tens of ms in a process of ~180k objects: it adds stalls of its own.
bench/load.py writes FWTRACE_DIR/client.json too: each request's kind, intended send time and latency.
"""

from __future__ import annotations

import os

if os.environ.get("FWTRACE_DIR"):
    import asyncio
    import contextvars
    import gc
    import json
    import threading
    import time
    from collections.abc import Callable
    from typing import Any

    _OUT = os.environ["FWTRACE_DIR"]
    _OBJECTS = os.environ.get("FWTRACE_OBJECTS") == "1"
    _records: list[dict[str, Any]] = []
    _lock = threading.Lock()
    _request: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("fwtrace", default=None)
    _clock = time.perf_counter

    def _record(d: dict[str, Any]) -> None:
        with _lock:
            _records.append(d)

    def _flush_forever() -> None:
        ticks = 0
        while True:
            time.sleep(0.5)
            ticks += 1
            if _OBJECTS and ticks % 10 == 0:
                _record(
                    {
                        "k": "objs",
                        "t": _clock(),
                        "frozen": gc.get_freeze_count(),
                        "gens": [len(gc.get_objects(g)) for g in range(3)],
                    }
                )
            with _lock:
                batch = _records[:]
                _records.clear()
            if batch:
                with open(f"{_OUT}/trace-{os.getpid()}.jsonl", "a") as f:
                    f.writelines(json.dumps(d) + "\n" for d in batch)

    threading.Thread(target=_flush_forever, daemon=True, name="fwtrace").start()
    _gc_start: dict[str, float] = {}

    def _on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _gc_start["t"], _gc_start["cpu"] = _clock(), time.thread_time()
        elif "t" in _gc_start:
            _record(
                {
                    "k": "gc",
                    "t": _gc_start["t"],
                    "d": _clock() - _gc_start["t"],
                    "gen": info["generation"],
                    "cpu": time.thread_time() - _gc_start["cpu"],
                }
            )

    gc.callbacks.append(_on_gc)

    # Patched before the service imports them by name (`from starlette.concurrency import run_in_threadpool`).
    import starlette.concurrency
    from starlette.applications import Starlette

    _run_in_threadpool = starlette.concurrency.run_in_threadpool

    async def _traced_run_in_threadpool(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        request, call = _request.get(), {"f": getattr(func, "__name__", "?"), "sub": _clock()}

        def timed(*a: Any, **k: Any) -> Any:
            call["s"], cpu0 = _clock(), time.thread_time()
            try:
                return func(*a, **k)
            finally:
                call["e"], call["cpu"] = _clock(), time.thread_time() - cpu0

        try:
            return await _run_in_threadpool(timed, *args, **kwargs)
        finally:
            call["back"] = _clock()
            if request is not None:
                request.setdefault("pool", []).append(call)

    starlette.concurrency.run_in_threadpool = _traced_run_in_threadpool
    _starlette_call = Starlette.__call__
    _watching: set[asyncio.AbstractEventLoop] = set()

    async def _watch_loop() -> None:
        while True:
            t, cpu0, loop_cpu0 = _clock(), time.process_time(), time.thread_time()
            await asyncio.sleep(0.002)
            late = _clock() - t - 0.002
            if late > 0.004:
                _record(
                    {
                        "k": "lag",
                        "t": t,
                        "d": late,
                        "proc": time.process_time() - cpu0,
                        "loop": time.thread_time() - loop_cpu0,
                    }
                )

    async def _traced_call(self: Starlette, scope: Any, receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        if loop not in _watching:
            _watching.add(loop)
            loop.create_task(_watch_loop())
        if scope["type"] != "http":
            await _starlette_call(self, scope, receive, send)
            return
        request = {"k": "req", "p": scope["path"], "port": (scope.get("server") or ("", 0))[1], "in": _clock()}
        token = _request.set(request)
        try:
            await _starlette_call(self, scope, receive, send)
        finally:
            request["out"] = _clock()
            _request.reset(token)
            _record(request)

    Starlette.__call__ = _traced_call  # type: ignore[method-assign]
