"""Webhook secrets and routing keys sealed at rest with Fernet (docs/operations.md, "Webhook secrets").

The key comes from the environment or a file, like every other secret of fabricwatch (a reference,
never a value in the database): `FABRICWATCH_SECRETS_KEY` (comma-separated) or
`FABRICWATCH_SECRETS_KEY_FILE` (one key per line). Several keys make a MultiFernet: the first seals,
every one opens, so a key is rotated by putting the new one first, running `fabricwatch secrets
rotate`, and then dropping the old one. A sealed value is stored as `fernet:<token>`; a value without
that prefix is a plaintext one from before sealing, sealed by the next delivery round (or the rotate
command) once a key is configured. Errors name the setting or the subscription, never a value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy import Connection, bindparam, or_, select, update

from service.notify.models import WebhookSubscription

PREFIX = "fernet:"
SEALED_COLUMNS = ("secret", "routing_key")
HOW = "make a key with `fabricwatch secrets generate-key`"

subs = WebhookSubscription.__table__


class SealError(RuntimeError):
    """A value cannot be sealed or opened; the message says which setting or subscription, and why."""


def is_sealed(stored: str | None) -> bool:
    return stored is not None and stored.startswith(PREFIX)


def generate_key() -> str:
    return Fernet.generate_key().decode("ascii")


@dataclass(frozen=True, slots=True)
class Sealer:
    """The configured keys (or why there are none usable); `seal` and `open` raise SealError."""

    keys: MultiFernet | None = None
    source: str = "FABRICWATCH_SECRETS_KEY"
    error: str | None = None  # a key setting that is present but unusable

    @classmethod
    def from_settings(cls, settings: Any = None) -> Sealer:
        """The keys of FABRICWATCH_SECRETS_KEY or _FILE; a bad setting is kept as `error`, never raised here,
        so a worker with a wrong key keeps delivering what needs no key and logs why the rest fails."""
        if settings is None:
            from service.config import get_settings

            settings = get_settings()
        try:
            return cls._load(settings)
        except SealError as exc:
            return cls(error=str(exc))

    @classmethod
    def _load(cls, settings: Any) -> Sealer:
        if settings.secrets_key is not None and settings.secrets_key_file:
            raise SealError("set FABRICWATCH_SECRETS_KEY or FABRICWATCH_SECRETS_KEY_FILE, not both")
        if settings.secrets_key is not None:
            source, raw = "FABRICWATCH_SECRETS_KEY", settings.secrets_key.get_secret_value()
        elif settings.secrets_key_file:
            from service.inventory.schemas import SecretRef
            from service.inventory.secrets import SecretError, resolve_secret

            source = f"FABRICWATCH_SECRETS_KEY_FILE ({settings.secrets_key_file})"
            try:
                raw = resolve_secret(SecretRef(file=settings.secrets_key_file))
            except SecretError as exc:
                raise SealError(f"{source}: {exc}") from None
        else:
            return cls()
        keys = [k for k in re.split(r"[\s,]+", raw) if k]
        if not keys:
            raise SealError(f"{source} holds no key; {HOW}")
        fernets = []
        for i, key in enumerate(keys, 1):
            try:
                fernets.append(Fernet(key))
            except ValueError:
                raise SealError(f"{source}: key {i} of {len(keys)} is not a Fernet key (32 url-safe "
                                f"base64-encoded bytes); {HOW}") from None
        return cls(MultiFernet(fernets), source)

    @property
    def configured(self) -> bool:
        return self.keys is not None

    def _keys(self) -> MultiFernet:
        if self.error:
            raise SealError(self.error)
        if self.keys is None:
            raise SealError(f"webhook secrets are stored sealed, and neither FABRICWATCH_SECRETS_KEY nor "
                            f"FABRICWATCH_SECRETS_KEY_FILE is set; {HOW}")
        return self.keys

    def seal(self, value: str | None) -> str | None:
        if value is None:
            return None
        return PREFIX + self._keys().encrypt(value.encode()).decode("ascii")

    def open(self, stored: str | None, *, what: str = "secret", subscription: str = "?",
             owner: str = "webhook subscription") -> str | None:
        """The plaintext of a stored value (a plaintext one from before sealing passes through)."""
        if not is_sealed(stored):
            return stored
        assert stored is not None
        keys = self._keys()
        try:
            return keys.decrypt(stored[len(PREFIX):].encode()).decode()
        except InvalidToken:
            raise SealError(f"the {what} of {owner} {subscription!r} was sealed with a key that "
                            f"is not in {self.source}; put that key after the new one") from None

    def reseal(self, stored: str | None, *, what: str = "secret", subscription: str = "?",
               owner: str = "webhook subscription") -> str | None:
        """Sealed again with the first key (a plaintext value is sealed for the first time)."""
        if stored is None:
            return None
        if not is_sealed(stored):
            return self.seal(stored)
        try:
            return PREFIX + self._keys().rotate(stored[len(PREFIX):].encode()).decode("ascii")
        except InvalidToken:
            raise SealError(f"the {what} of {owner} {subscription!r} was sealed with a key that "
                            f"is not in {self.source}") from None


@dataclass(frozen=True, slots=True)
class Resealed:
    subscriptions: int
    plaintext: int  # values that were stored in plaintext and are sealed now


def reseal_subscriptions(conn: Connection, sealer: Sealer, *, plaintext_only: bool = False) -> Resealed:
    """Seal every stored secret and routing key with the first key, in the caller's transaction.

    `plaintext_only` seals just the values from before sealing and skips rows another transaction
    holds (the delivery worker's lazy pass); otherwise every value is sealed again and a value no
    key opens raises SealError naming every such subscription, before anything is written.
    """
    has_value = or_(subs.c.secret.is_not(None), subs.c.routing_key.is_not(None))
    if plaintext_only:
        has_value = or_(*(c.not_like(PREFIX + "%") for c in (subs.c.secret, subs.c.routing_key)))
    q = select(subs.c.id, subs.c.name, subs.c.secret, subs.c.routing_key).where(has_value).order_by(subs.c.id)
    rows = conn.execute(q.with_for_update(skip_locked=plaintext_only)).all()
    updates, failed, plaintext = [], [], 0
    for row in rows:
        values = {}
        for col in SEALED_COLUMNS:
            stored = getattr(row, col)
            if plaintext_only and (stored is None or is_sealed(stored)):
                values[col] = stored
                continue
            plaintext += stored is not None and not is_sealed(stored)
            try:
                values[col] = sealer.reseal(stored, what=col.replace("_", " "), subscription=row.name)
            except SealError:
                failed.append(row.name)
                break
        updates.append({"b_id": row.id, **values})
    if failed:
        names = ", ".join(repr(n) for n in dict.fromkeys(failed))
        raise SealError(f"no key in {sealer.source} opens the sealed values of webhook subscription(s) {names}; "
                        f"put the key they were sealed with after the new one")
    if updates:
        conn.execute(update(subs).where(subs.c.id == bindparam("b_id"))
                     .values(secret=bindparam("secret"), routing_key=bindparam("routing_key")), updates)
    return Resealed(len(updates), plaintext)


def reseal_alertmanagers(conn: Connection, sealer: Sealer) -> int:
    """Seal every Alertmanager destination's credential again with the first key, in the caller's transaction;
    SealError naming every destination no key opens, before anything is written."""
    from service.notify.models import AlertmanagerDestination

    dests = AlertmanagerDestination.__table__
    rows = conn.execute(select(dests.c.id, dests.c.name, dests.c.credential)
                        .where(dests.c.credential.is_not(None)).order_by(dests.c.id).with_for_update()).all()
    updates, failed = [], []
    for row in rows:
        try:
            updates.append({"b_id": row.id, "credential": sealer.reseal(
                row.credential, what="credential", subscription=row.name, owner="Alertmanager destination")})
        except SealError:
            failed.append(row.name)
    if failed:
        raise SealError(f"no key in {sealer.source} opens the credentials of Alertmanager destination(s) "
                        f"{', '.join(repr(n) for n in failed)}; put the key they were sealed with after the new one")
    if updates:
        conn.execute(update(dests).where(dests.c.id == bindparam("b_id"))
                     .values(credential=bindparam("credential")), updates)
    return len(updates)
