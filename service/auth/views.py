"""GET /api/v1/auth/whoami: the presented token's name and scopes (router `router`).

The NOC page asks once, to show the ack and approve buttons only to tokens that may use them.
Hiding a button is a courtesy, not the control: every action endpoint still checks its scope.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from service.api.auth import current_principal
from service.auth.service import SCOPES, Principal

router = APIRouter(prefix="/api/v1/auth", tags=["auth"])


class WhoAmI(BaseModel):
    name: str
    scopes: list[str]           # as granted to the token
    allows: dict[str, bool]     # every scope, with what the granted ones imply (admin allows operate)


@router.get("/whoami", summary="The token's name and scopes (any valid token)")
def whoami(principal: Annotated[Principal, Depends(current_principal)]) -> WhoAmI:
    return WhoAmI(name=principal.name, scopes=list(principal.scopes),
                  allows={s: principal.allows(s) for s in SCOPES})
