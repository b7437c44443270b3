"""Split the CPU host into devices before jax starts: the flag is read at backend start-up."""
import argparse
import os
import sys


def split_host_from_argv(flag: str, default: int) -> int:
  """Reads `flag` (e.g. "--tensor") from sys.argv and, when above 1 and jax is not yet imported,
  adds --xla_force_host_platform_device_count to XLA_FLAGS. Returns the count."""
  pre = argparse.ArgumentParser(add_help=False)
  pre.add_argument(flag, type=int, default=default)
  count = vars(pre.parse_known_args(sys.argv[1:])[0])[flag.lstrip("-").replace("-", "_")]
  if count > 1 and "jax" not in sys.modules:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={count}").strip()
  return count
