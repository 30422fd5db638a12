"""Path discovery: which request path a target really answers for each path of the set.

Targets differ in how they match a request path. Most expand a key-less list
(`/interfaces/interface/state/counters`) to every entry; some want the wildcard key
(`/interfaces/interface[name=*]/state/counters`); some answer only exact prefixes of the
paths they store, so only a parent (`/interfaces/interface`) brings anything back. We try
those forms in that order and remember, per target, the first one that returned leaves
under the wanted path (Resolutions, persisted with the target's state). A path that answers
nothing in every form is reported, and tried again after RECHECK_MS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collectors.gnmi_decode import Leaf, PathElem, format_path, normalize, parse_path

# The key of each openconfig list a path set walks through, for the wildcard form.
LIST_KEYS = {"interface": "name", "component": "name", "channel": "index", "queue": "name",
             "subinterface": "index", "subcomponent": "name"}
RECHECK_MS = 3_600_000  # a path that answered nothing is tried again after an hour


class PathRejected(Exception):
    """The target refused one request path (NOT_FOUND, INVALID_ARGUMENT, ...); others may work."""


def schema_of(path: str) -> str:
    """`/interfaces/interface[name=x]/state` -> `interfaces/interface/state` (keys and modules dropped)."""
    return "/".join(e.name for e in normalize(parse_path(path)))


def candidates(path: str) -> list[str]:
    """The path as written, its wildcard-keyed form, then its parent prefixes, nearest first."""
    elems = parse_path(path)
    out = [path]
    keyed = [PathElem(e.name, ((LIST_KEYS[e.name], "*"),)) if e.name in LIST_KEYS and not e.keys else e
             for e in elems]
    if keyed != elems:
        out.append(format_path(keyed))
    out += [format_path(elems[:n]) for n in range(len(elems) - 1, 0, -1)]
    return out


def under(leaf: Leaf, schema: str) -> bool:
    s = leaf.schema
    return s == schema or s.startswith(schema + "/")


@dataclass(slots=True)
class Resolutions:
    """wanted path -> request path that answers it ("" = nothing answered), with when it was checked."""

    paths: dict[str, str] = field(default_factory=dict)
    checked_ms: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load(cls, raw: Any) -> Resolutions:
        if not isinstance(raw, dict):
            return cls()
        paths = {str(k): str(v.get("path") or "") for k, v in raw.items() if isinstance(v, dict)}
        checked = {str(k): int(v.get("checked_ms") or 0) for k, v in raw.items() if isinstance(v, dict)}
        return cls(paths, checked)

    def dump(self) -> dict[str, dict[str, Any]]:
        return {k: {"path": v or None, "checked_ms": self.checked_ms.get(k, 0)} for k, v in sorted(self.paths.items())}

    def due(self, wanted: str, now_ms: int) -> bool:
        """True when `wanted` must be (re)discovered."""
        if wanted not in self.paths:
            return True
        return not self.paths[wanted] and now_ms - self.checked_ms.get(wanted, 0) >= RECHECK_MS


Fetch = Callable[[str], list[list[Leaf]]]  # request path -> leaves per notification (PathRejected)


@dataclass(slots=True)
class Discovered:
    leaves: dict[str, list[list[Leaf]]] = field(default_factory=dict)  # request path -> notifications
    wanted: dict[str, set[str]] = field(default_factory=dict)          # request path -> wanted schemas
    missing: list[str] = field(default_factory=list)                  # wanted paths nothing answered
    rejected: list[str] = field(default_factory=list)                 # why each candidate was refused


def resolve(wanted_paths: list[str], fetch: Fetch, res: Resolutions, *, now_ms: int) -> Discovered:
    """Fetch every wanted path through the form that answers it, discovering where needed.

    Each request path is fetched once even when several wanted paths resolve to it (a parent).
    Updates `res` in place.
    """
    out = Discovered()

    def get(req: str) -> list[list[Leaf]] | None:
        if req not in out.leaves:
            try:
                out.leaves[req] = fetch(req)
            except PathRejected as e:
                out.rejected.append(f"{req}: {e}")
                out.leaves[req] = []
                return None
        return out.leaves[req]

    def answers(req: str, schema: str) -> bool:
        got = get(req)
        return bool(got) and any(under(leaf, schema) for note in got for leaf in note)

    for wanted in wanted_paths:
        schema = schema_of(wanted)
        known = res.paths.get(wanted)
        if known and answers(known, schema):
            out.wanted.setdefault(known, set()).add(schema)
            continue
        if known == "" and not res.due(wanted, now_ms):
            out.missing.append(wanted)
            continue
        found = next((c for c in candidates(wanted) if answers(c, schema)), "")
        res.paths[wanted], res.checked_ms[wanted] = found, now_ms
        if found:
            out.wanted.setdefault(found, set()).add(schema)
        else:
            out.missing.append(wanted)
    for req in [r for r in out.leaves if r not in out.wanted]:
        del out.leaves[req]  # tried and refused or not needed: nothing to map
    return out


def relevant(d: Discovered) -> list[list[Leaf]]:
    """The fetched notifications, each cut to the leaves under the paths it was fetched for."""
    groups = []
    for req, notes in d.leaves.items():
        schemas = d.wanted.get(req, set())
        for note in notes:
            kept = [leaf for leaf in note if any(under(leaf, s) for s in schemas)]
            if kept:
                groups.append(kept)
    return groups
