"""Helper modules of the tests (not tests themselves): model repositories, servers started for a
test, real Triton, waiting. Imported as ``tests.helpers.<module>`` (pytest puts the repository root on
sys.path: ``pythonpath`` in pyproject.toml)."""
