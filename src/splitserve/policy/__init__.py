"""Pure decisions shared by the router, the worker, the operator and the simulator.

Every policy takes frozen observations and returns a decision. No I/O, no wall clock: time comes
from the caller. The import-linter contract in pyproject.toml enforces it.
"""
