"""`ethtool -m IF` (text or `--json`) -> DOM samples, module identity and thresholds.

Covers SFF-8472 (SFP), SFF-8636 (QSFP+/QSFP28) and CMIS (QSFP-DD/OSFP) as ethtool decodes
them. Units out: dBm for optical power, amperes for bias, celsius, volts. Lanes are 0-based
(ethtool prints "Channel 1..N"), matching `rx_err_lane_N_phy` and the switch collectors.

Decisions:
- Power is converted from the mW figure (4 decimals), not the rounded dBm one. A zero
  reading on a live module (`0.0000 mW / -inf dBm`, a dark lane) is clamped to -40 dBm: the
  EEPROM encodes power in 0.1 uW steps, so -40 dBm is the smallest non-zero value it can
  express anyway, and vendor CLIs print -40.00 for dark lanes.
- ethtool's JSON repeats keys (`module_temperature` is once the reading, once the threshold
  object), so it is decoded with `object_pairs_hook` keeping every value.
- A zero is a measurement only on a module that shows it is alive: some DOM value is not
  zero (a supply voltage, a temperature, light or bias on some lane). Then a 0.0000 mW lane
  is dark (-40 dBm) and 0 mA is a laser that is off: real signals. A dump where *every*
  value is zero (bias, Tx and Rx power, temperature and voltage) is not a reading: a
  powered module always has a supply voltage or a temperature, so its monitors were not
  read (driver, page select, module still initialising) or do not exist. Emitting it would
  report a dead laser and a dark fibre on a link that may be up.
- A module whose DOM is implausible (supply voltage far from 3.3 V, temperature off the
  scale, negative power or bias) is a bad EEPROM read, not a bad module.
- Either way the reading keeps the identity fields but drops all DOM samples and thresholds
  (they come from the same page), and says why in `warnings` (`dom_valid=False`). Raising
  ParseError would lose the identity, which is still right in such dumps; emitting the
  values would page someone about a 99 mA laser, or a dark lane, that does not exist.
- Temperature and voltage both exactly 0 next to live lanes: the module has no module-level
  monitors (CMIS makes both optional), so no temperature sample (0 C would be a reading).
- Threshold sets that are all zero mean "not programmed" and are left out; a set that is not
  ordered (low alarm <= low warning <= high warning <= high alarm) is left out with a warning.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collectors.base import ParseError
from service.telemetry.samples import Sample

DBM_FLOOR = -40.0
_QUANTITIES = ("bias", "tx_power", "rx_power", "temperature", "voltage")
_THRESHOLD_FIELD = {
    "rx_power": "rx_power_dbm",
    "tx_power": "tx_power_dbm",
    "bias": "tx_bias_amperes",
    "temperature": "temperature_celsius",
    "voltage": "voltage_volts",
}
_LEVELS = ("high_alarm", "high_warning", "low_warning", "low_alarm")
# SFF-8024 identifier byte -> form factor.
_FORM_FACTOR = {
    0x03: "SFP", 0x0C: "QSFP", 0x0D: "QSFP+", 0x11: "QSFP28", 0x18: "QSFP-DD",
    0x19: "OSFP", 0x1E: "QSFP+", 0x1F: "SFP-DD",
}
_SPEC = {0x03: "SFF-8472", 0x0C: "SFF-8636", 0x0D: "SFF-8636", 0x11: "SFF-8636"}
_CMIS_IDS = {0x18, 0x19, 0x1E, 0x1F}
VOLTAGE_RANGE_V = (2.5, 4.0)  # 3.3 V supply; anything outside is a bad read
TEMPERATURE_RANGE_C = (-50.0, 150.0)


@dataclass(slots=True)
class ModuleReading:
    """What one `ethtool -m` says: DOM samples, identity (fits schemas.Optic) and flags."""

    samples: list[Sample]
    optic: dict[str, Any]
    flags: dict[str, Any]
    spec: str = "unknown"
    dom_valid: bool = True
    warnings: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Raw:
    """Source-neutral intermediate form; text and JSON both fill it."""

    identifier: int | None = None
    vendor: str | None = None
    part_number: str | None = None
    serial: str | None = None
    type: str | None = None
    dom_supported: bool | None = None
    rx_mw: dict[int, float] = field(default_factory=dict)
    tx_mw: dict[int, float] = field(default_factory=dict)
    bias_ma: dict[int, float] = field(default_factory=dict)
    temperature_c: float | None = None
    voltage_v: float | None = None
    rx_power_type: str | None = None
    thresholds: dict[str, dict[str, float]] = field(default_factory=dict)  # native units
    flags: dict[str, Any] = field(default_factory=dict)


def mw_to_dbm(mw: float) -> float:
    """mW -> dBm, clamped at -40 dBm (zero power is a dark lane, not -inf)."""
    if not mw > 0:
        return DBM_FLOOR
    return max(DBM_FLOOR, 10.0 * math.log10(mw))


# ----------------------------------------------------------------------------- text form

# The command line before the output, with or without a shell prompt ("ethtool -m ens16f1np1")
_PROMPT_RE = re.compile(r"^(?:\S*[$#]\s*)?(sudo\s+)?ethtool\s+(?:-m|--module-info)\b")
_KV_RE = re.compile(r"^\s*([^:]+?)\s*:\s?(.*?)\s*$")
_CHAN_RE = re.compile(r"^(?P<base>.*?)\s*\((?:Channel|Chan)\s+(?P<n>\d+)\)$")
_NUM = r"(-?\d+(?:\.\d+)?)"
_MW_RE = re.compile(rf"^{_NUM} mW(?: / (?:-inf|{_NUM}) dBm)?$")
_MA_RE = re.compile(rf"^{_NUM} mA$")
_TEMP_RE = re.compile(rf"^{_NUM} degrees C(?: / {_NUM} degrees F)?$")
_VOLT_RE = re.compile(rf"^{_NUM} V$")
_HEX_RE = re.compile(r"^0x([0-9a-fA-F]{2})\b")
_FLAG_RE = re.compile(
    r"^(?P<q>laser bias current|laser output power|laser tx power|laser rx power|module temperature|"
    r"module voltage) (?P<hl>high|low) (?P<aw>alarm|warning)$"
)
_THRESH_RE = re.compile(
    r"^(?P<q>laser bias current|laser output power|laser rx power|module temperature|module voltage) "
    r"(?P<hl>high|low) (?P<aw>alarm|warning) threshold$"
)
_Q_TEXT = {
    "laser bias current": "bias", "laser output power": "tx_power", "laser tx power": "tx_power",
    "laser rx power": "rx_power", "module temperature": "temperature", "module voltage": "voltage",
}


def _num(regex: re.Pattern[str], value: str, what: str, source: str, lineno: int) -> float:
    m = regex.match(value)
    if m is None:
        raise ParseError(source, f"{what}: cannot read {value[:60]!r}", lineno)
    return float(m.group(1))


def _onoff(value: str, what: str, source: str, lineno: int) -> bool:
    if value not in ("On", "Off"):
        raise ParseError(source, f"{what}: expected On/Off, got {value[:40]!r}", lineno)
    return value == "On"


def _parse_text(text: str, source: str) -> _Raw:
    raw = _Raw()
    started = False
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if not started and _PROMPT_RE.match(stripped):
            continue
        m = _KV_RE.match(line)
        if m is None:
            why = "output truncated" if stripped in ("...", "…") else "not a 'key : value' line"
            raise ParseError(source, f"{why}: {stripped[:80]!r}", lineno)
        started = True
        key = re.sub(r"\s+", " ", m.group(1))
        value = m.group(2)
        lane: int | None = None
        cm = _CHAN_RE.match(key)
        if cm is not None:
            key, lane = cm.group("base"), int(cm.group("n")) - 1
            if lane < 0:
                raise ParseError(source, f"channel number must start at 1: {stripped[:60]!r}", lineno)
        _text_field(raw, key, lane, value, source, lineno)
    if raw.identifier is None:
        raise ParseError(source, "no 'Identifier' line: not `ethtool -m` output, or truncated before it")
    return raw


def _text_field(raw: _Raw, key: str, lane: int | None, value: str, source: str, lineno: int) -> None:
    lk = key.lower()
    lane0 = 0 if lane is None else lane
    if lk == "identifier":
        hm = _HEX_RE.match(value)
        if hm is None:
            raise ParseError(source, f"Identifier: expected 0xNN, got {value[:40]!r}", lineno)
        raw.identifier = int(hm.group(1), 16)
    elif lk == "vendor name":
        raw.vendor = raw.vendor or value or None
    elif lk == "vendor pn":
        raw.part_number = raw.part_number or value or None
    elif lk == "vendor sn":
        raw.serial = raw.serial or value or None
    elif lk == "transceiver type":
        raw.type = raw.type or value or None  # the first line is the Ethernet compliance code
    elif lk == "optical diagnostics support":
        raw.dom_supported = value == "Yes"
    elif lk in ("laser bias current", "laser tx bias current"):
        raw.bias_ma.setdefault(lane0, _num(_MA_RE, value, key, source, lineno))
    elif lk in ("laser output power", "transmit avg optical power"):
        raw.tx_mw.setdefault(lane0, _num(_MW_RE, value, key, source, lineno))
    elif lk in ("receiver signal average optical power", "rcvr signal avg optical power",
                "receiver signal oma", "rcvr signal oma"):
        raw.rx_power_type = "OMA" if "oma" in lk else "average"
        raw.rx_mw.setdefault(lane0, _num(_MW_RE, value, key, source, lineno))
    elif lk == "module temperature":
        if raw.temperature_c is None:
            raw.temperature_c = _num(_TEMP_RE, value, key, source, lineno)
    elif lk == "module voltage":
        if raw.voltage_v is None:
            raw.voltage_v = _num(_VOLT_RE, value, key, source, lineno)
    elif (fm := _FLAG_RE.match(lk)) is not None:
        name = f"{_Q_TEXT[fm.group('q')]}_{fm.group('hl')}_{fm.group('aw')}"
        on = _onoff(value, key, source, lineno)
        if lane is None:
            raw.flags[name] = on
        else:
            slot = raw.flags.setdefault(name, {})
            if isinstance(slot, dict):
                slot[lane] = on
    elif (tm := _THRESH_RE.match(lk)) is not None:
        q = _Q_TEXT[tm.group("q")]
        regex = {"bias": _MA_RE, "tx_power": _MW_RE, "rx_power": _MW_RE, "temperature": _TEMP_RE,
                 "voltage": _VOLT_RE}[q]
        level = f"{tm.group('hl')}_{tm.group('aw')}"
        raw.thresholds.setdefault(q, {}).setdefault(level, _num(regex, value, key, source, lineno))
    elif lk in ("rx loss of signal", "tx loss of signal", "rx loss of lock", "tx loss of lock", "tx fault"):
        raw.flags[lk.replace(" ", "_")] = value


# ----------------------------------------------------------------------------- JSON form


class _Pairs(list[tuple[str, Any]]):
    """A JSON object that keeps every (key, value), duplicates included."""

    def all(self, key: str) -> list[Any]:
        return [v for k, v in self if k == key]

    def first(self, key: str, pred: Callable[[Any], bool] = lambda _v: True) -> Any:
        return next((v for k, v in self if k == key and pred(v)), None)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _json_numbers(v: Any, what: str, source: str) -> dict[int, float]:
    """A scalar or per-lane list of numbers -> {lane: value}."""
    if _is_num(v):
        return {0: float(v)}
    if isinstance(v, list) and all(_is_num(x) for x in v):
        return {i: float(x) for i, x in enumerate(v)}
    raise ParseError(source, f"{what}: expected a number or a list of numbers, got {str(v)[:60]!r}")


def _parse_json(text: str, source: str) -> _Raw:
    try:
        doc = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as exc:
        raise ParseError(source, f"invalid JSON: {exc.msg}", exc.lineno) from None
    if isinstance(doc, list):
        if len(doc) != 1:
            raise ParseError(source, f"expected one module object in the JSON array, found {len(doc)}")
        doc = doc[0]
    if not isinstance(doc, _Pairs):
        raise ParseError(source, "expected a JSON object for the module")
    raw = _Raw()
    ident = doc.first("identifier")
    if not isinstance(ident, int) or isinstance(ident, bool):
        raise ParseError(source, "no integer 'identifier' field: not `ethtool --json -m` output")
    raw.identifier = ident
    for attr, key in (("vendor", "vendor_name"), ("part_number", "vendor_pn"), ("serial", "vendor_sn"),
                      ("type", "transceiver_type")):
        v = doc.first(key)
        if v is not None and not isinstance(v, str):
            raise ParseError(source, f"{key}: expected a string")
        setattr(raw, attr, (v or "").strip() or None)
    for key, target in (("laser_tx_bias_current", raw.bias_ma), ("transmit_avg_optical_power", raw.tx_mw)):
        v = doc.first(key, lambda x: not isinstance(x, _Pairs))
        if v is not None:
            target.update(_json_numbers(v, key, source))
    rx = doc.first("rx_power")
    if isinstance(rx, _Pairs):
        values = rx.first("values")
        if values is None:
            values = rx.first("value")
        if values is not None:
            raw.rx_mw.update(_json_numbers(values, "rx_power", source))
        rtype = rx.first("type")
        raw.rx_power_type = "OMA" if isinstance(rtype, str) and "OMA" in rtype else "average"
    elif rx is not None:
        raw.rx_mw.update(_json_numbers(rx, "rx_power", source))
    for key in ("module_temperature", "module_temperature_measurement"):
        v = doc.first(key, _is_num)
        if v is not None and raw.temperature_c is None:
            raw.temperature_c = float(v)
    v = doc.first("module_voltage", _is_num)
    if v is not None:
        raw.voltage_v = float(v)
    for q, key in (("bias", "laser_bias_current"), ("tx_power", "laser_output_power"),
                   ("rx_power", "laser_rx_power"), ("temperature", "module_temperature"),
                   ("voltage", "module_voltage")):
        obj = doc.first(key, lambda x: isinstance(x, _Pairs))
        if obj is None:
            continue
        for level in _LEVELS:
            tv = obj.first(f"{level}_threshold")
            if tv is None:
                continue
            if not _is_num(tv):
                raise ParseError(source, f"{key}.{level}_threshold: expected a number, got {str(tv)[:40]!r}")
            raw.thresholds.setdefault(q, {})[level] = float(tv)
    _json_flags(doc, raw, source)
    return raw


_JSON_FLAG_RE = re.compile(
    r"^(?P<q>laser_bias_current|laser_output_power|laser_tx_power|laser_rx_power|module_temperature|"
    r"module_voltage)_(?P<hl>high|low)_(?P<aw>alarm|warning)$"
)


def _json_flags(doc: _Pairs, raw: _Raw, source: str) -> None:
    for key, v in doc:
        norm = key.lower().replace(" ", "_")
        fm = _JSON_FLAG_RE.match(norm)
        if fm is not None:
            name = f"{_Q_TEXT[fm.group('q').replace('_', ' ')]}_{fm.group('hl')}_{fm.group('aw')}"
            if isinstance(v, bool):
                raw.flags[name] = v
            elif isinstance(v, list) and all(isinstance(x, bool) for x in v):
                raw.flags[name] = dict(enumerate(v))
            else:
                raise ParseError(source, f"{key}: expected a boolean or a list of booleans")
        elif norm in ("rx_loss_of_signal", "tx_loss_of_signal", "rx_loss_of_lock", "tx_loss_of_lock",
                      "tx_fault"):
            raw.flags[norm] = v


# ----------------------------------------------------------------------------- shared


def _lane_values(raw: _Raw) -> list[float]:
    return [*raw.rx_mw.values(), *raw.tx_mw.values(), *raw.bias_ma.values()]


def _no_reading(raw: _Raw) -> list[str]:
    """Why this DOM is not a reading (see the module doc); empty when it is one."""
    lanes = _lane_values(raw)
    module = [x for x in (raw.temperature_c, raw.voltage_v) if x is not None]
    if lanes + module and not any(lanes + module):
        return ["all-zero DOM: bias, Tx and Rx power, temperature and voltage all read 0, so the monitors "
                "were not read or are not implemented (a powered module has a supply voltage); 0 mW here "
                "is not a dark lane"]
    problems = []
    if any(x < 0 for x in lanes):
        problems.append("implausible DOM (bad EEPROM read?): negative optical power or bias current")
    v = raw.voltage_v
    if v is not None and v != 0 and not VOLTAGE_RANGE_V[0] <= v <= VOLTAGE_RANGE_V[1]:
        problems.append(f"implausible DOM (bad EEPROM read?): supply voltage {v:g} V is outside "
                        f"{VOLTAGE_RANGE_V[0]}..{VOLTAGE_RANGE_V[1]} V")
    t = raw.temperature_c
    if t is not None and not TEMPERATURE_RANGE_C[0] <= t <= TEMPERATURE_RANGE_C[1]:
        problems.append(f"implausible DOM (bad EEPROM read?): module temperature {t:g} C is outside "
                        f"{TEMPERATURE_RANGE_C[0]:g}..{TEMPERATURE_RANGE_C[1]:g}")
    return problems


def _to_canonical(q: str, native: float) -> float:
    if q in ("rx_power", "tx_power"):
        return round(mw_to_dbm(native), 4)
    if q == "bias":
        return round(native / 1000.0, 9)
    return native


def _thresholds(raw: _Raw, warnings: list[str]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for q in _QUANTITIES:
        native = raw.thresholds.get(q)
        if not native:
            continue
        if all(v == 0 for v in native.values()):
            continue  # not programmed
        conv = {level: _to_canonical(q, val) for level, val in native.items()}
        seq = [conv.get(lv) for lv in ("low_alarm", "low_warning", "high_warning", "high_alarm")]
        known = [x for x in seq if x is not None]
        if known != sorted(known):
            warnings.append(f"{q} thresholds are not ordered (low alarm <= low warning <= high warning <= "
                            f"high alarm): {native}; left out")
            continue
        out[_THRESHOLD_FIELD[q]] = conv
    return out


def _build(raw: _Raw, *, device: str, port: str, ts_ms: int, fmt: str) -> ModuleReading:
    ident = raw.identifier if raw.identifier is not None else -1
    spec = "CMIS" if ident in _CMIS_IDS else _SPEC.get(ident, "unknown")
    warnings: list[str] = []
    lanes = sorted(set(raw.rx_mw) | set(raw.tx_mw) | set(raw.bias_ma))
    optic: dict[str, Any] = {
        "vendor": raw.vendor, "part_number": raw.part_number, "serial": raw.serial, "type": raw.type,
        "form_factor": _FORM_FACTOR.get(ident),
    }
    if lanes and len(lanes) <= 16:
        optic["lanes"] = len(lanes)
    flags = dict(raw.flags)
    if raw.rx_power_type is not None:
        flags["rx_power_type"] = raw.rx_power_type
    problems = _no_reading(raw)
    if problems:
        warnings.extend(f"{fmt}: no DOM reading, values dropped: {p}" for p in problems)
        optic["thresholds"] = {}
        return ModuleReading([], optic, flags, spec, False, warnings)
    optic["thresholds"] = _thresholds(raw, warnings)

    def sample(metric: str, value: float, lane: int | None = None) -> Sample:
        return Sample(metric=metric, value=value, ts_ms=ts_ms, device=device, port=port, lane=lane)

    samples = [sample("optic_rx_power_dbm", round(mw_to_dbm(v), 4), ln) for ln, v in sorted(raw.rx_mw.items())]
    samples += [sample("optic_tx_power_dbm", round(mw_to_dbm(v), 4), ln) for ln, v in sorted(raw.tx_mw.items())]
    samples += [sample("optic_tx_bias_amperes", round(v / 1000.0, 9), ln) for ln, v in sorted(raw.bias_ma.items())]
    if raw.temperature_c or (raw.temperature_c == 0 and raw.voltage_v != 0):
        samples.append(sample("optic_temperature_celsius", raw.temperature_c))
    elif raw.temperature_c == 0:
        warnings.append(f"{fmt}: module temperature and supply voltage both read 0 next to live lanes: "
                        "no module-level monitors, temperature left out")
    if raw.voltage_v:  # 0 V means the module does not monitor Vcc
        samples.append(sample("optic_voltage_volts", raw.voltage_v))
    if raw.dom_supported is False and not samples:
        warnings.append(f"{fmt}: module has no optical diagnostics (DOM)")
    return ModuleReading(samples, optic, flags, spec, True, warnings)


def parse_ethtool_module(text: str, *, device: str, port: str, ts_ms: int, source: str) -> ModuleReading:
    """Parse `ethtool -m` output, text or JSON (detected from the first character)."""
    body = text.lstrip()
    if not body:
        raise ParseError(source, "empty output")
    if body[0] in "[{":
        return _build(_parse_json(text, source), device=device, port=port, ts_ms=ts_ms, fmt="ethtool --json -m")
    return _build(_parse_text(text, source), device=device, port=port, ts_ms=ts_ms, fmt="ethtool -m")
