"""Read the inventory YAML into `schemas.Inventory`, with errors that name file, line and field.

Every problem becomes one `InventoryProblem` (file, 1-based line, field path such as
``devices[3].ports[12].optic.thresholds.rx_power_dbm``, reason). All problems found in one
pass are raised together as one `InventoryError`, so a user fixes a file in one round.

Lines come from the YAML node tree (marks), which we keep until validation is over; no
per-field index is built, so a 300k-port file costs no more memory than its node tree.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from service.inventory.schemas import PORT_REF_RE, Device, Endpoint, Inventory, SecretRef

# The C parser keeps marks and is ~10x faster than the pure-Python one on big fabrics.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # type: ignore[assignment]
_MERGE_TAG = "tag:yaml.org,2002:merge"

Loc = tuple[str | int, ...]
Locate = Callable[[Loc], int | None]

# Fields that hold secret references: their input is never echoed in an error, because a
# mistaken inline secret (community: public123) would otherwise land in logs and terminals.
SECRET_FIELDS = frozenset({"community", "auth_key", "priv_key", "password"})
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Column widths of models.py; checked here so a long string is a clear error, not a DB error.
_MAX_LEN: dict[str, int] = {
    "description": 1024, "pod": 128, "rack": 128, "vendor": 128, "model": 128, "mgmt_address": 256,
    "nic": 64, "part_number": 128, "serial": 128, "type": 64, "form_factor": 32, "address": 256,
}


@dataclass(frozen=True, slots=True)
class InventoryProblem:
    """One thing wrong with an inventory: where (file, line, field) and why."""

    file: str
    line: int | None
    field: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"


class InventoryError(ValueError):
    """A bad inventory. `.errors` lists every problem; str() gives one line per problem."""

    def __init__(self, errors: Iterable[InventoryProblem]) -> None:
        self.errors: list[InventoryProblem] = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def format_loc(loc: Iterable[str | int]) -> str:
    """('devices', 3, 'ports', 12, 'name') -> 'devices[3].ports[12].name'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# ---------------------------------------------------------------------------- YAML


def _key_text(node: yaml.Node) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _check_duplicate_keys(root: yaml.Node, source: str) -> list[InventoryProblem]:
    """YAML allows a repeated key and silently keeps the last; in an inventory that hides mistakes."""
    problems: list[InventoryProblem] = []
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, Loc]] = [(root, ())]
    while stack:
        node, loc = stack.pop()
        if id(node) in seen_nodes:  # aliases share nodes
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int] = {}
            for k, v in node.value:
                if k.tag == _MERGE_TAG:
                    continue
                key = _key_text(k)
                if key is None:
                    problems.append(InventoryProblem(source, k.start_mark.line + 1, format_loc(loc),
                                                     "mapping keys must be plain strings"))
                    continue
                if key in first_line:
                    problems.append(InventoryProblem(
                        source, k.start_mark.line + 1, format_loc((*loc, key)),
                        f"duplicate key {key!r} (first given at line {first_line[key]})"))
                else:
                    first_line[key] = k.start_mark.line + 1
                stack.append((v, (*loc, key)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*loc, i)) for i, item in enumerate(node.value))
    problems.sort(key=lambda p: p.line or 0)
    return problems


def _node_locator(root: yaml.Node | None) -> Locate:
    """A function giving the 1-based line of a field path: the deepest node the path reaches."""

    def locate(loc: Loc) -> int | None:
        if root is None:
            return None
        node = root
        line = node.start_mark.line + 1
        for part in loc:
            child: yaml.Node | None = None
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                for k, v in node.value:
                    if _key_text(k) == part:
                        child, line = v, k.start_mark.line + 1
                        break
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                child = node.value[part]
                line = child.start_mark.line + 1
            if child is None:
                break
            node = child
        return line

    return locate


def _no_line(loc: Loc) -> int | None:
    return None


# ---------------------------------------------------------------------------- pydantic errors


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside list[X], X | None, etc., if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (list, typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _unwrap_model(arg)
            if found is not None:
                return found
    return None


def _model_at(loc: Loc) -> type[BaseModel] | None:
    cls: type[BaseModel] | None = Inventory
    for part in loc:
        if cls is None:
            return None
        if isinstance(part, int):
            continue  # list index: same element model
        info = cls.model_fields.get(part)
        cls = _unwrap_model(info.annotation) if info is not None else None
    return cls


def _shown(value: Any) -> str:
    if isinstance(value, bool | int | float) or value is None:
        return f" (got {value!r})"
    if isinstance(value, str):
        return f" (got {value[:60]!r}{'...' if len(value) > 60 else ''})"
    return f" (got a {'mapping' if isinstance(value, dict) else 'list' if isinstance(value, list) else 'value'})"


def _reason(err: dict[str, Any]) -> str:
    kind, loc, value = err["type"], tuple(err["loc"]), err.get("input")
    secret = any(part in SECRET_FIELDS for part in loc)
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        known = sorted(parent.model_fields) if parent is not None else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else (f"; known: {', '.join(known)}" if known else "")
        return f"unknown field {loc[-1]!r}{hint}"
    if secret and kind in ("model_type", "model_attributes_type", "dict_type"):
        # Never echo the value: it is most likely the secret itself.
        return "must be a secret reference ({env: VAR} or {file: /path}), never the secret itself"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind == "literal_error" and not isinstance(value, str) and value is not None:
        msg += "; quote the value in YAML"  # e.g. `version: 3` is the number 3, not the string '3'
    if secret or kind == "value_error" or isinstance(value, dict | list):
        return msg
    return msg + _shown(value)


def _validation_problems(exc: ValidationError, source: str, locate: Locate) -> list[InventoryProblem]:
    out = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
        out.append(InventoryProblem(source, locate(loc), format_loc(loc), _reason(dict(err))))
    return out


# ---------------------------------------------------------------------------- cross-checks


def split_port_ref(ref: str, ports_by_device: dict[str, set[str]]) -> tuple[str, str] | None:
    """'leaf1:Ethernet1/1' -> ('leaf1', 'Ethernet1/1'), trying each ':' since port names may hold ':'."""
    for i, ch in enumerate(ref):
        if ch == ":":
            device, port = ref[:i], ref[i + 1:]
            if device in ports_by_device and port in ports_by_device[device]:
                return device, port
    return None


def _strings(obj: BaseModel, loc: Loc) -> Iterator[tuple[Loc, str, str]]:
    """Every (path, field name, string value) in a model tree."""
    for name in type(obj).model_fields:
        value = getattr(obj, name)
        if isinstance(value, str):
            yield (*loc, name), name, value
        elif isinstance(value, BaseModel):
            yield from _strings(value, (*loc, name))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _strings(item, (*loc, name, i))


def _check_secret(ref: SecretRef | None, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if ref is None:
        return
    if ref.env is not None and not ENV_NAME_RE.match(ref.env):
        yield (*loc, "env"), f"{ref.env!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
    if ref.file is not None and not ref.file.startswith("/"):
        # Collectors run elsewhere and later; a relative path would resolve against their cwd.
        yield (*loc, "file"), f"secret file path {ref.file!r} must be absolute"


def _check_endpoint(ep: Endpoint, loc: Loc) -> Iterator[tuple[Loc, str]]:
    yield from _check_secret(ep.community, (*loc, "community"))
    yield from _check_secret(ep.password, (*loc, "password"))
    if ep.v3 is not None:
        yield from _check_secret(ep.v3.auth_key, (*loc, "v3", "auth_key"))
        yield from _check_secret(ep.v3.priv_key, (*loc, "v3", "priv_key"))
    if ep.protocol != "snmp":
        for name in ("version", "community", "v3", "max_repetitions", "management_ports"):
            if getattr(ep, name) is not None:
                yield (*loc, name), f"is an SNMP setting but this endpoint's protocol is {ep.protocol!r}"
    elif ep.v3 is not None and (ep.version or "2c") != "3":
        yield (*loc, "v3"), "a 'v3' block needs version: '3'"
    if ep.protocol != "gnmi":
        for name in ("username", "password", "tls", "path_set", "mode"):
            if getattr(ep, name) is not None:
                yield (*loc, name), f"is a gNMI setting but this endpoint's protocol is {ep.protocol!r}"
    if ep.protocol != "host":
        for name in ("sysfs_root", "ethtool", "dcgm_url"):
            if getattr(ep, name) is not None:
                yield (*loc, name), f"is a host-agent setting but this endpoint's protocol is {ep.protocol!r}"
    if ep.protocol != "scrape" and ep.scrape_urls is not None:
        yield (*loc, "scrape_urls"), f"is a scrape setting but this endpoint's protocol is {ep.protocol!r}"
    if ep.password is not None and not ep.username:
        yield (*loc, "username"), "a gNMI password needs a username"


def _check_device_ports(dev: Device, loc: Loc) -> Iterator[tuple[Loc, str]]:
    for j, port in enumerate(dev.ports):
        ploc = (*loc, "ports", j)
        if port.gpu is not None:
            if dev.kind != "host":
                yield (*ploc, "gpu"), "only host ports carry a gpu index"
            elif port.gpu >= dev.gpus:
                yield (*ploc, "gpu"), (f"gpu {port.gpu} does not exist: the device declares gpus: {dev.gpus} "
                                       f"(indices 0..{dev.gpus - 1})" if dev.gpus else
                                       "gpu set but the device declares no gpus (gpus: 0)")
    seen_ep: dict[str, int] = {}
    for j, ep in enumerate(dev.endpoints):
        eloc = (*loc, "endpoints", j)
        if ep.protocol in seen_ep:
            yield (*eloc, "protocol"), (f"second {ep.protocol!r} endpoint on this device (first is "
                                        f"endpoints[{seen_ep[ep.protocol]}]); one endpoint per protocol")
        else:
            seen_ep[ep.protocol] = j
        yield from _check_endpoint(ep, eloc)


def check_inventory(inv: Inventory, *, source: str = "<inventory>",
                    locate: Locate = _no_line) -> list[InventoryProblem]:
    """The checks pydantic cannot make alone: references, uniqueness and topology sanity."""
    found: list[tuple[Loc, str]] = []

    pod_first: dict[str, int] = {}
    for i, pod in enumerate(inv.pods):
        if pod.name in pod_first:
            found.append((("pods", i, "name"), f"pod {pod.name!r} already declared (pods[{pod_first[pod.name]}])"))
        pod_first.setdefault(pod.name, i)

    dev_first: dict[str, int] = {}
    ports_by_device: dict[str, set[str]] = {}
    for i, dev in enumerate(inv.devices):
        loc: Loc = ("devices", i)
        if dev.name in dev_first:
            found.append(((*loc, "name"), f"device {dev.name!r} already declared (devices[{dev_first[dev.name]}], "
                                          f"line {locate(('devices', dev_first[dev.name]))})"))
        else:
            dev_first[dev.name] = i
            ports_by_device[dev.name] = {p.name for p in dev.ports}
        if dev.pod is not None and inv.pods and dev.pod not in pod_first:
            found.append(((*loc, "pod"), f"pod {dev.pod!r} is not declared in 'pods' "
                                         f"(declared: {', '.join(sorted(pod_first))})"))
        found.extend(_check_device_ports(dev, loc))

    for loc, name, value in _strings(inv, ()):
        if "\x00" in value:
            found.append((loc, "contains a NUL character"))
        limit = _MAX_LEN.get(name)
        if limit is not None and len(value) > limit:
            found.append((loc, f"is {len(value)} characters long; the limit is {limit}"))

    # The first declaration of a device name wins, as in ports_by_device.
    port_of = {d.name: {p.name: p for p in d.ports} for d in reversed(inv.devices)}
    used: dict[tuple[str, str], str] = {}
    for i, link in enumerate(inv.links):
        ends: list[tuple[str, str]] = []
        for side in ("a", "b"):
            ref = getattr(link, side)
            split = split_port_ref(ref, ports_by_device)
            if split is None:
                m = PORT_REF_RE.match(ref)
                device = m.group("device") if m else ref
                why = (f"device {device!r} has no port {ref[len(device) + 1:]!r}" if device in ports_by_device
                       else f"no device named {device!r}")
                found.append((("links", i, side), f"{ref!r} does not name an existing port: {why}"))
                continue
            ends.append(split)
            where = f"links[{i}].{side}"
            if split in used and not used[split].startswith(f"links[{i}]."):
                found.append((("links", i, side), f"port {ref!r} is already used by {used[split]}"))
            used.setdefault(split, where)
        if len(ends) == 2:
            if ends[0] == ends[1]:
                found.append((("links", i, "b"), f"a link must not join a port to itself ({link.a!r})"))
            else:
                pa, pb = port_of[ends[0][0]][ends[0][1]], port_of[ends[1][0]][ends[1][1]]
                if pa.rail is not None and pb.rail is not None and pa.rail != pb.rail:
                    found.append((("links", i), f"rail mismatch: {link.a!r} is on rail {pa.rail}, "
                                                f"{link.b!r} on rail {pb.rail}"))

    found.sort(key=lambda f: (locate(f[0]) or 0))
    return [InventoryProblem(source, locate(loc), format_loc(loc), why) for loc, why in found]


# ---------------------------------------------------------------------------- entry points


def load_inventory_text(text: str, source: str = "<text>") -> Inventory:
    """Parse and validate inventory YAML; raise InventoryError naming file, line and field."""
    loader = _Loader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = mark.line + 1 if mark is not None else None
            why = " ".join(x for x in (e.context, e.problem) if x) or "invalid YAML"
            raise InventoryError([InventoryProblem(source, line, "", f"YAML syntax error: {why}")]) from None
        except yaml.YAMLError as e:  # e.g. a control character the reader rejects
            raise InventoryError([InventoryProblem(source, None, "", f"YAML error: {e}")]) from None
        if root is None:
            raise InventoryError([InventoryProblem(source, 1, "", "the file is empty; expected a mapping "
                                                                  "with 'devices', 'links' and 'pods'")])
        dups = _check_duplicate_keys(root, source)
        if dups:
            raise InventoryError(dups)
        if not isinstance(root, yaml.MappingNode):
            kind = "a list" if isinstance(root, yaml.SequenceNode) else "a single value"
            raise InventoryError([InventoryProblem(source, root.start_mark.line + 1, "",
                                                   f"the inventory must be a mapping with 'devices', 'links' "
                                                   f"and 'pods' keys, not {kind}")])
        try:
            data = loader.construct_document(root)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            raise InventoryError([InventoryProblem(source, mark.line + 1 if mark else None, "",
                                                   f"YAML error: {getattr(e, 'problem', e)}")]) from None
    finally:
        loader.dispose()

    locate = _node_locator(root)
    try:
        inv = Inventory.model_validate(data)
    except ValidationError as e:
        raise InventoryError(_validation_problems(e, source, locate)) from None
    problems = check_inventory(inv, source=source, locate=locate)
    if problems:
        raise InventoryError(problems)
    return inv


def load_inventory_file(path: str | Path) -> Inventory:
    """Read, parse and validate an inventory file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError([InventoryProblem(str(p), None, "", "file not found")]) from None
    except UnicodeDecodeError as e:
        raise InventoryError([InventoryProblem(str(p), None, "", f"not UTF-8 text (byte {e.start})")]) from None
    except OSError as e:
        raise InventoryError([InventoryProblem(str(p), None, "", f"cannot read: {e.strerror}")]) from None
    return load_inventory_text(text, str(p))


def validate_inventory(inv: Inventory, source: str = "<inventory>") -> None:
    """Raise InventoryError if an already-parsed Inventory fails the cross-checks (no line numbers)."""
    problems = check_inventory(inv, source=source)
    if problems:
        raise InventoryError(problems)


def dump_inventory_yaml(inv: Inventory) -> str:
    """The inventory as YAML in the file format, defaults left out so it stays readable."""
    data = {"version": inv.version, **inv.model_dump(mode="json", exclude_defaults=True, exclude={"version"})}
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, allow_unicode=True, default_flow_style=False,
                     width=120)
