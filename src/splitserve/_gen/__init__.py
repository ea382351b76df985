"""Generated code (proto stubs). Committed; CI regenerates and fails on drift."""
