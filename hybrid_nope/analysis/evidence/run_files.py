"""What a run directory holds, read as plain numbers (no model is run): records, the latest
extrapolation and init-null analyses, and the per-cluster sums that pair two steps of a run."""
from __future__ import annotations

import json
import re
from typing import Sequence

import numpy as np

from hybrid_nope import storage
from hybrid_nope.analysis.checkpoint import checkpoints, init_null, report
from hybrid_nope.analysis.measure import records


def read_jsonl(path: str) -> list[dict]:
  """A run's records (`storage.read_jsonl`: a live run's torn last line is dropped)."""
  if not storage.exists(path):
    raise checkpoints.WorkdirError(f"{path} does not exist (written by launch/train.py)")
  return storage.read_jsonl(path)


def latest_extrapolation(workdir: str) -> dict | None:
  """The newest analysis/step_<N>/extrapolation.json (through storage: workdirs may be URLs)."""
  root = storage.join(workdir, report.ANALYSIS_DIR)
  steps = [int(m.group(1)) for name in (storage.listdir(root) if storage.isdir(root) else [])
           if (m := re.fullmatch(r"step_(\d+)", name))
           and storage.exists(storage.join(root, name, report.EXTRAPOLATION_FILE))]
  if not steps:
    return None
  return json.loads(storage.read_text(
      storage.join(root, f"step_{max(steps)}", report.EXTRAPOLATION_FILE)))


def latest_init_null(workdir: str) -> dict | None:
  """The summary moments of the newest analysis/step_<N>/init_null_T<T>.json at the training
  length, or None."""
  root = storage.join(workdir, report.ANALYSIS_DIR)
  for name in sorted((storage.listdir(root) if storage.isdir(root) else []),
                     key=lambda n: -int(n.split("_")[-1]) if n.startswith("step_") else 0):
    if not name.startswith("step_"):
      continue
    files = [f for f in storage.listdir(storage.join(root, name))
             if f.startswith(init_null.INIT_NULL_FILE)]
    if files:
      return json.loads(storage.read_text(storage.join(root, name, sorted(files)[0])))["summary"]
  return None


def read_sums(workdir: str, step: int) -> tuple[dict, tuple, int] | None:
  """The per-cluster sums of one measurement (recency_sums/step_<N>.npz), or None."""
  path = storage.join(workdir, records.sums_file(step))
  if not storage.exists(path):
    return None
  return records.decode_sums(storage.read_bytes(path))


def summary_keys(step_records: Sequence[dict]) -> list[str]:
  """The sums keys of the boundaries the run summary averages (global layers' inputs)."""
  return [f"{r['layer']}/{r['module']}" for r in step_records
          if r["layer_type"] == "global" and r["module"] == report.SUMMARY_MODULE]


def since_init(workdir: str, by_step_records: dict) -> dict:
  """The run gap's change from step 0 to the last step, with its SE paired over the probe's
  documents (both steps measure the same probe), from the two steps' per-cluster sums."""
  final = max(by_step_records)
  init, last = read_sums(workdir, 0), read_sums(workdir, final)
  if init is None or last is None or final == 0:
    return {"gap_since_init": None, "gap_since_init_stderr": None}
  keys = summary_keys(by_step_records[final])
  (s0, lags, far), (s1, _, _) = init, last
  terms = (records.mean_gap_terms(s1, keys, lags, far)
           + records.mean_gap_terms(s0, keys, lags, far, sign=-1.0))
  value = sum(a * np.sum(sc) / np.sum(nc) for a, sc, nc in terms)
  return {"gap_since_init": float(value),
          "gap_since_init_stderr": records.paired_stderr(terms)}
