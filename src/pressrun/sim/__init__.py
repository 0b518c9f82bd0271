"""Discrete-event simulator: drives the balancer's own core with virtual time."""
