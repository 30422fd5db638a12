"""Fabric health KPIs (utilization, PFC/ECN/CNP, availability, flaps) and fault recovery times."""
