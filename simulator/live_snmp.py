"""Live SNMP agents for simulated switches: one pysnmp engine per switch, each on its own UDP port.

Why not snmpsim with rewritten recordings: snmpsim notices a changed .snmprec by its
mtime in whole seconds (``os.stat()[8]``) and trusts an index built in the same second
as the text, so two rewrites within a second serve stale or misaligned lines. Here each
agent answers from an in-memory OID table that the stepping thread swaps in whole
(one reference assignment), so every request sees one consistent step and nothing
touches the disk. All engines share one asyncio loop in one daemon thread.

``switch_table`` renders one switch's step as {oid: (type, value)} in the shape the
SNMP collector maps: IF-MIB ifTable/ifXTable (HC counters), EtherLike FCS errors,
ENTITY-MIB + ENTITY-SENSOR-MIB DOM laid out like Arista EOS (a sensor per lane under a
"Lane N for Xcvr for <port>" entity, power in watts with scale milli, precision 4),
and LLDP local/remote tables from the inventory links.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from collectors import snmp_oids as O
from simulator.ramp import Ramp, clock

if TYPE_CHECKING:
    from simulator.serve import PortView

Oid = tuple[int, ...]
Cell = tuple[str, Any]  # (ASN.1 type name, python value)

SYS = (1, 3, 6, 1, 2, 1, 1)
_U32 = (1 << 32) - 1
# ENTITY-SENSOR-MIB codes: type celsius(8), voltsDC(4), amperes(5), watts(6); scale units(9), milli(8)
_CELSIUS, _VOLTS, _AMPS, _WATTS = 8, 4, 5, 6
_UNITS, _MILLI = 9, 8
_OK, _UNAVAILABLE = 1, 2


def _counter(v: PortView, metric: str, bits: int = 64) -> Cell | None:
    x = v.counter(metric)
    if x is None:
        return None
    kind = "Counter32" if bits == 32 or v.bits.get(metric) == 32 else "Counter64"
    if isinstance(x, Ramp):
        return kind, x  # read off when asked (_Instrum._vb)
    return kind, x & _U32 if kind == "Counter32" else x


def _sensor(cells: dict[Oid, Cell], ent: int, stype: int, scale: int, prec: int, value: float) -> None:
    e = O.ENT_SENSOR_ENTRY
    ok = not math.isnan(value)
    cells[(*e, O.SENSOR_TYPE, ent)] = ("Integer", stype)
    cells[(*e, O.SENSOR_SCALE, ent)] = ("Integer", scale)
    cells[(*e, O.SENSOR_PRECISION, ent)] = ("Integer", prec)
    cells[(*e, O.SENSOR_VALUE, ent)] = ("Integer", int(round(value * 10**prec)) if ok else 0)
    cells[(*e, O.SENSOR_STATUS, ent)] = ("Integer", _OK if ok else _UNAVAILABLE)


def _entity(cells: dict[Oid, Cell], ent: int, descr: str, parent: int, cls: int) -> None:
    e = O.ENT_PHYS_ENTRY
    cells[(*e, O.ENT_DESCR, ent)] = ("OctetString", descr.encode())
    cells[(*e, O.ENT_CONTAINED_IN, ent)] = ("Integer", parent)
    cells[(*e, O.ENT_CLASS, ent)] = ("Integer", cls)
    cells[(*e, O.ENT_NAME, ent)] = ("OctetString", b"")


def dbm_to_watts(dbm: float) -> float:
    return 10 ** (dbm / 10) / 1000.0


def switch_table(device: str, ports: list[PortView], *, uptime_ticks: int,
                 last_change: dict[str, int]) -> dict[Oid, Cell]:
    """One switch's step as OID cells. ifIndex = 1-based position in the inventory's port list."""
    cells: dict[Oid, Cell] = {
        (*SYS, 1, 0): ("OctetString", f"fabricwatch simulated switch {device}".encode()),
        (*SYS, 3, 0): ("TimeTicks", uptime_ticks & _U32),
        (*SYS, 5, 0): ("OctetString", device.encode()),
    }
    _entity(cells, 1, f"{device} Chassis", 0, 3)
    for k, v in enumerate(ports, start=1):
        up, admin = v.values.get("port_oper_up"), v.values.get("port_admin_up")
        ife, ifx = O.IF_ENTRY, O.IFX_ENTRY
        cells[(*ife, O.IF_DESCR, k)] = ("OctetString", v.port.encode())
        cells[(*ife, O.IF_TYPE, k)] = ("Integer", 6)  # ethernetCsmacd
        if admin is not None:
            cells[(*ife, O.IF_ADMIN, k)] = ("Integer", 1 if admin > 0.5 else 2)
        if up is not None:
            cells[(*ife, O.IF_OPER, k)] = ("Integer", 1 if up > 0.5 else 2)
        cells[(*ife, O.IF_LAST_CHANGE, k)] = ("TimeTicks", last_change.get(v.port, 0) & _U32)
        for col, metric in ((O.IF_IN_DISCARDS, "port_rx_discards_total"), (O.IF_IN_ERRORS, "port_rx_errors_total")):
            c = _counter(v, metric, 32)  # ifTable counters are 32-bit by definition
            if c:
                cells[(*ife, col, k)] = c
        cells[(*ife, O.IF_OUT_DISCARDS, k)] = ("Counter32", 0)
        cells[(*ife, O.IF_OUT_ERRORS, k)] = ("Counter32", 0)
        cells[(*ifx, O.IFX_NAME, k)] = ("OctetString", v.port.encode())
        for col, metric in ((O.IFX_HC_IN_OCTETS, "port_rx_bytes_total"), (O.IFX_HC_IN_UCAST, "port_rx_packets_total"),
                            (O.IFX_HC_OUT_OCTETS, "port_tx_bytes_total"),
                            (O.IFX_HC_OUT_UCAST, "port_tx_packets_total")):
            c = _counter(v, metric)
            if c:
                cells[(*ifx, col, k)] = c
        for col in (O.IFX_HC_IN_MCAST, O.IFX_HC_IN_BCAST, O.IFX_HC_OUT_MCAST, O.IFX_HC_OUT_BCAST):
            cells[(*ifx, col, k)] = ("Counter64", 0)
        cells[(*ifx, O.IFX_HIGH_SPEED, k)] = ("Gauge32", int(v.speed_bps // 1_000_000))
        fcs = _counter(v, "port_rx_fcs_errors_total", 32)
        if fcs:
            cells[(*O.DOT3_ENTRY, O.DOT3_FCS_ERRORS, k)] = fcs
        _dom(cells, k, v)
        _lldp(cells, k, v)
    return cells


def _dom(cells: dict[Oid, Cell], k: int, v: PortView) -> None:
    """Arista EOS numbering: slot 1003kk000, xcvr +100, temp +201, volt +202, lane L at +210+10L."""
    if not v.dom:
        return  # DAC: no optical monitoring, no sensors (as on EOS)
    slot = 100_300_000 + k * 1000
    xcvr = slot + 100
    _entity(cells, slot, f"Xcvr Slot {k}", 1, 5)
    _entity(cells, xcvr, f"Xcvr for {v.port}", slot, 10)
    temp, volt = v.values.get("optic_temperature_celsius"), v.values.get("optic_voltage_volts")
    if temp is not None:
        _entity(cells, xcvr + 101, f"DOM Temperature Sensor for {v.port}", xcvr, 8)
        _sensor(cells, xcvr + 101, _CELSIUS, _UNITS, 1, temp)
    if volt is not None:
        _entity(cells, xcvr + 102, f"DOM Voltage Sensor for {v.port}", xcvr, 8)
        _sensor(cells, xcvr + 102, _VOLTS, _UNITS, 2, volt)
    rx, tx, bias = (v.lanes.get(m, {}) for m in ("optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes"))
    for ln in sorted(rx.keys() | tx.keys() | bias.keys()):
        lane = xcvr + 110 + 10 * ln
        _entity(cells, lane, f"Lane {ln} for Xcvr for {v.port}", xcvr, 9)
        if ln in bias:
            _entity(cells, lane + 1, f"DOM TX Bias Sensor for {v.port}", lane, 8)
            _sensor(cells, lane + 1, _AMPS, _MILLI, 2, bias[ln] * 1000.0)
        if ln in tx:
            _entity(cells, lane + 2, f"DOM TX Power Sensor for {v.port}", lane, 8)
            _sensor(cells, lane + 2, _WATTS, _MILLI, 4, dbm_to_watts(tx[ln]) * 1000.0)
        if ln in rx:
            _entity(cells, lane + 3, f"DOM RX Power Sensor for {v.port}", lane, 8)
            _sensor(cells, lane + 3, _WATTS, _MILLI, 4, dbm_to_watts(rx[ln]) * 1000.0)


def _lldp(cells: dict[Oid, Cell], k: int, v: PortView) -> None:
    loc, rem = O.LLDP_LOC_PORT_ENTRY, O.LLDP_REM_ENTRY
    cells[(*loc, O.LLDP_LOC_PORT_ID, k)] = ("OctetString", v.port.encode())
    cells[(*loc, O.LLDP_LOC_PORT_DESC, k)] = ("OctetString", v.port.encode())
    if (v.values.get("port_oper_up") or 0) < 0.5:
        return  # no LLDPDUs cross a down link (real agents age the entry out after the TTL)
    idx = (0, k, 1)  # timeMark, localPortNum, index
    cells[(*rem, O.LLDP_REM_CHASSIS_ID, *idx)] = ("OctetString", v.peer_device.encode())
    cells[(*rem, O.LLDP_REM_PORT_ID_SUBTYPE, *idx)] = ("Integer", 5)  # interfaceName
    cells[(*rem, O.LLDP_REM_PORT_ID, *idx)] = ("OctetString", v.peer_port.encode())
    cells[(*rem, O.LLDP_REM_PORT_DESC, *idx)] = ("OctetString", v.peer_port.encode())
    cells[(*rem, O.LLDP_REM_SYS_NAME, *idx)] = ("OctetString", v.peer_device.encode())


class OidTable:
    """An immutable, sorted snapshot of one agent's OIDs."""

    def __init__(self, cells: dict[Oid, Cell]) -> None:
        self.cells = cells
        self.keys = sorted(cells)

    def get(self, oid: Oid) -> Cell | None:
        return self.cells.get(oid)

    def next(self, oid: Oid) -> tuple[Oid, Cell] | None:
        i = bisect.bisect_right(self.keys, oid)
        if i >= len(self.keys):
            return None
        k = self.keys[i]
        return k, self.cells[k]


# a manager quiet this long has finished its walk; its next request starts a new one
WALK_GAP_S = 1.0


class _Instrum:
    """What pysnmp's command responders call instead of a MIB tree: reads from the current table.

    The traffic counters of one walk are read at the moment the walk began (its manager's first
    request), as an agent that refreshes its counter cache every few seconds serves a walk from one
    cache. A collector stamps the whole walk with its start, and a walk that takes a second or two
    on a busy machine would otherwise read its later tables well after that stamp.
    """

    def __init__(self, types: dict[str, Callable[[Any], Any]], exc: Any) -> None:
        self.table = OidTable({})
        self._types, self._exc = types, exc
        self._walks: dict[Any, tuple[float, float]] = {}  # manager address -> (walk began, last request)

    def _walk_time(self, ctx: dict[str, Any]) -> float:
        now = clock()
        try:
            request = ctx["snmpEngine"].observer.get_execution_context("rfc3412.receiveMessage:request")
            manager = tuple(request["transportAddress"])
        except (KeyError, TypeError, AttributeError):
            return now
        began, last = self._walks.get(manager, (now, -math.inf))
        if now - last > WALK_GAP_S:
            began = now
            self._walks = {m: w for m, w in self._walks.items() if now - w[1] <= WALK_GAP_S}  # forget old walks
        self._walks[manager] = (began, now)
        return began

    def _vb(self, name: Oid, cell: Cell | None, missing: Any, at: float) -> tuple[Any, Any]:
        oid = self._types["ObjectName"](name)
        if cell is None:
            return oid, missing
        value = cell[1]
        if isinstance(value, Ramp):  # a traffic counter: its value when the walk began
            value = value.at(at) & _U32 if cell[0] == "Counter32" else value.at(at)
        return oid, self._types[cell[0]](value)

    def read_variables(self, *var_binds: Any, **ctx: Any) -> list[tuple[Any, Any]]:
        t, at = self.table, self._walk_time(ctx)
        return [self._vb(tuple(n), t.get(tuple(n)), self._exc.noSuchInstance, at) for n, _ in var_binds]

    def read_next_variables(self, *var_binds: Any, **ctx: Any) -> list[tuple[Any, Any]]:
        t, at, out = self.table, self._walk_time(ctx), []
        for n, _ in var_binds:
            hit = t.next(tuple(n))
            out.append(self._vb(*hit, None, at) if hit else self._vb(tuple(n), None, self._exc.endOfMibView, at))
        return out

    def write_variables(self, *var_binds: Any, **_ctx: Any) -> list[tuple[Any, Any]]:
        from pysnmp.smi import error

        raise error.NotWritableError(idx=0)


class SnmpAgents:
    """v2c agents on 127.0.0.1, one UDP port per switch, served from one asyncio thread."""

    def __init__(self, devices: list[str], community: str) -> None:
        self.devices = devices
        self.community = community
        self.ports: dict[str, int] = {}
        self._instrum: dict[str, _Instrum] = {}
        self._engines: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._socks: list[socket.socket] = []

    def start(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)  # pysnmp's transports bind to the current loop
            self._loop = loop
            try:
                for d in self.devices:
                    self._add(d)
            except BaseException as exc:  # report to start(), then end the thread
                failure.append(exc)
                ready.set()
                return
            loop.call_soon(ready.set)
            loop.run_forever()
            for e in self._engines:
                e.close_dispatcher()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

        self._thread = threading.Thread(target=run, name="fw-sim-snmp", daemon=True)
        self._thread.start()
        ready.wait(60)
        if failure:
            self._thread.join(5)
            raise RuntimeError(f"SNMP agents failed to start: {failure[0]!r}") from failure[0]

    def _add(self, device: str) -> None:
        from pysnmp.carrier.asyncio.dgram import udp
        from pysnmp.entity import config, engine
        from pysnmp.entity.rfc3413 import cmdrsp, context
        from pysnmp.proto import rfc1902, rfc1905

        eng = engine.SnmpEngine()
        # pre-bound socket: the OS picks a free port and nobody can take it between pick and bind
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        self._socks.append(sock)
        config.add_transport(eng, udp.DOMAIN_NAME, udp.UdpAsyncioTransport().open_server_mode(sock=sock))
        config.add_v1_system(eng, f"area-{len(self._engines)}", self.community)
        config.add_vacm_user(eng, 2, f"area-{len(self._engines)}", "noAuthNoPriv", (1,), ())
        types: dict[str, Callable[[Any], Any]] = {
            "ObjectName": rfc1902.ObjectName, "Integer": rfc1902.Integer32, "OctetString": rfc1902.OctetString,
            "Counter32": rfc1902.Counter32, "Counter64": rfc1902.Counter64, "Gauge32": rfc1902.Gauge32,
            "TimeTicks": rfc1902.TimeTicks, "ObjectIdentifier": rfc1902.ObjectIdentifier,
        }
        instrum = _Instrum(types, rfc1905)
        ctx = context.SnmpContext(eng)
        ctx.unregister_context_name(b"")
        ctx.register_context_name(b"", instrum)  # type: ignore[arg-type]
        cmdrsp.GetCommandResponder(eng, ctx)
        cmdrsp.NextCommandResponder(eng, ctx)
        bulk = cmdrsp.BulkCommandResponder(eng, ctx)
        bulk.max_varbinds = 256  # pysnmp's default 64 would cut the collector's 250-varbind GETBULKs
        cmdrsp.SetCommandResponder(eng, ctx)
        eng.transport_dispatcher.job_started(1)  # keep the dispatcher alive without a pending request
        self._engines.append(eng)
        self._instrum[device] = instrum
        self.ports[device] = int(sock.getsockname()[1])

    def publish(self, device: str, cells: dict[Oid, Cell]) -> None:
        """Swap in a new table; requests in flight finish on the old one."""
        self._instrum[device].table = OidTable(cells)

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        for s in self._socks:
            s.close()
        self._socks.clear()
