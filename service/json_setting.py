"""Settings that the environment gives as JSON text and a config file as the structure itself."""

from __future__ import annotations

import json
from typing import Any


def json_setting(v: Any, *, expected: str) -> Any:
    """Parse `v` when it is text (empty text: `{}`); refuse what is not JSON, saying what was `expected`."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v) if v.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{expected}: {exc.msg} at character {exc.pos}") from None
