"""The in-loop recency hook: at init and every checkpoint, measure every layer and boundary.

One jitted forward pass over a fixed probe batch; at each block boundary it reduces the
activations to a cosine profile right away (and, at global NoPE layers' normalised input, to
logit profiles and alignments), so memory stays O(B·T·D) whatever the depth.
"""
from __future__ import annotations

import time

import jax
import numpy as np
from absl import logging

from hybrid_nope.analysis import recency
from hybrid_nope.model.transformer import BOUNDARIES, layer_kinds

LAYER_TYPES = {"S": "swa", "G": "global"}
RECORD_FILE = "recency.jsonl"


class RecencyHook:

  def __init__(self, config, model_def, probe_batch: dict, writer, lags=None):
    """`lags` defaults to 1, 2, 4, ... far_lag plus the window; others must include 1 and L."""
    m, metrics = config.model, config.metrics
    self.model_def = model_def
    self.writer = writer
    self.kinds = layer_kinds(m.pattern, m.num_layers)
    self.far = metrics.far_lag
    self.lags = tuple(lags) if lags is not None else recency.default_lags(
        self.far, m.window if "S" in self.kinds else None)
    missing = {1, self.far} - set(self.lags)
    if missing:
      raise ValueError(f"lags {self.lags} must include 1 and metrics.far_lag={self.far}")
    self.positions = recency.query_positions(config.data.seq_len, metrics.query_positions)
    # Logit read-out is only meaningful where attention carries no position encoding.
    self.readout_layers = {i for i, k in enumerate(self.kinds)
                           if k == "G" and m.global_pos == "nope"}
    size = metrics.probe_batch_size
    if probe_batch["inputs"].shape[0] < size:
      raise ValueError(f"config.metrics.probe_batch_size={size} is larger than the eval batch "
                       f"({probe_batch['inputs'].shape[0]} sequences); lower it or raise "
                       "eval.batch_size")
    self.probe = {k: v[:size] for k, v in probe_batch.items()}
    self._measure = jax.jit(self._measure_fn)

  def _measure_fn(self, params, batch):
    model = self.model_def.bind(params)
    out = {}

    def observe(layer, name, x_BTD):
      out[f"{layer}/{name}/profile"] = recency.cosine_profile(x_BTD, self.lags, self.positions)
      if name == "pre_mixer_norm" and layer in self.readout_layers:
        attn = model.blocks[layer].attn
        wq, wk = attn.wq_DNH[...], attn.wk_DKH[...]
        out[f"{layer}/logit_profile"] = recency.logit_profile(x_BTD, wq, wk, self.lags,
                                                              self.positions)
        out[f"{layer}/alignment"] = recency.alignment(x_BTD, wq, wk, near=1, far=self.far,
                                                      positions=self.positions)
      return x_BTD

    # The logits are unused, so XLA drops the output head from this computation.
    model(batch["inputs"], positions_BT=batch["positions"], segment_ids_BT=batch["segment_ids"],
          observe=observe)
    return out

  def records(self, step: int, params) -> list[dict]:
    """Measures and returns the records (one per layer and boundary) without writing them."""
    out = jax.device_get(self._measure(params, self.probe))
    records = []
    for layer, kind in enumerate(self.kinds):
      readout = {}
      if layer in self.readout_layers:
        logit = np.asarray(out[f"{layer}/logit_profile"])
        i_near, i_far = self.lags.index(1), self.lags.index(self.far)
        readout = {"logit_profile": logit.tolist(),
                   "logit_gap": (logit[:, i_near] - logit[:, i_far]).tolist(),
                   "alignment": np.asarray(out[f"{layer}/alignment"]).tolist()}
      for name in BOUNDARIES:
        profile = np.asarray(out[f"{layer}/{name}/profile"])
        floor, gap = recency.floor_and_gap(profile, self.lags, far=self.far)
        records.append({"step": int(step), "layer": layer, "layer_type": LAYER_TYPES[kind],
                        "module": name, "lags": list(self.lags), "profile": profile.tolist(),
                        "floor": float(floor), "gap": float(gap), **readout})
    return records

  def __call__(self, step: int, params) -> float:
    """Measures, writes recency.jsonl and TensorBoard, logs a line per layer; returns seconds."""
    start = time.perf_counter()
    records = self.records(step, params)
    scalars = {}
    for r in records:
      tag = f"recency/L{r['layer']:02d}_{r['module']}"
      scalars[f"{tag}/floor"], scalars[f"{tag}/gap"] = r["floor"], r["gap"]
      if r["module"] == "pre_mixer_norm" and "logit_gap" in r:
        scalars[f"recency/L{r['layer']:02d}/logit_gap"] = float(np.mean(r["logit_gap"]))
        scalars[f"recency/L{r['layer']:02d}/alignment"] = float(np.mean(r["alignment"]))
      self.writer.write_record(RECORD_FILE, r)
    self.writer.write_scalars(step, scalars)
    for r in records:
      if r["module"] == "residual_2":
        extra = ""
        if "logit_gap" in r:
          extra = (f" | logit gap {np.mean(r['logit_gap']):+.4f}"
                   f" alignment {np.mean(r['alignment']):+.4f} (head means)")
        logging.info("recency step %d | layer %d %-6s | floor %.4f gap %.4f (block output)%s",
                     step, r["layer"], r["layer_type"], r["floor"], r["gap"], extra)
    return time.perf_counter() - start
