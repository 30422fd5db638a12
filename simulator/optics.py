"""Pluggable module catalogue: what the simulated fabric plugs into its ports.

Spec ranges follow the datasheet table in detection.md F5. EEPROM thresholds follow
its F5 default policy: Rx low-warning = spec minimum average Rx + 1 dB, low-alarm =
minimum - 1 dB; the high side sits at the spec maximum (+1 dB for the alarm). Tx uses
the same shape around the Tx range. Part numbers are real vendor part numbers of the
module class, used only as labels; the figures are the F5 class figures, not those
vendors' own datasheets.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.inventory.schemas import Optic, Threshold, Thresholds


@dataclass(frozen=True, slots=True)
class ModuleSpec:
    type: str
    speed_gbps: int
    form_factor: str
    lanes: int
    signalling: str  # "PAM4" or "NRZ": decides the FEC limit and BER slope
    cable: str  # Cable.type of the link it makes: smf, mmf, aoc, dac
    tx_min_dbm: float
    tx_max_dbm: float
    rx_min_dbm: float
    rx_max_dbm: float
    los_dbm: float
    bias_nominal_a: float
    parts: tuple[tuple[str, str], ...]  # (vendor, part number)
    reach_m: float
    dom: bool = True  # copper (DAC) has no optical DOM

    @property
    def fec_limit_ber(self) -> float:
        # KP4 RS(544,514) for PAM4, KR4 RS(528,514) for NRZ (detection.md F10/F11)
        return 2.4e-4 if self.signalling == "PAM4" else 5e-5

    def thresholds(self) -> Thresholds:
        if not self.dom:
            return Thresholds(
                temperature_celsius=Threshold(high_alarm=75, high_warning=70, low_warning=0, low_alarm=-5),
                voltage_volts=Threshold(high_alarm=3.63, high_warning=3.465, low_warning=3.135, low_alarm=2.97),
            )
        b = self.bias_nominal_a
        return Thresholds(
            rx_power_dbm=Threshold(high_alarm=self.rx_max_dbm + 1, high_warning=self.rx_max_dbm,
                                   low_warning=self.rx_min_dbm + 1, low_alarm=self.rx_min_dbm - 1),
            tx_power_dbm=Threshold(high_alarm=self.tx_max_dbm + 1, high_warning=self.tx_max_dbm,
                                   low_warning=self.tx_min_dbm, low_alarm=self.tx_min_dbm - 1),
            tx_bias_amperes=Threshold(high_alarm=round(b * 2.0, 4), high_warning=round(b * 1.8, 4),
                                      low_warning=round(b * 0.3, 4), low_alarm=round(b * 0.2, 4)),
            temperature_celsius=Threshold(high_alarm=75, high_warning=70, low_warning=0, low_alarm=-5),
            voltage_volts=Threshold(high_alarm=3.63, high_warning=3.465, low_warning=3.135, low_alarm=2.97),
        )


def _m(type_: str, speed: int, ff: str, lanes: int, sig: str, cable: str, tx: tuple[float, float],
       rx: tuple[float, float], los: float, bias_ma: float, reach: float, parts: tuple[tuple[str, str], ...],
       dom: bool = True) -> ModuleSpec:
    return ModuleSpec(type_, speed, ff, lanes, sig, cable, tx[0], tx[1], rx[0], rx[1], los, bias_ma / 1000,
                      parts, reach, dom)


CATALOGUE: dict[str, ModuleSpec] = {m.type: m for m in [
    _m("100G-SR4", 100, "QSFP28", 4, "NRZ", "mmf", (-8.4, 2.4), (-10.3, 2.4), -30.0, 7.5, 100,
       (("Finisar", "FTLC9551REPM"), ("Cisco", "QSFP-100G-SR4-S"), ("Arista", "QSFP-100G-SR4"))),
    _m("100G-CWDM4", 100, "QSFP28", 4, "NRZ", "smf", (-6.5, 2.5), (-13.0, 2.5), -30.0, 45, 2000,
       (("Finisar", "FTLC1157RGPL"), ("Cisco", "QSFP-100G-CWDM4-S"), ("Arista", "QSFP-100G-CWDM4"))),
    _m("400G-DR4", 400, "QSFP-DD", 4, "PAM4", "smf", (-2.9, 4.0), (-5.9, 4.0), -15.0, 40, 500,
       (("Innolight", "T-DP4CNT-N00"), ("Cisco", "QDD-400G-DR4-S"), ("Arista", "QDD-400G-DR4"))),
    _m("400G-FR4", 400, "QSFP-DD", 4, "PAM4", "smf", (-3.3, 3.5), (-7.3, 3.5), -15.0, 45, 2000,
       (("Innolight", "T-DL4CNT-N00"), ("Cisco", "QDD-400G-FR4-S"), ("Arista", "QDD-400G-FR4"))),
    _m("400G-AOC", 400, "QSFP-DD", 8, "PAM4", "aoc", (-6.0, 3.0), (-8.0, 3.0), -20.0, 8, 30,
       (("NVIDIA", "MFS1S00-H010V"), ("Cisco", "QDD-400-AOC10M"), ("Arista", "AOC-D-D-400G-10M"))),
    _m("400G-DAC", 400, "QSFP-DD", 8, "PAM4", "dac", (0, 0), (0, 0), -40.0, 0, 3,
       (("NVIDIA", "MCP1660-W002E30"), ("Cisco", "QDD-400-CU2M"), ("Arista", "CAB-D-D-400G-2M")), dom=False),
    _m("800G-DR8", 800, "OSFP", 8, "PAM4", "smf", (-2.9, 4.0), (-5.9, 4.0), -15.0, 40, 500,
       (("NVIDIA", "MMS4X00-NM"), ("Innolight", "T-OP8CNT-N00"), ("Arista", "OSFP-800G-2XDR4"))),
    _m("800G-2xFR4", 800, "OSFP", 8, "PAM4", "smf", (-3.3, 3.5), (-7.3, 3.5), -15.0, 45, 2000,
       (("NVIDIA", "MMS4X50-NM"), ("Innolight", "T-OL8CNT-N00"), ("Arista", "OSFP-800G-2XFR4"))),
    _m("800G-DAC", 800, "OSFP", 8, "PAM4", "dac", (0, 0), (0, 0), -40.0, 0, 2,
       (("NVIDIA", "MCP4Y10-N002"), ("Arista", "CAB-O-O-800G-2M")), dom=False),
]}


def for_speed(speed_gbps: int) -> list[str]:
    """Module types that run at a line rate."""
    return [t for t, m in CATALOGUE.items() if m.speed_gbps == speed_gbps]


def spec(type_: str) -> ModuleSpec:
    try:
        return CATALOGUE[type_]
    except KeyError:
        raise ValueError(f"unknown module type {type_!r}; known: {', '.join(CATALOGUE)}") from None


_THRESHOLD_CACHE: dict[str, dict] = {}


def thresholds_dict(type_: str) -> dict:
    """Thresholds as a plain dict, one shared object per type (YAML writes it once, as an anchor)."""
    d = _THRESHOLD_CACHE.get(type_)
    if d is None:
        d = _THRESHOLD_CACHE[type_] = spec(type_).thresholds().model_dump(exclude_none=True)
    return d


def optic(type_: str, vendor: str, part_number: str, serial: str) -> Optic:
    m = spec(type_)
    return Optic(vendor=vendor, part_number=part_number, serial=serial, type=m.type,
                 form_factor=m.form_factor, lanes=m.lanes, thresholds=m.thresholds())
