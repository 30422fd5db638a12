"""Alert tests. `finding()` builds a detection Finding with test defaults."""

from __future__ import annotations

from typing import Any

from service.detection.findings import Action, Cause, Evidence, Finding, Severity

T0 = 1_790_000_000_000  # data time of the first cycle (ms)
STEP = 60_000


def finding(kind: str = "rx_power_degrading", device: str = "leaf-01", port: str | None = "Ethernet1/1",
            state: str = "firing", at_ms: int = T0, severity: Severity = Severity.PAGE, **kw: Any) -> Finding:
    defaults: dict[str, Any] = {
        "scope": "port" if port else "device", "lane": None, "cause": Cause.CONTAMINATION,
        "action": Action.CLEAN, "score": 3.0, "summary": f"{kind} on {device} {port or ''}".strip(),
        "evidence": [Evidence("rx_power_dbm", -9.5, baseline=-3.1, cohort=-3.0, unit="dBm")],
    }
    defaults.update(kw)
    return Finding(kind=kind, device=device, port=port, state=state, at_ms=at_ms, severity=severity, **defaults)
