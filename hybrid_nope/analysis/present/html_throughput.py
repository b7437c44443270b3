"""The report's "Throughput, MFU and config" section of one run (`html_report.py`).

Throughput comes from the progress records of metrics.jsonl (train/progress.py writes one per
logged interval: tokens_per_second, seconds_per_step and mfu over the interval's train steps,
eval, hook and checkpoint time left out; memory_bytes in use at its end). The table gives the
median over the intervals (the first ones, which can hold compilation and warm-up, do not move
it), the best and the last. The config is the one in force (`run_config.current`: config.json
as the run's allowed changes left it); its run-defining keys (`run_config.defining`) are shown
as key = value pairs, and each change config_history.jsonl records under the table.
"""
from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from hybrid_nope.run import run_config, run_dir
from hybrid_nope.analysis.present.html_tables import esc, missing, table
from hybrid_nope.run.reader import RunReader

THROUGHPUT_KEYS = ("tokens_per_second", "seconds_per_step", "mfu", "memory_bytes")
PAIRS_PER_ROW = 3  # key = value pairs side by side in the config table.


def throughput(metrics: Sequence[dict]) -> dict | None:
  """{"intervals": n, "median" / "best" / "last": {key: value}, "last_step"} over the progress
  records; None where the run logged none yet. Best: the highest tokens/s and MFU, the lowest
  step time; for memory the peak."""
  records = [r for r in metrics if "tokens_per_second" in r]
  if not records:
    return None
  values = {k: np.array([r.get(k, np.nan) for r in records], float) for k in THROUGHPUT_KEYS}
  lower_is_better = ("seconds_per_step",)
  return {"intervals": len(records), "last_step": records[-1]["step"],
          "median": {k: float(np.nanmedian(v)) for k, v in values.items()},
          "best": {k: float(np.nanmin(v) if k in lower_is_better else np.nanmax(v))
                   for k, v in values.items()},
          "last": {k: float(v[-1]) for k, v in values.items()}}


def _row(label: str, values: dict) -> list[str]:
  return [label, f"{values['tokens_per_second']:,.0f}", f"{values['seconds_per_step']:.3f}",
          f"{100 * values['mfu']:.1f}%", f"{values['memory_bytes'] / 2**30:.2f}"]


def throughput_html(metrics: Sequence[dict], config) -> str:
  found = throughput(metrics)
  if found is None:
    return missing("throughput (metrics.jsonl has no tokens_per_second record yet: one comes "
                   "every train.log_every_steps)")
  rows = [_row(f"median of {found['intervals']}", found["median"]),
          _row("best (memory: the peak)", found["best"]), _row(f"last (step {found['last_step']})", found["last"])]
  note = ("tokens/s counts every token of the batch (data.batch_size × data.seq_len per "
          "step); eval, hook and checkpoint time are left out; MFU is against "
          "train.peak_flops, or where that is 0 the device's datasheet peak (on CPU: the "
          "stated float32 matmul roofline per core of hybrid_nope/train/flops.py)")
  if config is not None:
    tokens = int(config.data.batch_size) * int(config.data.seq_len)
    note += f"; {tokens:,} tokens per step"
  return (table(["logged intervals", "tokens/s", "step time (s)", "MFU",
                 "memory in use (GiB)"], rows)
          + f'<p class="meta">{esc(note)}</p>')


def _shown(value) -> str:
  if isinstance(value, (list, tuple)):
    return ", ".join(str(v) for v in value)
  return value if isinstance(value, str) else json.dumps(value)


def config_html(run: RunReader, config) -> str:
  """The run-defining keys of the config in force as key = value pairs, and its history."""
  if config is None:
    return missing(f"{run_dir.CONFIG} (the run's config)")
  pairs = list(run_config.defining(config).items())
  width = PAIRS_PER_ROW * 2
  cells = [cell for key, value in pairs for cell in (key, _shown(value))]
  cells += [""] * (-len(cells) % width)
  rows = [cells[i:i + width] for i in range(0, len(cells), width)]
  changes = [e for e in run_config.history(run.workdir) if e.get("event") != "start"]
  lines = [f"step {e['step']}: {e['event'].replace('_', ' ')}"
           + "".join(f"; {k} {json.dumps(c['from'])} → {json.dumps(c['to'])}"
                     for k, c in e.get("changes", {}).items()) for e in changes]
  said = (f"config in force: {run_dir.CONFIG}"
          + (f" and {len(changes)} later events of {run_dir.CONFIG_HISTORY}: "
             + " | ".join(lines) if changes else ", unchanged since the start")
          + "; the keys a resume may not change without train.allow_changes")
  return (table(["key", "value"] * PAIRS_PER_ROW, rows)
          + f'<p class="meta">{esc(said)}</p>')


def section(run) -> list[str]:
  """The section's HTML pieces for an html_report.Run."""
  return ["<h3>Throughput, MFU and config</h3>", throughput_html(run.metrics, run.config),
          config_html(run.reader, run.config)]
