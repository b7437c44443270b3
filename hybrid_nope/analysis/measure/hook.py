"""The in-loop recency hook: at init and every `metrics.every_steps`, measure every layer and
boundary of a fixed probe.

The probe is `metrics.probe_batch_size` eval rows chosen to span as many documents as possible
(`probe.py`). One jitted forward pass reduces each block boundary to per-document sums right away
(and, at global NoPE layers' normalised input, to logit sums and alignments), so memory stays
O(B·T·D) whatever the depth; means and standard errors over documents are formed on the host.
Pairs count only inside one document and off padding, with the segment ids the model attends
with. docs/analysis.md defines every field of a record.
"""
from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from hybrid_nope.run import storage
from hybrid_nope.analysis.measure import live_figures
from hybrid_nope.analysis.measure import probe as probe_lib
from hybrid_nope.analysis.measure import recency
from hybrid_nope.analysis.measure import records as records_lib
from hybrid_nope.analysis.measure.records import DATA_LAYER, DATA_LAYER_TYPE, DATA_MODULE  # noqa: F401
from hybrid_nope.model.kind_specs import KINDS, kinds_where
from hybrid_nope.model.pattern import layer_kinds, layer_type, window_of
from hybrid_nope.model.transformer import BOUNDARIES, FINAL_BOUNDARY
from hybrid_nope.run.run_dir import RECENCY

SHUFFLE_SEED = 0  # The shuffled control's permutation: fixed, so runs and steps pair.


def _unchanged(layer, name, x_BTD):
  del layer, name
  return x_BTD


def _concat(batches) -> dict[str, np.ndarray]:
  if isinstance(batches, dict):
    batches = [batches]
  return {k: np.concatenate([np.asarray(b[k]) for b in batches]) for k in batches[0]}


def _token_mean(values_BT_, segment_ids_BT):
  """The mean over the probe's tokens (not padding) of a per-token gate value (α or β),
  averaged first over its heads and, for a per-channel gate, its channels."""
  real_BT = (segment_ids_BT != 0).astype(jnp.float32)
  values = values_BT_.astype(jnp.float32)
  per_token_BT = jnp.mean(values, axis=tuple(range(2, values.ndim)))
  return jnp.sum(per_token_BT * real_BT) / jnp.maximum(jnp.sum(real_BT), 1.0)


class RecencyHook:

  name = "recency"
  record_files = (RECENCY,)  # Its records at a step are redone whole if it was cut short.

  def __init__(self, config, model_def, eval_batches, writer, lags=None, place=None,
               compiler_options=None):
    """`eval_batches`: the rows (a list of batches, or one batch: the probe pool,
    `data.pipeline.probe_pool`) the probe is chosen from; `lags` defaults to 1, 2, 4, ...
    far_lag plus the window (others must include 1 and L); `place` puts the probe on devices
    (default: as is); `compiler_options`: XLA options for the measurement's program (`jax.jit`'s),
    e.g. an optimisation level other than the process's."""
    m, metrics = config.model, config.metrics
    self.config = config
    self.model_def = model_def
    self.writer = writer
    self.kinds = layer_kinds(m.pattern, m.num_layers)
    self.far = metrics.far_lag
    self.lags = tuple(lags) if lags is not None else recency.default_lags(
        self.far, window_of(m))
    missing = {1, self.far} - set(self.lags)
    if missing:
      raise ValueError(f"lags {self.lags} must include 1 and metrics.far_lag={self.far}")
    self.positions = recency.query_positions(config.data.seq_len, metrics.query_positions)
    # Logit read-out is only meaningful where attention carries no position encoding.
    self.readout_layers = set(kinds_where(
        self.kinds, lambda spec: spec.global_attention and spec.position(m) == "nope"))
    # The layers' gates whose token means the records carry (their specs' recorded_gates):
    # decay alone gives the linear law's fields, decay and beta the delta law's.
    self.recorded_gates = {i: KINDS[k].recorded_gates for i, k in enumerate(self.kinds)
                           if KINDS[k].recorded_gates}
    gate_names = {i: {name for name, _ in gates} for i, gates in self.recorded_gates.items()}
    self.delta_layers = {i for i, names in gate_names.items() if "beta" in names}
    self.linear_layers = set(gate_names) - self.delta_layers
    self.head_dim = m.head_dim  # The delta rule's key dimension H (analysis.theory.delta_cosine).
    self.d_model = m.d_model
    rows = _concat(eval_batches)
    doc_ids_RT = probe_lib.document_ids(rows["segment_ids"], rows["positions"])
    self.rows = probe_lib.choose_rows(doc_ids_RT, probe_lib.probe_size(metrics.probe_batch_size,
                                                                       len(doc_ids_RT)))
    self.doc_ids_BT = doc_ids_RT[self.rows]
    clusters_BT, self.num_clusters = probe_lib.clusters(self.doc_ids_BT)
    if self.num_clusters < probe_lib.MIN_CLUSTERS:
      logging.warning(
          "recency probe: %d documents in %d rows (fewer than %d): its standard errors are "
          "unreliable; raise metrics.probe_batch_size or metrics.probe_pool_rows, or use an "
          "eval set with more documents", self.num_clusters, len(self.rows),
          probe_lib.MIN_CLUSTERS)
    batch = {k: v[self.rows] for k, v in rows.items()}
    batch["clusters"] = clusters_BT
    batch["shuffled_inputs"] = probe_lib.shuffled_within_documents(
        batch["inputs"], self.doc_ids_BT, SHUFFLE_SEED)
    self.probe = (place or (lambda tree: tree))(batch)
    self._measure = jax.jit(self._measure_fn, static_argnames=("intervene",),
                            compiler_options=compiler_options)
    # describe()'s pair counts as one compiled program: op by op, its ~100 small ops each
    # compiled (seconds per process).
    self._pair_counts = jax.jit(lambda p: self._sums(p, recency.match_sums, p["inputs"])[1])

  @classmethod
  def for_run(cls, run):
    """The loop's hook factory (`train.hooks.RunContext` -> hook(step, params)); writes
    recency_probe.json once. A run's probe without the documents a standard error needs is
    refused (`probe.check_documents`); a hook built by hand on any rows only warns."""
    hook = cls(run.config, run.model_def, run.probe_rows, run.writer, place=run.replicate)
    probe_lib.check_documents(hook.num_docs, len(hook.rows))
    if run.writer is not None and run.writer.active:
      path = run.writer.run_dir.recency_probe
      if not storage.exists(path):
        run.writer.write_file(path, json.dumps(hook.describe()) + "\n")
    return hook

  def _sums(self, batch, fn, x, *args, lags=None, **kwargs):
    return fn(x, *args, lags or self.lags, self.positions, batch["segment_ids"],
              batch["clusters"], self.num_clusters, **kwargs)

  def _measure_fn(self, params, batch, intervene=None, inputs=None):
    model = self.model_def.bind(params)
    change = _unchanged if intervene is None else functools.partial(intervene, inputs)
    tokens, counts = self._sums(batch, recency.match_sums, batch["inputs"])
    out = {"tokens": tokens, "counts": counts}
    out["matched_counts"] = self._sums(batch, recency.cosine_sums, batch["inputs"][..., None],
                                       lags=(1,), matched_lag=self.far)[1][0]

    def observe(layer, name, x_BTD):
      x_BTD = change(layer, name, x_BTD)
      key = f"{layer}/{name}"
      out[key] = self._sums(batch, recency.cosine_sums, x_BTD)[0]
      out[f"{key}/matched"] = self._sums(batch, recency.cosine_sums, x_BTD, lags=(1,),
                                         matched_lag=self.far)[0][0]
      if name == "pre_mixer_norm" and layer in self.readout_layers:
        attn = model.blocks[layer].attn
        wq, wk = attn.wq_DNH[...], attn.wk_DKH[...]
        out[f"{layer}/logit"] = self._sums(batch, recency.logit_sums, x_BTD, wq, wk)[0]
        out[f"{layer}/m_norms"] = recency.m_norms(wq, wk)
        delta_DD = recency.delta_g(x_BTD, 1, self.far, self.positions, batch["segment_ids"])
        out[f"{layer}/delta_norm"] = jnp.linalg.norm(delta_DD)
        # The trace-preserving null's pieces (recency.logit_gap_null_trace).
        parts = {**dict(zip(records_lib.M_PARTS, recency.m_parts(wq, wk))),
                 **dict(zip(records_lib.DELTA_PARTS, recency.matrix_parts(delta_DD)))}
        out.update({f"{layer}/{part}": value for part, value in parts.items()})
      if name == "pre_mixer_norm" and layer in self.recorded_gates:
        mixer, seg = model.blocks[layer].attn, batch["segment_ids"]
        for gate, read in self.recorded_gates[layer]:
          out[f"{layer}/{gate}"] = _token_mean(read(mixer, x_BTD), seg)
      return x_BTD

    def observe_shuffled(layer, name, x_BTD):
      x_BTD = change(layer, name, x_BTD)
      out[f"{layer}/{name}/shuffled"] = self._sums(batch, recency.cosine_sums, x_BTD,
                                                   lags=(1, self.far))[0]
      if name == "pre_mixer_norm" and layer in self.readout_layers:
        # The read-out control: the same W_Q, W_K and pairs on the shuffled stream.
        attn = model.blocks[layer].attn
        out[f"{layer}/logit/shuffled"] = self._sums(
            batch, recency.logit_sums, x_BTD, attn.wq_DNH[...], attn.wk_DKH[...],
            lags=(1, self.far))[0]
        out[f"{layer}/shuffled_delta_norm"] = recency.delta_norm(
            x_BTD, 1, self.far, self.positions, batch["segment_ids"])
      return x_BTD

    # The logits are unused, so XLA drops the output head from this computation.
    for inputs, fn in (("inputs", observe), ("shuffled_inputs", observe_shuffled)):
      model(batch[inputs], positions_BT=batch["positions"],
            segment_ids_BT=batch["segment_ids"], observe=fn)
    return out

  def describe(self) -> dict:
    """What recency_probe.json holds: the probe's rows, documents (= clusters), tokens, pairs
    per lag and documents with a pair per lag."""
    counts = np.asarray(self._pair_counts(self.probe))
    return {"rows": self.rows.tolist(), "documents": int(self.num_docs),
            "clusters": int(self.num_clusters),
            "tokens": int(np.sum(self.doc_ids_BT != probe_lib.NOT_A_DOCUMENT)),
            "lags": list(self.lags), "pairs": counts.sum(-1).astype(int).tolist(),
            "documents_with_pairs": (counts > 0).sum(-1).astype(int).tolist(),
            "query_positions": None if self.positions is None else len(self.positions)}

  @property
  def num_docs(self) -> int:
    return len(np.unique(self.doc_ids_BT[self.doc_ids_BT != probe_lib.NOT_A_DOCUMENT]))

  def sums(self, params, intervene=None, inputs=None) -> dict:
    """One measurement's per-cluster sums (host numpy; `analysis.measure.records` describes them).

    `intervene(inputs, layer, boundary, x_BTD) -> x_BTD`, if given, intervenes in both of the
    probe's forward passes: at every boundary the stream it returns flows on and is what the hook
    reads (the causal test, `analysis.checkpoint.ablation`). `inputs`: the arrays it reads (a
    pytree, traced: one compilation per `intervene` serves every value)."""
    out = self._measure(params, self.probe, intervene=intervene, inputs=inputs)
    return {k: np.asarray(v) for k, v in jax.device_get(out).items()}

  def build_records(self, step: int, sums: dict, *, data_control: bool) -> list[dict]:
    return records_lib.build(
        step, sums, kinds=self.kinds, layer_types=[layer_type(k) for k in self.kinds],
        boundaries=BOUNDARIES, final_boundary=FINAL_BOUNDARY, lags=self.lags, far=self.far,
        d_model=self.d_model, readout_layers=self.readout_layers,
        linear_layers=self.linear_layers, delta_layers=self.delta_layers,
        head_dim=self.head_dim, data_control=data_control)

  def records(self, step: int, params, *, data_control: bool | None = None) -> list[dict]:
    """Measures and returns the records without writing them: the data control (at step 0,
    or when `data_control`), then one per layer and boundary, and the final norm."""
    return self.build_records(step, self.sums(params),
                              data_control=step == 0 if data_control is None else data_control)

  def __call__(self, step: int, params) -> None:
    """Measures, writes recency.jsonl and TensorBoard, logs a line per layer."""
    sums = self.sums(params)
    records = self.build_records(step, sums, data_control=step == 0)
    if self.writer.active:  # Per-cluster sums, for paired comparisons across steps and runs.
      self.writer.write_file(self.writer.run_dir.recency_sums_file(step),
                             records_lib.encode_sums(sums, self.lags, self.far))
    scalars = {}
    for r in records:
      tag = (f"recency/data_{r['module']}" if r["layer"] == DATA_LAYER
             else f"recency/L{r['layer']:02d}_{r['module']}")
      scalars[f"{tag}/floor"], scalars[f"{tag}/gap"] = r["floor"], r["gap"]
      if r["module"] == "pre_mixer_norm" and "logit_gap" in r:
        scalars[f"recency/L{r['layer']:02d}/logit_gap"] = float(np.mean(r["logit_gap"]))
        scalars[f"recency/L{r['layer']:02d}/logit_gap_stderr"] = float(
            np.mean(r["logit_gap_stderr"]))
        scalars[f"recency/L{r['layer']:02d}/alignment"] = float(np.mean(r["alignment"]))
        scalars[f"recency/L{r['layer']:02d}/shuffled_logit_gap"] = float(
            np.mean(r["shuffled_logit_gap"]))
      self.writer.write_record(RECENCY, r)
    self.writer.write_scalars(step, scalars)
    if self.writer.active:  # Host-side figures, on process 0 only.
      self.writer.write_table("recency", step, records)
      if self.config.metrics.figures:
        self.writer.write_images(step, live_figures.figures(records, self.config))
    for r in records:
      if r["layer"] == DATA_LAYER:
        logging.info("recency step %d | data control P(t_i = t_i-d): gap %.4f (%d documents)",
                     step, r["gap"], self.num_docs)
      elif r["module"] == "residual_2":
        extra = ""
        if "logit_gap" in r:
          # The head mean beside its own random-M null (not one head's).
          extra = (f" | logit gap {np.mean(r['logit_gap']):+.4f} (random-M null ± "
                   f"{r['logit_gap_mean_null']:.4f}, trace-preserving null mean "
                   f"{np.mean(r['logit_gap_null_trace_mean']):+.4f}, shuffled tokens "
                   f"{np.mean(r['shuffled_logit_gap']):+.4f})"
                   f" alignment {np.mean(r['alignment']):+.4f} (null ± "
                   f"{r['alignment_mean_null']:.4f})")
        logging.info("recency step %d | layer %d %-6s | floor %.4f gap %.4f (block output)%s",
                     step, r["layer"], r["layer_type"], r["floor"], r["gap"], extra)
