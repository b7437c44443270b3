"""launch/tpu.py's command line: its flags, the gcloud commands of each subcommand, and running
them (the commands themselves are built by cloud/tpu.py's `Tpu`)."""
import argparse
import os
import shlex
import subprocess
import sys
import time

from hybrid_nope.cli import fail
from hybrid_nope.cloud import launch_checks
from hybrid_nope.cloud.tpu import Tpu, TpuArgError, relaunch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse(argv, description: str = ""):
  p = argparse.ArgumentParser(description=description,
                              formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("command", choices=["create", "setup", "run", "status", "logs", "fetch",
                                     "relaunch", "delete"])
  p.add_argument("--name", default="hybrid-nope")
  p.add_argument("--zone", default="")
  p.add_argument("--tpu-type", default="")
  p.add_argument("--runtime-version", default="")
  p.add_argument("--spot", action="store_true")
  p.add_argument("--queued", action="store_true", help="use a queued resource")
  p.add_argument("--config", default="")
  p.add_argument("--workdir", default="workdirs/run",
                 help="on every worker, relative to the repo copy; logs and metrics (worker 0)")
  p.add_argument("--dest", default="", help="fetch: where the records go on this machine")
  p.add_argument("--poll-minutes", type=float, default=5.0, help="relaunch: how often to check")
  p.add_argument("--max-relaunches", type=int, default=100)
  p.add_argument("--dry-run", action="store_true", help="print the gcloud commands only")
  args, rest = p.parse_known_args(argv)
  if rest and rest[0] == "--":
    rest = rest[1:]
  return args, tuple(rest)


def tpu_of(args) -> Tpu:
  return Tpu(args.name, args.zone, args.tpu_type, args.runtime_version, args.spot, args.queued)


def commands(args, overrides):
  tpu = tpu_of(args)
  if args.config and not os.path.exists(os.path.join(REPO, args.config)):
    raise TpuArgError(f"--config={args.config}: no such file in the repo")
  if args.command in ("run", "relaunch") and not args.config:
    raise TpuArgError(f"{args.command} needs --config=configs/NAME.py")
  if args.command in ("create", "run", "relaunch") and args.config:
    tpu.check_workdir(args.workdir)
  if args.command == "fetch" and not args.dest:
    raise TpuArgError("fetch needs --dest=DIR (where the records go on this machine)")
  tarball = "/tmp/hybrid_nope.tar.gz"

  def setup():
    return [["git", "-C", REPO, "archive", "--format=tar.gz", f"--output={tarball}", "HEAD"],
            *tpu.copy(tarball), tpu.install()]

  def run():
    return [tpu.run(args.config, args.workdir, overrides)]

  plans = {
      "create": lambda: [tpu.create(), *(setup() + run() if args.config else [])],
      "setup": setup, "run": run, "status": lambda: [tpu.status()],
      "logs": lambda: [tpu.logs()], "delete": lambda: [tpu.delete()],
      "fetch": lambda: tpu.fetch(args.workdir, args.dest),
      "relaunch": lambda: [tpu.create(), *setup(), *run()],
  }
  return plans[args.command]()


def warnings(args, overrides, repo: str) -> list[str]:
  """What would make the shipped run differ from the one meant: a started run without the data
  flags its config needs, a shipped tree with edits `git archive HEAD` leaves behind."""
  starts = args.command in ("run", "relaunch") or (args.command == "create" and args.config)
  ships = args.command in ("setup", "relaunch") or (args.command == "create" and args.config)
  found = [launch_checks.data_flags_warning(args.config, overrides, repo)
           if starts else None, launch_checks.uncommitted_warning(repo) if ships else None]
  return [w for w in found if w]


def _run(cmd):
  print(f"+ {shlex.join(cmd)}", flush=True)
  proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
  return proc.returncode, proc.stdout


def main(argv, description: str = ""):
  """launch/tpu.py: the gcloud commands of `argv`'s subcommand, printed and run in order (only
  printed with --dry-run); `relaunch` keeps a spot or queued run going until it finishes."""
  args, overrides = parse(argv, description)
  try:
    cmds = commands(args, overrides)
    for warning in warnings(args, overrides, REPO):
      print(warning, file=sys.stderr, flush=True)
    if args.command == "relaunch" and not args.dry_run:
      # The plan is [create, *start]; relaunch creates the node itself when it is needed.
      n = relaunch(tpu_of(args), cmds[1:], _run, sleep=time.sleep,
                   poll_seconds=60 * args.poll_minutes, max_relaunches=args.max_relaunches)
      print(f"the run finished after {n} relaunches")
      return
  except TpuArgError as e:
    fail(str(e))
  for cmd in cmds:
    print(shlex.join(cmd) if args.dry_run else f"+ {shlex.join(cmd)}", flush=True)
    if not args.dry_run:
      subprocess.run(cmd, check=True)
