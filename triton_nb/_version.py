"""The package version, in one place (the front ends report it as the server version)."""

__version__ = "0.1.0"
