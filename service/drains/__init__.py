"""Drain recommendations: target, action, topology-aware safety verdict, approval and optional execution."""
