"""Live GPU-host trees: a fake /sys and `ethtool` outputs per simulated host, rewritten each step.

Layout under ``<base>/hosts/<host>/``:

- ``sys/class/infiniband/mlx5_N/ports/1/{counters,hw_counters}/*`` (PMA counters with their
  real widths: data in 4-byte words, symbol_error 16-bit and link_downed 8-bit saturating),
  ``gid_attrs/ndevs/0`` naming the netdev;
- ``sys/class/net/<if>/{carrier_changes,operstate,flags,speed,statistics/*}``;
- ``ethtool/ethtool_S_<if>.txt`` (mlx5 ``*_phy`` names) and ``ethtool/ethtool_m_<if>.txt``
  (CMIS text as ethtool 6 prints it);
- while the fabric's clock runs, ``ethtool/ethtool_S_<if>.ramp`` instead of the ``.txt``: the ramp
  times (centiseconds of /proc/uptime) on the first line, then ``name v0 v1 ...`` for each traffic
  counter (simulator/ramp.py) and ``name v`` for the rest;
- ``bin/ethtool``: a shim that prints those files (reading each ramp off at that moment), so a
  host agent run with ``PATH=<base>/hosts/<host>/bin:$PATH`` needs no collector change.

The sysfs counters are snapshots of each step; the collector prefers ``ethtool -S`` where both
give a series, and there the traffic counters grow smoothly with the clock.

Every file is replaced atomically (write a temp file, rename), so a reader sees the old
or the new value, never a half-written one. Unchanged files are not rewritten.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.ramp import Ramp, clock

if TYPE_CHECKING:
    from simulator.serve import PortView

Runner = Callable[[list[str], float], str]
_SAT = {"symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
        "port_xmit_discards": 16}

SHIM = """#!/bin/sh
# fabricwatch simulator: `ethtool -S IF` and `ethtool -m IF` answered from the live files.
dir='{dir}'
case "$1" in
  -S) f="$dir/ethtool_S_$2.txt" ;;
  -m) f="$dir/ethtool_m_$2.txt" ;;
  *) echo "ethtool (fabricwatch sim): only -S IF and -m IF are simulated" >&2; exit 2 ;;
esac
ramp="$dir/ethtool_S_$2.ramp"
if [ "$1" = -S ] && [ -r "$ramp" ]; then
  # traffic counters climb between steps: read each off its ramp now (simulator/ramp.py, in centiseconds)
  read up _ < /proc/uptime
  now=${{up%.*}}${{up#*.}}
  {{
    read -r times
    echo "NIC statistics:"
    while read -r n vals; do
      set -- $vals
      v=$1; pt=
      [ $# -gt 1 ] && for t in $times; do
        if [ "$now" -lt "$t" ]; then  # on the line from ($pt, $v) to ($t, $1); a drop shows at its end
          [ -n "$pt" ] && [ "$1" -ge "$v" ] && v=$(( v + ($1 - v) * (now - pt) / (t - pt) ))
          break
        fi
        v=$1; pt=$t; shift
      done
      echo "     $n: $v"
    done
  }} < "$ramp"
  exit 0
fi
[ -r "$f" ] || {{ echo "Cannot get stats for $2: No such device" >&2; exit 1; }}
exec cat "$f"
"""


class HostTree:
    """One host's directory; ``write`` puts a step's values in place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ethtool_dir = root / "ethtool"
        self._last: dict[Path, str] = {}

    def _put(self, path: Path, text: str) -> None:
        if self._last.get(path) == text:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        self._last[path] = text

    def _drop(self, path: Path) -> None:
        if self._last.pop(path, None) is not None:
            path.unlink(missing_ok=True)

    def install_shim(self) -> Path:
        shim = self.root / "bin" / "ethtool"
        shim.parent.mkdir(parents=True, exist_ok=True)
        shim.write_text(SHIM.format(dir=str(self.ethtool_dir).replace("'", "")))
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return shim

    def write(self, ports: list[PortView]) -> int:
        """Write every NIC port; returns how many ports were written."""
        for v in ports:
            nic = v.nic or f"mlx5_{v.port.removeprefix('eth')}"
            self._rdma(nic, v)
            self._net(v)
            stats = self.ethtool_dir / f"ethtool_S_{v.port}"
            if v.times:
                self._put(stats.with_suffix(".ramp"), ethtool_stats_ramp(v))
            else:
                self._drop(stats.with_suffix(".ramp"))  # a manual step is served at once
                self._put(stats.with_suffix(".txt"), ethtool_stats_text(v))
            self._put(self.ethtool_dir / f"ethtool_m_{v.port}.txt", ethtool_module_text(v))
        return len(ports)

    def _rdma(self, nic: str, v: PortView) -> None:
        port = self.root / "sys" / "class" / "infiniband" / nic / "ports" / "1"
        c = _ints(v)
        counters = {
            "port_rcv_data": c.get("port_rx_bytes_total", 0) // 4,  # PMA counts 4-byte words
            "port_xmit_data": c.get("port_tx_bytes_total", 0) // 4,
            "port_rcv_packets": c.get("port_rx_packets_total", 0),
            "port_xmit_packets": c.get("port_tx_packets_total", 0),
            "symbol_error": c.get("port_symbol_errors_total", 0),
            "link_error_recovery": c.get("port_link_error_recovery_total", 0),
            "link_downed": c.get("port_link_down_events_total", 0),
            "port_rcv_errors": c.get("port_rx_errors_total", 0), "port_xmit_discards": 0,
        }
        for name, value in counters.items():
            bits = _SAT.get(name)
            if bits:
                value = min(value, (1 << bits) - 1)  # PMA error counters stick at all-ones
            self._put(port / "counters" / name, f"{value}\n")
        hw = {"np_ecn_marked_roce_packets": c.get("port_ecn_marked_packets_total", 0),
              "np_cnp_sent": c.get("port_cnp_sent_total", 0), "rp_cnp_handled": c.get("port_cnp_handled_total", 0),
              "out_of_sequence": 0, "out_of_buffer": 0}
        for name, value in hw.items():
            self._put(port / "hw_counters" / name, f"{value}\n")
        self._put(port / "gid_attrs" / "ndevs" / "0", f"{v.port}\n")

    def _net(self, v: PortView) -> None:
        d = self.root / "sys" / "class" / "net" / v.port
        c = _ints(v)
        up = (v.values.get("port_oper_up") or 0) > 0.5
        admin = (v.values.get("port_admin_up") or 0) > 0.5
        self._put(d / "operstate", "up\n" if up else "down\n")
        self._put(d / "flags", "0x1003\n" if admin else "0x1002\n")
        self._put(d / "speed", f"{int(v.speed_bps // 1_000_000)}\n" if up else "-1\n")
        self._put(d / "carrier_changes", f"{c.get('port_carrier_changes_total', 0)}\n")
        stats = {"rx_bytes": "port_rx_bytes_total", "tx_bytes": "port_tx_bytes_total",
                 "rx_packets": "port_rx_packets_total", "tx_packets": "port_tx_packets_total",
                 "rx_errors": "port_rx_errors_total", "rx_dropped": "port_rx_discards_total",
                 "rx_crc_errors": "port_rx_fcs_errors_total"}
        for name, metric in stats.items():
            self._put(d / "statistics" / name, f"{c.get(metric, 0)}\n")
        for name in ("tx_errors", "tx_dropped"):
            self._put(d / "statistics" / name, "0\n")


def _ints(v: PortView) -> dict[str, int]:
    return {m: int(x) for m, x in v.values.items() if m.endswith("_total") and not math.isnan(float(x))}


# (ethtool -S name, metric, scale): mlx5 physical-port counters; FEC lanes follow the first block
_STATS = [(n, m, 1.0) for n, m in (
    ("rx_bytes_phy", "port_rx_bytes_total"), ("tx_bytes_phy", "port_tx_bytes_total"),
    ("rx_packets_phy", "port_rx_packets_total"), ("tx_packets_phy", "port_tx_packets_total"),
    ("rx_crc_errors_phy", "port_rx_fcs_errors_total"), ("rx_discards_phy", "port_rx_discards_total"),
    ("rx_bits_phy", "port_rx_phy_bits_total"), ("rx_corrected_bits_phy", "port_fec_corrected_bits_total"),
    ("rx_fec_corrected_blocks_phy", "port_fec_corrected_codewords_total"),
    ("rx_fec_uncorrectable_blocks_phy", "port_fec_uncorrectable_codewords_total"),
    ("rx_pcs_symbol_err_phy", "port_symbol_errors_total"), ("link_down_events_phy", "port_link_down_events_total"))]
_PFC = [  # PFC on priority 3; pause durations in microseconds
    ("rx_prio3_pause", "port_pfc_rx_pause_frames_total", 1.0),
    ("rx_prio3_pause_duration", "port_pfc_rx_pause_seconds_total", 1e6),
    ("tx_prio3_pause", "port_pfc_tx_pause_frames_total", 1.0),
    ("tx_prio3_pause_duration", "port_pfc_tx_pause_seconds_total", 1e6),
    ("tx_pause_storm_warning_events", "port_pause_storm_warning_events_total", 1.0),
    ("tx_pause_storm_error_events", "port_pause_storm_error_events_total", 1.0),
]


def ethtool_stats_rows(v: PortView) -> list[tuple[str, int | Ramp]]:
    """`ethtool -S` rows as mlx5 names them: physical-port counters, FEC per lane, PFC on priority 3."""
    rows = [(n, v.counter(m, scale=k)) for n, m, k in _STATS]
    rows += [(f"rx_err_lane_{ln}_phy", v.counter("port_fec_lane_errors_total", ln))
             for ln in sorted(v.lanes.get("port_fec_lane_errors_total", {}))]
    for n, m, k in _PFC:
        x = v.counter(m, scale=k)
        rows.append((n, 0 if x is None and n.endswith("_duration") else x))  # mlx5 always prints durations
    return [(n, x) for n, x in rows if x is not None]


def ethtool_stats_text(v: PortView) -> str:
    """`ethtool -S` as mlx5 prints it, with the step's values."""
    rows = ethtool_stats_rows(v)
    return "NIC statistics:\n" + "".join(f"     {n}: {x.values[-1] if isinstance(x, Ramp) else x}\n"
                                          for n, x in rows)


def ethtool_stats_ramp(v: PortView) -> str:
    """The `.ramp` file the shim reads `ethtool -S` from while the clock runs."""
    head = " ".join(str(int(t * 100)) for t in v.times)
    return head + "\n" + "".join(f"{n} {' '.join(map(str, x.values)) if isinstance(x, Ramp) else x}\n"
                                  for n, x in ethtool_stats_rows(v))


def ramp_stats_text(ramp: str, now: float) -> str:
    """What the shim prints for a `.ramp` file at ramp-clock time `now` (s): each counter read off then."""
    head, *rows = ramp.splitlines()
    times = tuple(int(x) / 100 for x in head.split())
    out = []
    for row in rows:
        name, *vals = row.split()
        x = Ramp(times, tuple(map(int, vals))).at(now) if len(vals) > 1 else vals[0]
        out.append(f"     {name}: {x}\n")
    return "NIC statistics:\n" + "".join(out)


def _mw(dbm: float) -> str:
    mw = 0.0 if dbm <= -40.0 else 10 ** (dbm / 10)
    return f"{mw:.4f} mW / {10 * math.log10(mw):.2f} dBm" if mw > 0 else "0.0000 mW / -inf dBm"


_IDENT = {"QSFP28": "0x11 (QSFP28)", "QSFP-DD": "0x18 (QSFP-DD Double Density 8X Pluggable Transceiver (INF-8628))",
          "OSFP": "0x19 (OSFP 8X Pluggable Transceiver)"}


def ethtool_module_text(v: PortView) -> str:
    """`ethtool -m` text as ethtool 6 prints it for the module's form factor (the lines the parser reads)."""
    o = v.optic or {}
    ident = _IDENT.get(str(o.get("form_factor")), _IDENT["QSFP-DD"])
    lines = [("Identifier", ident),
             ("Vendor name", o.get("vendor") or "Simulated"), ("Vendor PN", o.get("part_number") or "SIM"),
             ("Vendor SN", o.get("serial") or "SIM0000")]
    if not v.dom:
        lines.append(("Optical diagnostics support", "No"))
        return "".join(f"{k:<42}: {x}\n" for k, x in lines)
    temp, volt = v.values.get("optic_temperature_celsius"), v.values.get("optic_voltage_volts")
    if temp is not None and not math.isnan(temp):
        lines.append(("Module temperature", f"{temp:.2f} degrees C / {temp * 9 / 5 + 32:.2f} degrees F"))
    if volt is not None and not math.isnan(volt):
        lines.append(("Module voltage", f"{volt:.4f} V"))
    cmis = not ident.startswith("0x11")  # SFF-8636 (QSFP28) prints other key names than CMIS
    keys = (("Laser tx bias current", "Transmit avg optical power", "Rcvr signal avg optical power") if cmis
            else ("Laser bias current", "Laser output power", "Receiver signal average optical power"))
    for key, metric in zip(keys, ("optic_tx_bias_amperes", "optic_tx_power_dbm", "optic_rx_power_dbm"),
                           strict=True):
        for ln, x in sorted(v.lanes.get(metric, {}).items()):
            if math.isnan(x):
                continue  # an unreadable lane is left out rather than printed as a number
            val = f"{x * 1000:.3f} mA" if metric == "optic_tx_bias_amperes" else _mw(x)
            lines.append((f"{key} (Channel {ln + 1})", val))
    return "".join(f"{k:<42}: {x}\n" for k, x in lines)


def ethtool_runner(ethtool_dir: Path) -> Runner:
    """A host-collector runner that answers `ethtool -S/-m IF` from the files (no subprocess)."""

    def run(cmd: list[str], timeout_s: float) -> str:
        from collectors.base import CollectError

        if len(cmd) == 3 and Path(cmd[0]).name == "ethtool" and cmd[1] in ("-S", "-m"):
            ramp = ethtool_dir / f"ethtool_S_{cmd[2]}.ramp"
            if cmd[1] == "-S" and ramp.is_file():
                return ramp_stats_text(ramp.read_text(), clock())
            f = ethtool_dir / f"ethtool_{cmd[1][1]}_{cmd[2]}.txt"
            if f.is_file():
                return f.read_text()
            raise CollectError(f"exit status 1: Cannot get stats for {cmd[2]}: No such device")
        raise CollectError(f"exit status 2: not simulated: {' '.join(cmd)}")

    return run
