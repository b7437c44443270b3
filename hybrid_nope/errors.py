"""The error every launch script prints as one line: something the user passed is wrong."""

USAGE_EXIT_CODE = 2  # What argparse and absl use for a bad command line.


class UserError(ValueError):
  """A bad config key or value, path, data file or checkpoint. The message names it and says
  what was expected; `hybrid_nope.cli` prints it as one line and exits with USAGE_EXIT_CODE."""


class ConfigError(UserError):
  """A config key whose value is missing or not what is allowed; the message names the key."""


RUN_STOPPED_EXIT_CODE = 1
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for a command Ctrl-C stopped.


class RunStopped(Exception):
  """The run stopped itself for a reason its message states (e.g. a non-finite update); the
  checkpoints it leaves are good. Printed as one line, exit code RUN_STOPPED_EXIT_CODE."""
