"""Incidents: one per faulty link, port, host or switch, with a state machine, owner, notes and timeline."""
