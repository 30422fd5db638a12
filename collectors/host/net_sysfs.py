"""/sys/class/net/IF: carrier changes, netdev statistics, oper/admin state and speed.

These are the kernel's netdev counters (what `ip -s link` shows). On RDMA NICs they miss
RDMA traffic, so the host collector lets `ethtool -S` physical-port counters win where both
exist; these fill in for interfaces without ethtool stats (bonds, VLANs, virtio).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from collectors.base import ParseError
from collectors.host.rdma_sysfs import parse_sysfs_value
from collectors.host.sysfs import sysfs_class_dir
from service.telemetry.samples import Sample

_STATS = {
    "rx_bytes": "port_rx_bytes_total",
    "tx_bytes": "port_tx_bytes_total",
    "rx_packets": "port_rx_packets_total",
    "tx_packets": "port_tx_packets_total",
    "rx_errors": "port_rx_errors_total",
    "tx_errors": "port_tx_errors_total",
    "rx_dropped": "port_rx_discards_total",
    "tx_dropped": "port_tx_discards_total",
    "rx_crc_errors": "port_rx_fcs_errors_total",
}
# RFC 2863 operstate strings; "unknown" (loopback, many virtual devices) and "testing" say
# nothing about the link, so they give no sample.
_OPER = {"up": 1.0, "down": 0.0, "lowerlayerdown": 0.0, "notpresent": 0.0, "dormant": 0.0}
IFF_UP = 0x1


def _read(path: Path) -> str | None:
    """File text, or None when absent or unreadable (speed on a down link gives EINVAL)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def read_net_sysfs(
    root: Path,
    *,
    device: str,
    ts_ms: int,
    interfaces: Iterable[str] | None = None,
    port_names: dict[str, str] | None = None,
    warnings: list[str] | None = None,
) -> list[Sample]:
    """Read root/sys/class/net/*; `interfaces` limits which, `port_names` renames them.

    A malformed value raises ParseError, or is skipped with a warning when `warnings` is given.
    """
    base = sysfs_class_dir(root, "net")
    if not base.is_dir():
        raise ParseError(str(base), "no /sys/class/net directory")
    names = sorted(interfaces) if interfaces is not None else sorted(p.name for p in base.iterdir())
    out: list[Sample] = []
    for ifname in names:
        ifdir = base / ifname
        if not ifdir.is_dir():
            msg = f"{ifdir}: interface not found"
            if warnings is None:
                raise ParseError(str(ifdir), "interface not found")
            warnings.append(f"net sysfs: {msg}")
            continue
        port = (port_names or {}).get(ifname, ifname)

        def add(metric: str, value: float, port: str = port) -> None:
            out.append(Sample(metric=metric, value=value, ts_ms=ts_ms, device=device, port=port))

        def counter(path: Path) -> int | None:
            text = _read(path)
            if text is None:
                return None
            try:
                return parse_sysfs_value(text, str(path))
            except ParseError as err:
                if warnings is None:
                    raise
                warnings.append(f"net sysfs: {err}")
                return None

        for fname, metric in _STATS.items():
            v = counter(ifdir / "statistics" / fname)
            if v is not None:
                add(metric, float(v))
        v = counter(ifdir / "carrier_changes")
        if v is not None:
            add("port_carrier_changes_total", float(v))
        oper = _read(ifdir / "operstate")
        if oper is not None and oper.strip() in _OPER:
            add("port_oper_up", _OPER[oper.strip()])
        flags = _read(ifdir / "flags")
        if flags is not None:
            try:
                add("port_admin_up", 1.0 if int(flags.strip(), 16) & IFF_UP else 0.0)
            except ValueError:
                if warnings is None:
                    raise ParseError(str(ifdir / "flags"), f"not a hex number: {flags.strip()[:20]!r}") from None
                warnings.append(f"net sysfs: {ifdir / 'flags'}: not a hex number")
        speed = _read(ifdir / "speed")
        if speed is not None:
            s = speed.strip()
            # -1 (or 4294967295 on old kernels) means unknown; Mb/s otherwise.
            if s.isdigit() and 0 < int(s) < 0xFFFFFFFF:
                add("port_speed_bits_per_second", int(s) * 1e6)
    return out
