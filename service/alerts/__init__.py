"""Alerts: dedup by fingerprint, hysteresis, grouping (inhibition), silences and maintenance windows."""
