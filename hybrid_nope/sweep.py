"""A resumable sweep: configs x seeds, each run trained, analysed and its records packed.

A run is `ROOT/<experiment>/seed<k>` (`--config=configs/<file>:<experiment>
--config.train.seed=k`). The runner skips a run whose `sweep_done.json` exists or whose records
are already packed under `records_dir` (so a fresh clone on a new machine goes on from the
committed records), resumes a
partial one (launch/train.py resumes from the workdir's newest checkpoint, analyze.py is
rerun whole), and starts the rest. After a run finishes, its records (config, metrics,
recency, per-cluster sums, probe, analysis JSON; never checkpoints) are packed into one
`<records_dir>/<experiment>/seed<k>.tar.gz`, so results regenerate with no retraining.

Runs go `parallel` at a time, each pinned to `threads` cores of its own
(benchmarks/sweep_parallel.py measured which split is faster; docs/performance.md). A core is
claimed with a lock file that every sweep on the machine shares, so two sweeps started side by
side (say, with different --init_seeds) pin their runs to different cores.
This module runs the launch scripts as subprocesses: it imports neither train nor analysis.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import fnmatch
import glob
import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time

from hybrid_nope.run import run_config, run_dir, storage
from hybrid_nope.run.reader import RunReader, open_readonly
from concurrent import futures
from typing import Callable, Sequence

# What a run's records are: everything the results need, nothing that grows with the model
# (globs relative to the workdir; the analyses' JSON, not their figures).
SUMS_PATTERN = f"{run_dir.RECENCY_SUMS}/{run_dir.wildcard(run_dir.SUMS_FILE)}"
ANALYSIS_PATTERN = f"{run_dir.ANALYSIS}/{run_dir.wildcard(run_dir.ANALYSIS_STEP)}/*.json"
RECORD_PATTERNS = (run_dir.CONFIG, run_dir.METRICS, run_dir.RECENCY, run_dir.RECENCY_PROBE,
                   SUMS_PATTERN, ANALYSIS_PATTERN)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Run:
  config_file: str      # e.g. "configs/small.py"
  experiment: str       # the config's argument, e.g. "swa16"
  seed: int
  root: str

  @property
  def name(self) -> str:
    return f"{self.experiment}/seed{self.seed}"

  @property
  def workdir(self) -> str:
    return os.path.join(self.root, self.experiment, f"seed{self.seed}")

  @property
  def reader(self) -> RunReader:
    return open_readonly(self.workdir)

  @property
  def done(self) -> bool:
    return os.path.exists(self.reader.layout.sweep_done)


def plan(config_file: str, experiments: Sequence[str], seeds: Sequence[int],
         root: str) -> list[Run]:
  """Every (experiment, seed) run, seed-major within each experiment group as listed."""
  if not experiments or not seeds:
    raise ValueError("a sweep needs at least one experiment and one seed")
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds {list(seeds)} repeat a seed")
  return [Run(config_file, e, int(s), root) for s in seeds for e in experiments]


def commands(run: Run, python: str = sys.executable, analyze_args: Sequence[str] = (),
             train_args: Sequence[str] = (), init_seeds: int = 0,
             ablate: bool = False) -> list[list[str]]:
  """train.py (which resumes a partial run by itself), then analyze.py; `ablate`: the
  analysis also runs the causal test (--ablate=local, ablation_T<T>.json among the records).
  `execute` asks for it only where the trained run has a local mixer (`has_local_mixer`)."""
  config = f"--config={run.config_file}:{run.experiment}"
  analyze = [python, os.path.join(REPO, "launch/analyze.py"), f"--workdir={run.workdir}",
             *analyze_args]
  if init_seeds:
    analyze.append(f"--init_seeds={init_seeds}")
  if ablate:
    analyze.append("--ablate=local")
  return [[python, os.path.join(REPO, "launch/train.py"), config,
           f"--config.train.seed={run.seed}", f"--workdir={run.workdir}", *train_args], analyze]


def record_files(run: RunReader) -> list[str]:
  """The run's record files, relative to its workdir, sorted. Of the per-cluster sums only
  step 0's and the last step's are kept (~120 kB each at the small sweep's size): they pair
  init with trained, and runs with runs; the records of every step are in recency.jsonl."""
  found, rd = set(), run.layout
  for pattern in RECORD_PATTERNS:
    found |= {os.path.relpath(p, run.workdir) for p in glob.glob(rd.path(pattern))}
  sums = sorted(f for f in found if fnmatch.fnmatchcase(f, SUMS_PATTERN))
  found -= set(sums[1:-1])
  return sorted(found)


def write_pack(members: dict[str, bytes], out_path: str) -> str:
  """One reproducible .tar.gz of `members` (sorted, mtime 0 in the tar and the gzip header:
  the same records give the same bytes), written atomically."""
  buffer = io.BytesIO()
  with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9, mtime=0) as gz, \
       tarfile.open(fileobj=gz, mode="w") as tar:
    for rel in sorted(members):
      info = tarfile.TarInfo(rel)
      info.size, info.mtime = len(members[rel]), 0
      tar.addfile(info, io.BytesIO(members[rel]))
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  with open(out_path + ".tmp", "wb") as f:
    f.write(buffer.getvalue())
  os.replace(out_path + ".tmp", out_path)
  return out_path


def pack_records(run: RunReader, out_path: str) -> str:
  """Writes the run's records as one reproducible .tar.gz (sorted, mtime 0); returns its path."""
  files = record_files(run)
  if run_dir.RECENCY not in files or run_dir.METRICS not in files:
    raise FileNotFoundError(f"{run.workdir} holds no {run_dir.RECENCY} or {run_dir.METRICS}: not a "
                            "run")
  members = {}
  for rel in files:
    with open(run.layout.path(rel), "rb") as f:
      members[rel] = f.read()
  return write_pack(members, out_path)


def read_pack(pack_path: str) -> dict[str, bytes]:
  """Every member of a pack, by its path inside the run directory."""
  with tarfile.open(pack_path, "r:gz") as tar:
    return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def replace_record(pack_path: str, rel: str, data: bytes) -> str:
  """Rewrites a pack with its record `rel` replaced by `data` (a measurement rerun on the
  run's checkpoint); every other record is kept byte for byte. Refuses a record the pack lacks:
  a replacement never adds what the run did not pack."""
  members = read_pack(pack_path)
  if rel not in members:
    raise KeyError(f"{pack_path} holds no {rel}; it holds {', '.join(sorted(members))}")
  members[rel] = data
  return write_pack(members, pack_path)


def unpack_records(pack_path: str, workdir: str) -> str:
  """Extracts a pack into `workdir` (a run directory without checkpoints); returns it."""
  with tarfile.open(pack_path, "r:gz") as tar:
    for member in tar.getmembers():
      if member.name.startswith("/") or ".." in member.name.split("/"):
        raise ValueError(f"{pack_path}: member {member.name!r} leaves the run directory")
    tar.extractall(workdir)
  return workdir


RECORDS = "records"  # The default records dir, ROOT/records: a sweep writes no tracked file.


def default_records_dir(root: str) -> str:
  """Where packs go unless --records_dir names a place (docs/results/<name>, to commit them)."""
  return os.path.join(root, RECORDS)


def pack_path(records_dir: str, run: Run) -> str:
  return os.path.join(records_dir, run.experiment, f"seed{run.seed}.tar.gz")


CORE_LOCKS = os.path.join(tempfile.gettempdir(), "hybrid_nope_sweep_cores")


@contextlib.contextmanager
def claimed_cores(threads: int, *, lock_dir: str = CORE_LOCKS,
                  log: Callable[[str], None] = print, poll_seconds: float = 10.0):
  """Holds `threads` of this process's cores that no other run on the machine holds (an
  exclusive flock per core in `lock_dir`, released when the run ends or its process dies),
  waiting while too few are free. A wait releases what it holds, so sweeps never deadlock."""
  available = sorted(os.sched_getaffinity(0))
  if threads > len(available):
    raise ValueError(f"{threads} threads per run need more than the {len(available)} cores "
                     f"{available} this process may use")
  os.makedirs(lock_dir, exist_ok=True)
  held: dict[int, io.TextIOWrapper] = {}
  waiting_said = False
  try:
    while True:
      for core in available:
        lock = open(os.path.join(lock_dir, f"core{core}.lock"), "a")  # Closed in `finally`.
        try:
          fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
          lock.close()
          continue
        held[core] = lock
        if len(held) == threads:
          break
      if len(held) == threads:
        break
      for lock in held.values():
        lock.close()
      held.clear()
      if not waiting_said:
        log(f"waiting for {threads} free core(s) of {available}: other runs hold them "
            f"({lock_dir})")
        waiting_said = True
      time.sleep(poll_seconds)
    yield set(held)
  finally:
    for lock in held.values():
      lock.close()


def trained_steps(run: RunReader) -> tuple[int, int]:
  """(last step with a training loss in metrics.jsonl, train.steps of config.json)."""
  rd = run.layout
  with open(rd.config) as f:
    steps = int(run_config.current(run.workdir, json.load(f))["train"]["steps"])
  records = storage.read_jsonl(rd.metrics)
  return max([r["step"] for r in records if "loss" in r], default=0), steps


def has_local_mixer(run: RunReader) -> bool:
  """Whether the run's pattern (its config in force, config.json) has a local mixer (S, L or
  D): what --ablate=local ablates. The global-only baseline (pattern G) has none."""
  from hybrid_nope.model import kind_specs  # pylint: disable=import-outside-toplevel
  with open(run.layout.config) as f:
    pattern = run_config.current(run.workdir, json.load(f))["model"]["pattern"]
  return kind_specs.has_local_mixer(pattern)


def execute(run: Run, *, threads: int, log: Callable[[str], None],
            lock_dir: str = CORE_LOCKS, ablate: bool = False,
            ablate_experiments: Sequence[str] = (), **command_args) -> float:
  """Trains and analyses one run pinned to its cores; returns its seconds. Raises on failure,
  naming the run and its log file. `ablate`: the analysis runs the causal test too, where the
  trained run has a local mixer to ablate (a global-only run is analysed without it), and,
  where `ablate_experiments` names some, only for those (the test costs a few minutes a run)."""
  ablate = ablate and (not ablate_experiments or run.experiment in ablate_experiments)
  os.makedirs(run.workdir, exist_ok=True)
  reader = run.reader
  log_path = reader.layout.sweep_log
  with claimed_cores(threads, lock_dir=lock_dir, log=log) as cores, open(log_path, "a") as out:
    start = time.time()
    for index, command in enumerate(commands(run, **command_args)):
      if index == 1 and ablate and has_local_mixer(reader):  # Trained: config.json is there.
        command = commands(run, **command_args, ablate=True)[1]
      result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                              preexec_fn=lambda: os.sched_setaffinity(0, cores), check=False)
      if result.returncode:
        raise RuntimeError(f"{run.name}: `{' '.join(command)}` exited {result.returncode}; "
                           f"see {log_path}")
      if index == 0:  # A preempted train.py saves and exits 0: never analyse a partial run.
        last, steps = trained_steps(reader)
        if last < steps:
          raise RuntimeError(f"{run.name}: training stopped at step {last} of {steps} "
                             "(preempted?); rerun the sweep to resume it")
  seconds = time.time() - start
  log(f"{run.name} finished in {seconds:.0f} s on cores {sorted(cores)}")
  return seconds


def mark_done(run: Run, seconds: float) -> None:
  with open(run.reader.layout.sweep_done, "w") as f:
    json.dump({"seconds": seconds, "experiment": run.experiment, "seed": run.seed}, f)


def sweep(runs: Sequence[Run], *, parallel: int, threads: int, records_dir: str | None,
          on_packed: Callable[[str, Run], None] | None = None,
          log: Callable[[str], None] = print, init_seeds: int = 0,
          init_seed_of: int | None = None, **command_args) -> dict[str, str]:
  """Runs every run not yet done, `parallel` at a time; returns name -> "done"/"skipped"/error.

  A failed run is reported and left partial (the next sweep resumes it); the others go on.
  `init_seeds` fresh initialisations are measured for the runs of seed `init_seed_of` only:
  the init null depends on the config, not on the run's seed.
  """
  # Done: marked in its workdir, or (a new machine, a fresh clone) its records already packed.
  packed = lambda r: records_dir is not None and os.path.exists(pack_path(records_dir, r))
  status = {r.name: "skipped" for r in runs if r.done or packed(r)}
  todo = [r for r in runs if r.name not in status]
  log(f"sweep: {len(status)} of {len(runs)} runs done, {len(todo)} to run, {parallel} at a time "
      f"x {threads} threads")
  if todo and parallel * threads > len(os.sched_getaffinity(0)):
    raise ValueError(f"parallel={parallel} x threads={threads} needs more than the "
                     f"{len(os.sched_getaffinity(0))} cores this process may use")

  def one(run: Run) -> None:
    try:
      seconds = execute(run, threads=threads, log=log,
                        init_seeds=init_seeds if run.seed == init_seed_of else 0,
                        **command_args)
      if records_dir:
        path = pack_records(run.reader, pack_path(records_dir, run))
        if on_packed:
          on_packed(path, run)
      mark_done(run, seconds)
      status[run.name] = "done"
    except Exception as e:  # pylint: disable=broad-except  (one run's failure stops only it)
      status[run.name] = f"failed: {e}"
      log(f"{run.name} FAILED: {e}")

  with futures.ThreadPoolExecutor(parallel) as pool:
    list(pool.map(one, todo))
  return status


def git_commit(path: str, run: Run) -> None:
  """Commits one pack by itself (`git commit --only`), retrying while another git holds the
  index lock."""
  repo = os.path.dirname(os.path.abspath(path))  # The repository that holds the pack.
  top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=repo, capture_output=True,
                       text=True).stdout.strip()
  # The message names the records dir as the repository sees it (e.g. docs/results/primary/prose).
  records_dir = os.path.relpath(os.path.dirname(os.path.dirname(os.path.abspath(path))),
                                top or repo)
  for attempt in range(30):
    add = subprocess.run(["git", "add", "--", os.path.abspath(path)], cwd=repo,
                         capture_output=True, text=True)
    if add.returncode == 0:
      commit = subprocess.run(
          ["git", "commit", "-q", "-m", f"{records_dir}: records of {run.name}", "--only",
           "--", os.path.abspath(path)], cwd=repo, capture_output=True, text=True)
      if commit.returncode == 0 or "nothing to commit" in commit.stdout + commit.stderr:
        return
    time.sleep(2 + attempt)
  raise RuntimeError(f"could not commit {path}")
