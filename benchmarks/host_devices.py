"""Split the CPU host into devices before jax starts: the flag is read at backend start-up."""
import argparse
import sys

from hybrid_nope import xla_flags


def split_host_from_argv(flag: str, default: int) -> int:
  """Reads `flag` (e.g. "--tensor") from sys.argv and, when above 1 and jax is not yet imported,
  sets XLA_FLAGS' host device count. Returns the count."""
  pre = argparse.ArgumentParser(add_help=False)
  pre.add_argument(flag, type=int, default=default)
  count = vars(pre.parse_known_args(sys.argv[1:])[0])[flag.lstrip("-").replace("-", "_")]
  if count > 1 and "jax" not in sys.modules:
    xla_flags.set_in_environ(xla_flags.HOST_DEVICE_COUNT, count)
  return count
