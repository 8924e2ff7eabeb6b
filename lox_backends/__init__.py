"""lox backends: where logs go (console, Parquet files, trackers), as pluggy plugins.

Filled by the backends work; the core (`lox`, `lox_core`) does not depend on it.
"""
