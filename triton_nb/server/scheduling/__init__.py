"""Scheduling a checked request: the dynamic and sequence batchers, ensembles, the rate limiter, and
the futures they resolve."""
