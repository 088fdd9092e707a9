"""The in-kernel, Triton-compatible inference server."""
