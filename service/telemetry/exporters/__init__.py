"""Exporter mappings: what Prometheus exporters expose -> the metric catalogue, with port identity
resolved against the inventory. One documented file per exporter:

- node_exporter.py: `node_network_*`, `node_ethtool_*`, `node_infiniband_*`
- dcgm_exporter.py: `DCGM_FI_*` NVLink, XID, PCIe and temperature fields
- snmp_exporter.py: the `if_mib` module and ENTITY-SENSOR-MIB DOM
- gnmic.py: gnmic's Prometheus output (OpenConfig and vendor leaves)
- native.py: series already named after the catalogue

Entry points: `Mapper().map(conn, series) -> MapResult` for batches (remote write, a scrape),
`match_series(labels)` for what one label set maps to before the inventory (mapper.py); `store_mapped`
stores a MapResult in the caller's transaction (store.py). The scrape collector (collectors/scrape.py)
maps in the worker and stores through the collectors' own store step.
docs/ecosystem.md has the tables and what stays unmapped.
"""

from service.telemetry.exporters.base import DeviceKind, Match, PortBy, Reason, Unmapped
from service.telemetry.exporters.mapper import Mapper, MapResult, match_series
from service.telemetry.exporters.resolve import InventoryIndex
from service.telemetry.exporters.store import store_mapped

__all__ = ["DeviceKind", "InventoryIndex", "MapResult", "Mapper", "Match", "PortBy", "Reason", "Unmapped",
           "match_series", "store_mapped"]
