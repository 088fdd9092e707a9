"""Model backends. Only the standalone FIL output semantics live here so far."""
