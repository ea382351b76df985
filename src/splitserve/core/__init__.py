"""Pure domain types shared by every part of splitserve.

Nothing here does I/O or reads the wall clock (the one exception, `clock.SystemClock`, is named in
the import-linter contract). Policy code, the simulator and the edges all build on these types.
"""
