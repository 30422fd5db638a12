"""The problems the notification destinations' endpoints answer with (webhooks and Alertmanagers alike)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import IntegrityError

from service.api.problems import Problem
from service.notify.sealing import SealError
from service.notify.urlpolicy import UrlRefused


class DestinationProblems:
    """Problems named after one kind of destination: `noun` is e.g. "webhook subscription"."""

    def __init__(self, noun: str, refused_title: str) -> None:
        self.noun, self.refused_title = noun, refused_title

    def not_found(self, ident: int) -> Problem:
        return Problem(404, "Not found", f"no {self.noun} with id {ident}")

    @contextmanager
    def on_write(self) -> Iterator[None]:
        """A create or update: a refused URL, an unusable secrets key or a taken name as its problem."""
        try:
            yield
        except UrlRefused as exc:
            raise Problem(422, self.refused_title, str(exc)) from None
        except SealError as exc:
            # The server's configuration, not the request, is at fault: the secret is not stored unsealed.
            raise Problem(503, "Secrets key not usable", str(exc)) from None
        except IntegrityError:
            raise Problem(409, "Conflict", f"another {self.noun} has this name") from None
