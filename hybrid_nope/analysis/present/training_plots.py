"""PNG figures of a run over training, from its records (metrics.jsonl, recency.jsonl), for
`html_report.py`; the same object-API, Agg-canvas style as `plots.py`, and, as there, every
function takes plain dicts and returns the path it wrote.

Eval keys are the loop's: `eval_loss`, `eval_loss_by_position` (a list per bucket of
`eval_bucket_size` positions, None where empty), and per length multiple k (`eval.length_
multiples`) `eval_loss@{k}x` and `eval_loss_by_position@{k}x`.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from hybrid_nope.analysis.present import plots
from hybrid_nope.model.loss import UNIGRAM_ENTROPY_KEY

MULTIPLE = re.compile(r"eval_loss@(\d+)x")


def multiples(evals: Sequence[dict]) -> list[int]:
  """The length multiples k > 1 any eval record carries `eval_loss@{k}x` for."""
  found = {int(m.group(1)) for r in evals for key in r if (m := MULTIPLE.fullmatch(key))}
  return sorted(found)


def _series(records: Sequence[dict], key: str):
  points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
  return tuple(zip(*points)) if points else ((), ())


def unigram_baseline(records: Sequence[dict]) -> float | None:
  """The eval set's unigram entropy the run recorded (the loss a context-free model reaches)."""
  found = [r[UNIGRAM_ENTROPY_KEY] for r in records if r.get(UNIGRAM_ENTROPY_KEY) is not None]
  return found[-1] if found else None


def loss_curves(runs: Sequence[tuple[str, Sequence[dict]]], path: str) -> str:
  """Training loss and eval loss against step, a colour per run; eval loss at each length
  multiple k (`eval_loss@{k}x`) dashed in its run's colour, with a marker per k."""
  fig = Figure(layout="constrained", figsize=(12, 4))
  train_ax, eval_ax = fig.subplots(1, 2)
  for i, (name, records) in enumerate(runs):
    color = f"C{i % 10}"
    train_ax.plot(*_series(records, "loss"), color=color, linewidth=1, label=name)
    eval_ax.plot(*_series(records, "eval_loss"), color=color, marker="o", label=f"{name} (1×)")
    evals = [r for r in records if "eval_loss" in r]
    for j, k in enumerate(multiples(evals)):
      eval_ax.plot(*_series(evals, f"eval_loss@{k}x"), color=color, linestyle="--",
                   marker="sv^D"[j % 4], label=f"{name} ({k}× training length)")
    for ax in (train_ax, eval_ax):
      baseline = unigram_baseline(records)
      if baseline is not None:
        ax.axhline(baseline, color=color, linestyle=":", linewidth=1,
                   label=f"{name}: unigram entropy (no context)")
  for ax, title in ((train_ax, "training loss"), (eval_ax, "eval loss")):
    ax.set_xlabel("step")
    ax.set_ylabel(f"{title} (nats/token)")
    ax.grid(True, alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=7)
  fig.suptitle("Loss during training (metrics.jsonl)", fontsize=10)
  return plots.save_figure(fig, path)


def eval_by_position(evals: Sequence[dict], train_seq_len: int | None, path: str) -> str:
  """Eval loss by context-position bucket at every eval step that recorded it, coloured from
  early (dark) to late (yellow)."""
  evals = [r for r in evals if r.get("eval_loss_by_position")]
  fig = Figure(layout="constrained", figsize=(8, 4))
  ax = fig.subplots()
  cmap = colormaps["viridis"]
  for i, r in enumerate(evals):
    ev = {"loss_by_position": r["eval_loss_by_position"], "bucket_size": r["eval_bucket_size"]}
    plots.plot_position_loss(ax, ev, color=cmap(i / max(1, len(evals) - 1)), markersize=3,
                             linewidth=2 if i == len(evals) - 1 else 1,
                             label=f"step {r['step']}: mean {r['eval_loss']:.4f}")
  if train_seq_len:
    ax.axvline(train_seq_len, color="0.6", linestyle=":", label="training length")
  ax.set_xlabel(f"context position (bucket centre, {evals[-1]['eval_bucket_size']} positions "
                f"per bucket)")
  ax.set_ylabel("eval loss (nats/token)")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  ax.set_title("Eval loss by context position, at each eval step", fontsize=10)
  return plots.save_figure(fig, path)


def _layer_series(by_step: dict[int, list[dict]], module: str) -> dict[int, list[dict]]:
  """Layer -> its record at `module`, step by step."""
  out: dict[int, list[dict]] = {}
  for step in sorted(by_step):
    for layer, r in sorted(plots.records_by_layer(by_step[step], module).items()):
      out.setdefault(layer, []).append(r)
  return out


def _band(ax, steps, values, half_width, color, label=None):
  ax.plot(steps, values, color=color, marker=".", label=label)
  ax.fill_between(steps, values - half_width, values + half_width, color=color, alpha=0.2,
                  linewidth=0)


def floor_gap_over_steps(by_step: dict[int, list[dict]], far_lag: int, path: str,
                         module: str = "residual_2") -> str:
  """Floor f(L) and gap f(1) − f(L) of each layer's `module` (default: the block output)
  against step, ± NOISE_SE standard errors over probe documents."""
  series = _layer_series(by_step, module)
  fig = Figure(layout="constrained", figsize=(12, 4))
  axes = fig.subplots(1, 2)
  for ax, key in zip(axes, ("floor", "gap")):
    for layer, records in series.items():
      steps = [r["step"] for r in records]
      values = np.array([r[key] for r in records], float)
      se = np.array([plots.floor_gap_se(r, key, far_lag) for r in records])
      _band(ax, steps, values, plots.NOISE_SE * se, f"C{layer % 10}",
            f"layer {layer} ({records[0]['layer_type']})")
    ax.set_xlabel("step")
    ax.set_ylabel(f"{key} (L={far_lag})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle(f"Floor and gap of each layer at {module} during training; band: ± "
               f"{plots.NOISE_SE} standard errors over probe documents", fontsize=10)
  return plots.save_figure(fig, path)


def readout_over_steps(by_step: dict[int, list[dict]], path: str) -> str:
  """Head-mean logit gap and alignment of each global NoPE layer against step. Logit gap band:
  ± NOISE_SE x the mean head standard error (`plots.head_mean_se`); alignment: the grey band
  is ± NOISE_SE x the null (the alignment a random M has), around zero."""
  series = {layer: [r for r in records if "logit_gap" in r]
            for layer, records in _layer_series(by_step, "pre_mixer_norm").items()}
  fig = Figure(layout="constrained", figsize=(12, 4))
  gap_ax, align_ax = fig.subplots(1, 2)
  null = []
  for layer, records in series.items():
    if not records:
      continue
    steps, color = [r["step"] for r in records], f"C{layer % 10}"
    se = plots.nan_array([plots.head_mean_se(r) for r in records])
    _band(gap_ax, steps, np.array([np.mean(r["logit_gap"]) for r in records]),
          plots.NOISE_SE * se, color, f"layer {layer}")
    align_ax.plot(steps, [np.mean(r["alignment"]) for r in records], color=color, marker=".",
                  label=f"layer {layer}")
    null += [(s, np.mean(r["alignment_null"])) for s, r in zip(steps, records)
             if "alignment_null" in r]
  if null:
    steps, values = zip(*sorted(null))
    band = plots.NOISE_SE * np.array(values)
    align_ax.fill_between(steps, -band, band, color="0.5", alpha=0.25, linewidth=0,
                          label=f"random M: ± {plots.NOISE_SE} null sd")
  for ax, label in ((gap_ax, "logit gap ℓ(1) − ℓ(L) (head mean)"),
                    (align_ax, "alignment cos(M_h, G_X(1) − G_X(L)) (head mean)")):
    ax.axhline(0, color="0.7", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel(label, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle(f"Logit read-out of each global NoPE layer during training; logit gap band: ± "
               f"{plots.NOISE_SE} se over probe documents", fontsize=10)
  return plots.save_figure(fig, path)
