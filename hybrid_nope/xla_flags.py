"""Edits to XLA_FLAGS, which jax reads once, when its backend starts: callers edit it before that
(a launcher splitting the CPU host into devices, a benchmark, a test's subprocess)."""
import os

HOST_DEVICE_COUNT = "--xla_force_host_platform_device_count"


def with_flag(flags: str, name: str, value: object = None) -> str:
  """`flags` (a space-separated XLA_FLAGS string) with every setting of `name` replaced by
  `name=value`, or removed when `value` is None. A flag set twice would leave XLA to pick one."""
  kept = [f for f in flags.split() if f != name and not f.startswith(name + "=")]
  return " ".join(kept + ([] if value is None else [f"{name}={value}"]))


def set_in_environ(name: str, value: object = None) -> None:
  """Sets (or, with None, removes) one flag in os.environ["XLA_FLAGS"]."""
  os.environ["XLA_FLAGS"] = with_flag(os.environ.get("XLA_FLAGS", ""), name, value)
