"""The suite runs with eight CPU devices, set before JAX starts (tests/conftest.py
imports this first), so that sharded programs and `shard_map` are tested on a
machine without accelerators; single-device programs still run on the first."""

import os

DEVICES = 8
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}"
    os.environ["XLA_FLAGS"] = flags.strip()
