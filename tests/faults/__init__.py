"""Fault tests: real processes on 127.0.0.1 (private PostgreSQL and Redis, snmpsim, workers) broken on purpose."""
