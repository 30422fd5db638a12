"""A switch's live state as the openconfig leaves the gNMI collector asks for (collectors/gnmi_paths.py).

``switch_leaves`` renders one step as {path: value} for simulator.gnmi_target's provider:
interface counters and state, negotiated speed, and per transceiver (component
"<port> transceiver", as EOS names it) the physical channels' input/output power (dBm)
and laser bias (mA), supply voltage, pre-FEC BER and case temperature. Values a scenario
blanked (missing samples, NaN readings) are left out, as a device that cannot read a
sensor leaves out the leaf.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.serve import PortView

_COUNTERS = {
    "in-octets": "port_rx_bytes_total", "out-octets": "port_tx_bytes_total",
    "in-pkts": "port_rx_packets_total", "out-pkts": "port_tx_packets_total",
    "in-errors": "port_rx_errors_total", "in-discards": "port_rx_discards_total",
    "in-fcs-errors": "port_rx_fcs_errors_total",
}
_CHANNEL = {"input-power": "optic_rx_power_dbm", "output-power": "optic_tx_power_dbm"}


def _ok(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _speed(bps: float) -> str:
    g = int(round(bps / 1e9))
    return f"SPEED_{g}GB" if g else f"SPEED_{int(round(bps / 1e6))}MB"


def switch_leaves(ports: list[PortView]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in ports:
        ifp = f"/interfaces/interface[name={v.port}]"
        for leaf, metric in _COUNTERS.items():
            x = v.counter(metric)  # an int, or a Ramp the target reads off per request
            if x is not None:
                out[f"{ifp}/state/counters/{leaf}"] = x
        downs = v.values.get("port_link_down_events_total")
        if _ok(downs):
            out[f"{ifp}/state/counters/carrier-transitions"] = 2 * int(downs)  # each down is a down and an up
        for leaf in ("out-errors", "out-discards"):
            out[f"{ifp}/state/counters/{leaf}"] = 0  # the model has no transmit-side drops
        for leaf in ("in-mac-pause-frames", "out-mac-pause-frames"):
            out[f"{ifp}/ethernet/state/counters/{leaf}"] = 0  # RoCE fabrics use PFC, not 802.3x pause
        up, admin = v.values.get("port_oper_up"), v.values.get("port_admin_up")
        if _ok(up):
            out[f"{ifp}/state/oper-status"] = "UP" if up > 0.5 else "DOWN"
        if _ok(admin):
            out[f"{ifp}/state/admin-status"] = "UP" if admin > 0.5 else "DOWN"
        out[f"{ifp}/ethernet/state/negotiated-port-speed"] = _speed(v.speed_bps)
        if not v.dom:
            continue  # DAC: no DOM leaves
        comp = f"/components/component[name={v.port} transceiver]"
        lanes = v.lanes
        for leaf, metric in _CHANNEL.items():
            for ln, x in lanes.get(metric, {}).items():
                if _ok(x):
                    out[f"{comp}/transceiver/physical-channels/channel[index={ln}]/state/{leaf}/instant"] = float(x)
        for ln, x in lanes.get("optic_tx_bias_amperes", {}).items():
            if _ok(x):
                out[f"{comp}/transceiver/physical-channels/channel[index={ln}]/state/laser-bias-current/instant"] \
                    = float(x) * 1000.0  # openconfig: mA
        volt, temp, ber = (v.values.get(m) for m in ("optic_voltage_volts", "optic_temperature_celsius",
                                                      "port_pre_fec_ber"))
        if _ok(volt):
            out[f"{comp}/transceiver/state/supply-voltage/instant"] = float(volt)
        if _ok(ber):
            out[f"{comp}/transceiver/state/pre-fec-ber/instant"] = float(ber)
        if _ok(temp):
            out[f"{comp}/state/temperature/instant"] = float(temp)
    return out
