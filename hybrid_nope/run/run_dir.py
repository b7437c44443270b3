"""A run directory (the --workdir of launch/train.py): every file and folder of a run, named once.

WORKDIR/                          a local path or a URL (gs://, file://, memory://)
├── config.json                   the config as the run started, never rewritten (run/resume.py)
├── config_history.jsonl          the run's events (start, allowed changes, rollbacks, skips), a
│                                 change with the config after it (run/resume.py; run_config.py
│                                 reads the config in force)
├── metrics.jsonl                 a record per logged step: train, eval, samples, events
│                                 (run/metrics_writer.py, evaluation.py, samples.py, resume.py)
├── recency.jsonl                 a record per (step, layer, module) (analysis/measure/hook.py)
├── recency_probe.json            the recency probe: rows, documents, pairs per lag (hook.py)
├── recency_sums/step_<N>.npz     each measurement's per-cluster sums, N in 8 digits (hook.py)
├── tensorboard/                  TensorBoard event files (run/metrics_writer.py)
├── profile/                      jax.profiler trace of train.profile_* steps (train/profiling.py)
├── wandb_run_id.txt              the W&B run id a resume continues (run/wandb_sink.py)
├── wandb/                        W&B's own local files, when WANDB_DIR is unset (wandb)
├── trainer.lock                  host, pid, heartbeat of the one trainer (run/workdir_lock.py)
├── library_errors.log            what orbax's threads print when a save fails (run/library_errors.py)
├── checkpoints/                  orbax, unless checkpoint.directory names another place
│   ├── owner.json                the workdir and run id that own this checkpoint directory
│   │                             (run/checkpoint_owner.py)
│   ├── <step>/state/, meta/      TrainState; JSON: checksums, data position, config, history
│   │                             (run/checkpoint.py; data/ in checkpoints from before meta)
│   └── rolled_back/<time>_from_<N>/<step>/   what a restore_step moved aside (checkpoint.py)
├── overwritten/<time>/           a checkpointless run that train.overwrite moved aside (resume.py);
│                                 holds `moving` until the move is over (a cut one is finished)
├── analysis/step_<N>/            launch/analyze.py (analysis/checkpoint/report.py):
│                                 analysis_T<T>.json, init_null_T<T>.json, extrapolation.json,
│                                 ablation_T<T>.json (--ablate, analysis/checkpoint/ablation.py)
│                                 and figures (analysis/present/plots.py names them)
├── tokenizer/                    an imported model's tokenizer files, copied from its Hugging
│                                 Face directory (export/import_workdir.py); score, generate and
│                                 export_hf read them
├── sweep.log                     the output of the sweep's train.py and analyze.py (sweep.py)
└── sweep_done.json               the sweep's mark of a finished run (sweep.py)

Samples while training go to metrics.jsonl (records with "samples"); score.py and generate.py
write where --out says. `RunDir(root)` joins these names on `hybrid_nope.run.storage`; a name
spelled anywhere else is a bug. `describe(path)` says which entry a file belongs to. This
module imports only storage: train and analysis both use it, and never each other.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import time

from hybrid_nope.run import storage

CONFIG = "config.json"
CONFIG_HISTORY = "config_history.jsonl"
METRICS = "metrics.jsonl"
RECENCY = "recency.jsonl"
RECENCY_PROBE = "recency_probe.json"
RECENCY_SUMS = "recency_sums"
SUMS_FILE = "step_{step:08d}.npz"  # Zero-padded: the files sort by step.
TENSORBOARD = "tensorboard"
PROFILE = "profile"
WANDB_ID = "wandb_run_id.txt"
WANDB = "wandb"  # wandb's own name for its folder under the dir= it is given.
LOCK = "trainer.lock"
LIBRARY_ERRORS = "library_errors.log"
CHECKPOINTS = "checkpoints"
CHECKPOINT_STATE = "state"  # The orbax items of checkpoints/<step>/.
CHECKPOINT_META = "meta"
CHECKPOINT_DATA = "data"  # The per-process grain item of checkpoints written before meta.
CHECKPOINT_OWNER = "owner.json"  # Inside checkpoints/, where orbax lists no step.
ROLLED_BACK = "rolled_back"  # Inside checkpoints/, where orbax lists no step.
ROLLED_BACK_BATCH = "{time}_from_{step}"  # UTC time, and the newest step it moved.
OVERWRITTEN = "overwritten"
MOVING = "moving"  # Inside overwritten/<time>/ while a move aside is under way (resume.py).
ANALYSIS = "analysis"
ANALYSIS_STEP = "step_{step}"
ANALYSIS_FILE = "analysis_T{seq_len}.json"
INIT_NULL_FILE = "init_null_T{seq_len}.json"
ABLATION_FILE = "ablation_T{seq_len}.json"  # The causal test (--ablate=local).
EXTRAPOLATION_FILE = "extrapolation.json"
TOKENIZER = "tokenizer"  # An imported model's tokenizer files (Hugging Face's names inside).
TOKENIZER_FILE = "tokenizer.json"
SWEEP_LOG = "sweep.log"
SWEEP_DONE = "sweep_done.json"


def wildcard(template: str) -> str:
  """A name template with each {field} as "*": the glob of the names it makes."""
  return re.sub(r"\{[^}]*\}", "*", template)


def number_in(template: str, name: str) -> int | None:
  """The number a one-field name template put in `name` (ABLATION_FILE, "ablation_T1024.json"
  -> 1024), or None where `name` is not one of its names."""
  pattern = re.sub(r"\\\{[^}]*\\\}", r"(\\d+)", re.escape(template))
  match = re.fullmatch(pattern, name)
  return int(match.group(1)) if match else None


def _stamp(when: float | None) -> str:
  return time.strftime("%Y%m%dT%H%M%S", time.gmtime(when))


def comparable(path: str, resolve_leaf: bool = True) -> str:
  """`path` as a prefix can be compared: a local one resolved as the file system sees it
  (realpath: a workdir reached through a symbolic link is the same run's) with "/", a URL
  without a trailing "/". `resolve_leaf=False` resolves only the folders above it: where an
  entry lies, not where a link there points (wandb links its logs to files elsewhere)."""
  local = storage.local_path(path)
  if local is None:
    return path.rstrip("/")
  if not resolve_leaf:
    head, leaf = os.path.split(os.path.abspath(local))
    return os.path.join(os.path.realpath(head), leaf).replace(os.sep, "/")
  return os.path.realpath(local).replace(os.sep, "/")


@dataclasses.dataclass(frozen=True)
class RunDir:
  """The paths of one run directory. `checkpoint_directory` is config checkpoint.directory
  ("" = ROOT/checkpoints); only `checkpoints` and what is under it read it."""
  root: str
  checkpoint_directory: str = ""

  def path(self, *names: str) -> str:
    """ROOT/names... (a name from this module)."""
    return storage.join(self.root, *names)

  @property
  def config(self) -> str:
    return self.path(CONFIG)

  @property
  def config_history(self) -> str:
    return self.path(CONFIG_HISTORY)

  @property
  def library_errors(self) -> str:
    return self.path(LIBRARY_ERRORS)

  @property
  def metrics(self) -> str:
    return self.path(METRICS)

  @property
  def recency(self) -> str:
    return self.path(RECENCY)

  @property
  def recency_probe(self) -> str:
    return self.path(RECENCY_PROBE)

  @property
  def recency_sums(self) -> str:
    return self.path(RECENCY_SUMS)

  def recency_sums_file(self, step: int) -> str:
    return self.path(RECENCY_SUMS, SUMS_FILE.format(step=int(step)))

  @property
  def tensorboard(self) -> str:
    return self.path(TENSORBOARD)

  @property
  def profile(self) -> str:
    return self.path(PROFILE)

  @property
  def wandb_id(self) -> str:
    return self.path(WANDB_ID)

  @property
  def lock(self) -> str:
    return self.path(LOCK)

  @property
  def checkpoints(self) -> str:
    """checkpoint.directory if set (e.g. gs://...), else ROOT/checkpoints; a relative one is
    inside the root (not wherever the command runs), a local path absolute, and file:// the
    local path orbax wants."""
    configured = self.checkpoint_directory
    if configured and not storage.is_url(configured) and not os.path.isabs(configured):
      configured = self.path(configured)
    directory = configured or self.path(CHECKPOINTS)
    directory = storage.local_path(directory) or directory
    return directory if storage.is_url(directory) else os.path.abspath(directory)

  def checkpoint(self, step: int) -> str:
    """checkpoints/<step>: orbax's name for a step, which the trainer keeps."""
    return storage.join(self.checkpoints, str(int(step)))

  def checkpoint_state(self, step: int) -> str:
    return storage.join(self.checkpoint(step), CHECKPOINT_STATE)

  def checkpoint_meta(self, step: int) -> str:
    return storage.join(self.checkpoint(step), CHECKPOINT_META)

  @property
  def checkpoint_owner(self) -> str:
    return storage.join(self.checkpoints, CHECKPOINT_OWNER)

  @property
  def rolled_back(self) -> str:
    return storage.join(self.checkpoints, ROLLED_BACK)

  def rolled_back_now(self, newest: int, when: float | None = None) -> str:
    """A new folder of rolled_back/ for the checkpoints up to `newest` moved aside now; each
    keeps its step's name inside it."""
    return storage.join(self.rolled_back,
                        ROLLED_BACK_BATCH.format(time=_stamp(when), step=int(newest)))

  @property
  def overwritten(self) -> str:
    return self.path(OVERWRITTEN)

  def overwritten_now(self, when: float | None = None) -> str:
    """A new folder of overwritten/ for a run's files moved aside now (names kept)."""
    return self.path(OVERWRITTEN, _stamp(when))

  @property
  def analysis(self) -> str:
    return self.path(ANALYSIS)

  def analysis_dir(self, step: int) -> str:
    return self.path(ANALYSIS, ANALYSIS_STEP.format(step=int(step)))

  def analysis_steps(self) -> list[int]:
    """The steps with a folder in analysis/, ascending (none when there is no analysis/)."""
    if not storage.isdir(self.analysis):
      return []
    return sorted(step for name in storage.listdir(self.analysis)
                  if (step := number_in(ANALYSIS_STEP, name)) is not None)

  @property
  def tokenizer(self) -> str:
    return self.path(TOKENIZER)

  @property
  def tokenizer_file(self) -> str:
    return self.path(TOKENIZER, TOKENIZER_FILE)

  @property
  def sweep_log(self) -> str:
    return self.path(SWEEP_LOG)

  @property
  def sweep_done(self) -> str:
    return self.path(SWEEP_DONE)

  def relative(self, path: str) -> str | None:
    """`path` relative to the root, with "/" ("" for the root); None when it is outside."""
    root = comparable(self.root)
    if comparable(path) == root:
      return ""
    located = comparable(path, resolve_leaf=False)
    return located[len(root) + 1:] if located.startswith(root + "/") else None

  def entries(self) -> tuple[tuple[str, str], ...]:
    """(entry, pattern of its paths relative to the root), in the docstring's order; a
    pattern ending in "/" covers everything under it (folders other libraries lay out)."""
    checkpoints = self.relative(self.checkpoints)  # None: checkpoint.directory is elsewhere.
    return (
        ("config", CONFIG), ("config_history", CONFIG_HISTORY), ("metrics", METRICS),
        ("recency", RECENCY), ("recency_probe", RECENCY_PROBE),
        ("recency_sums", f"{RECENCY_SUMS}/{wildcard(SUMS_FILE)}"),
        ("tensorboard", f"{TENSORBOARD}/"), ("profile", f"{PROFILE}/"),
        ("wandb_id", WANDB_ID), ("wandb", f"{WANDB}/"), ("lock", LOCK),
        ("library_errors", LIBRARY_ERRORS),
        *(() if not checkpoints else (("rolled_back", f"{checkpoints}/{ROLLED_BACK}/"),
                                      ("checkpoint_owner", f"{checkpoints}/{CHECKPOINT_OWNER}"),
                                      ("checkpoints", f"{checkpoints}/"))),
        ("overwritten", f"{OVERWRITTEN}/"),
        ("analysis", f"{ANALYSIS}/{wildcard(ANALYSIS_STEP)}/"),
        ("tokenizer", f"{TOKENIZER}/"), ("sweep_log", SWEEP_LOG), ("sweep_done", SWEEP_DONE))

  def describe(self, path: str) -> str | None:
    """The entry (`entries`) that `path` is or lies in, or None for a path the layout does
    not name. `path`: relative to the root, or a full path or URL inside it."""
    rel = (self.relative(path) if storage.is_url(path) or os.path.isabs(path)
           else path.replace(os.sep, "/"))
    if not rel:
      return None
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    entries = [(e, p.endswith("/"), p.rstrip("/").split("/")) for e, p in self.entries()]
    fits = lambda wanted: all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted))
    for entry, tree, wanted in entries:  # The entry itself, or (a tree) anything beneath it.
      if (len(parts) == len(wanted) or tree and len(parts) > len(wanted)) and fits(wanted):
        return entry
    for entry, _, wanted in entries:  # Else a folder on the way to an entry is that entry's.
      if len(parts) < len(wanted) and fits(wanted):
        return entry
    return None
