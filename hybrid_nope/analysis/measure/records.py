"""recency.jsonl records from one measurement's per-cluster sums (host numpy, no JAX).

The hook reduces the probe to per-cluster sums (a cluster is a probe document) and this module
turns them into the records docs/analysis.md defines. The same sums are kept in a side file per
measurement (`RunDir.recency_sums_file`: recency_sums/step_<N>.npz), so step-vs-step and
run-vs-run differences can be paired later over the same clusters with `paired_stderr`.

A sums dict holds, for lags Λ (with 1 and the far lag L), C clusters and N heads:
  counts [Λ, C]                       pairs counted per lag and cluster
  tokens [Λ, C]                       Σ [t_i = t_{i−d}] (the data control: a description of the
                                      data, never a baseline for cosines)
  "{layer}/{module}" [Λ, C]           Σ cos(x_i, x_{i−d})
  "{layer}/{module}/matched" [C], matched_counts [C]
                                      Σ cos(x_i, x_{i−1}) over the queries that have the far lag
  "{layer}/{module}/shuffled" [2, C]  Σ cos at lags (1, L) with tokens shuffled in each document
  "{layer}/logit" [Λ, C, N]           Σ q_i · k_{i−d} / sqrt(H) (global NoPE layers)
  "{layer}/m_norms" [N], "{layer}/delta_norm" []   ‖M_h‖_F and ‖ΔG‖_F, ΔG = G_X(1) − G_X(L)
  "{layer}/m_traces", "{layer}/m_sym_norms", "{layer}/m_antisym_norms" [N]
                                      tr M_h, ‖S_M‖_F, ‖K_M‖_F (trace part, symmetric traceless
                                      and antisymmetric parts: the trace-preserving null)
  "{layer}/delta_trace", "{layer}/delta_sym_norm", "{layer}/delta_antisym_norm" []
                                      the same three for ΔG
  "{layer}/logit/shuffled" [2, C, N]  Σ q_i · k_{i−d} / sqrt(H) at lags (1, L) on the shuffled
                                      probe (same W_Q, W_K, same pairs)
  "{layer}/shuffled_delta_norm" []    ‖ΔG‖_F of the shuffled probe's layer input
  "{layer}/decay" []                  mean gate α (linear and delta layers)
  "{layer}/beta" []                   mean write strength β (delta layers)
"""
from __future__ import annotations

import io

import numpy as np

from hybrid_nope.analysis.measure import recency
from hybrid_nope.analysis.measure.theory import delta_recency_scale, linear_recency_scale

DATA_LAYER, DATA_LAYER_TYPE, DATA_MODULE = -1, "data", "tokens"
M_PARTS = ("m_traces", "m_sym_norms", "m_antisym_norms")  # recency.m_parts, in its order
DELTA_PARTS = ("delta_trace", "delta_sym_norm", "delta_antisym_norm")  # recency.matrix_parts

# The stream (or branch input) each boundary is compared with: its effect is after − before.
# Norms and branches against what they receive; residual adds against the stream they add to.
COMPARED_WITH = {"pre_mixer_norm": "input", "mixer": "pre_mixer_norm", "residual_1": "input",
                 "pre_mlp_norm": "residual_1", "mlp": "pre_mlp_norm",
                 "residual_2": "residual_1", "final_norm": "residual_2"}


def _floats(values) -> list:
  """JSON-ready floats (NaN stays NaN; the writer decides how to spell it)."""
  return [float(v) for v in np.asarray(values, np.float64).ravel()]


def near_far(lags, far: int) -> tuple[int, int]:
  lags = list(lags)
  for name, lag in (("near", 1), ("far", far)):
    if lag not in lags:
      raise ValueError(f"{name} lag {lag} is not among the lags {lags}")
  return lags.index(1), lags.index(far)


def gap_terms(sums_LC, counts_LC, near: int, far: int, sign: float = 1.0):
  """The gap f(1) − f(L) as contrast terms for `recency.contrast_stderr`."""
  return [(sign, sums_LC[near], counts_LC[near]), (-sign, sums_LC[far], counts_LC[far])]


def mean_gap_terms(sums: dict, keys, lags, far: int, sign: float = 1.0):
  """The mean over `keys` (e.g. every global layer's input) of their gaps, as contrast terms."""
  near_i, far_i = near_far(lags, far)
  n = np.asarray(sums["counts"], np.float64)
  return [term for key in keys for term in gap_terms(np.asarray(sums[key], np.float64), n,
                                                     near_i, far_i, sign / len(keys))]


def paired_stderr(terms) -> float:
  """Standard error of a contrast of ratio means over shared clusters (steps or runs on one
  probe): `recency.contrast_stderr`, as a float."""
  return float(recency.contrast_stderr(terms))


def boundary_fields(sums: dict, key: str, lags, far: int) -> dict:
  """Profile, floor, gap and their cluster-robust errors for one boundary's cosine sums."""
  near_i, far_i = near_far(lags, far)
  s, n = np.asarray(sums[key], np.float64), np.asarray(sums["counts"], np.float64)
  profile, stderr, pairs = recency.mean_and_stderr(s, n)
  floor, gap = profile[far_i], profile[near_i] - profile[far_i]
  out = {"lags": list(lags), "far_lag": far, "profile": _floats(profile),
         "floor": float(floor), "gap": float(gap), "pairs": pairs.tolist(),
         "stderr": _floats(stderr), "floor_stderr": float(stderr[far_i]),
         "gap_stderr": paired_stderr(gap_terms(s, n, near_i, far_i))}
  if f"{key}/matched" in sums:
    ms, mn = np.asarray(sums[f"{key}/matched"], np.float64), np.asarray(sums["matched_counts"])
    matched = recency.mean_and_stderr(ms[None], mn[None])[0][0]
    out["gap_matched"] = float(matched - floor)
    out["gap_matched_stderr"] = paired_stderr([(1.0, ms, mn), (-1.0, s[far_i], n[far_i])])
  if f"{key}/shuffled" in sums:
    sh = np.asarray(sums[f"{key}/shuffled"], np.float64)
    n2 = n[[near_i, far_i]]
    sh_profile = recency.mean_and_stderr(sh, n2)[0]
    out["shuffled_floor"] = float(sh_profile[1])
    out["shuffled_gap"] = float(sh_profile[0] - sh_profile[1])
    out["shuffled_gap_stderr"] = paired_stderr(gap_terms(sh, n2, 0, 1))
    # The model's gap beyond its shuffled control, paired over the same pairs.
    out["gap_over_shuffled_stderr"] = paired_stderr(
        gap_terms(s, n, near_i, far_i) + gap_terms(sh, n2, 0, 1, sign=-1.0))
  return out


def change_fields(sums: dict, key: str, before_key: str, lags, far: int) -> dict:
  """The boundary's effect on what it receives: gap and floor after − before, paired SEs."""
  near_i, far_i = near_far(lags, far)
  n = np.asarray(sums["counts"], np.float64)
  a, b = np.asarray(sums[key], np.float64), np.asarray(sums[before_key], np.float64)
  fa, fb = recency.mean_and_stderr(a, n)[0], recency.mean_and_stderr(b, n)[0]
  return {"compared_with": before_key.split("/")[-1],
          "gap_change": float((fa[near_i] - fa[far_i]) - (fb[near_i] - fb[far_i])),
          "gap_change_stderr": paired_stderr(gap_terms(a, n, near_i, far_i)
                                             + gap_terms(b, n, near_i, far_i, sign=-1.0)),
          "floor_change": float(fa[far_i] - fb[far_i]),
          "floor_change_stderr": paired_stderr([(1.0, a[far_i], n[far_i]),
                                                (-1.0, b[far_i], n[far_i])])}


def readout_fields(sums: dict, layer: int, lags, far: int, d_model: int) -> dict:
  """Logit profile and gap per head, with the paired SE and the random-M nulls (Haar both sides,
  and trace-preserving); alignment with its SE and the null of one head and of the head mean;
  the shuffled-token read-out control."""
  near_i, far_i = near_far(lags, far)
  n = np.asarray(sums["counts"], np.float64)
  s_NLC = np.moveaxis(np.asarray(sums[f"{layer}/logit"], np.float64), -1, 0)
  logit_NL = recency.mean_and_stderr(s_NLC, n[None])[0]
  gap_N = logit_NL[:, near_i] - logit_NL[:, far_i]
  gap_se_N = recency.contrast_stderr([(1.0, s_NLC[:, near_i], n[near_i]),
                                      (-1.0, s_NLC[:, far_i], n[far_i])])
  scale_N = np.asarray(sums[f"{layer}/m_norms"], np.float64) * float(sums[f"{layer}/delta_norm"])
  null_N = recency.logit_gap_null(sums[f"{layer}/m_norms"], sums[f"{layer}/delta_norm"], d_model)
  align_null_N = recency.alignment_null(d_model, len(gap_N))
  return {"logit_profile": [_floats(row) for row in logit_NL], "logit_gap": _floats(gap_N),
          "logit_gap_stderr": _floats(gap_se_N), "logit_gap_null": _floats(null_N),
          "logit_gap_mean_null": recency.null_of_mean(null_N),
          # ΔG's own noise is left out: to first order it scales the alignment, not its sign.
          "alignment": _floats(gap_N / scale_N), "alignment_stderr": _floats(gap_se_N / scale_N),
          "alignment_null": _floats(align_null_N),
          "alignment_mean_null": recency.null_of_mean(align_null_N),
          **trace_null_fields(sums, layer, gap_N, d_model),
          **shuffled_readout_fields(sums, layer, s_NLC[:, [near_i, far_i]], n[[near_i, far_i]])}


def trace_null_fields(sums: dict, layer: int, gap_N, d_model: int) -> dict:
  """The trace-preserving random-M null (M' = U M Uᵀ) per head, and the gap's z against it.
  Empty for sums written before the hook recorded its pieces."""
  keys = [f"{layer}/{part}" for part in M_PARTS + DELTA_PARTS]
  if not all(k in sums for k in keys):
    return {}
  mean_N, sd_N = recency.logit_gap_null_trace(*(sums[k] for k in keys), d_model)
  with np.errstate(invalid="ignore", divide="ignore"):  # SD 0 (M = c I): z undefined, NaN
    z_N = np.where(sd_N > 0, (gap_N - mean_N) / sd_N, np.nan)
  return {"logit_gap_null_trace": _floats(sd_N), "logit_gap_null_trace_mean": _floats(mean_N),
          "logit_gap_null_trace_z": _floats(z_N)}


def shuffled_readout_fields(sums: dict, layer: int, s_N2C, n_2C) -> dict:
  """The shuffled-token read-out control per head: logit gap and alignment of the same heads on
  the probe shuffled within documents, over the same pairs; paired SEs over the same documents.
  `s_N2C`, `n_2C`: the model's logit sums and counts at lags (1, L). Empty for older sums."""
  if f"{layer}/logit/shuffled" not in sums:
    return {}
  sh_N2C = np.moveaxis(np.asarray(sums[f"{layer}/logit/shuffled"], np.float64), -1, 0)
  profile_N2 = recency.mean_and_stderr(sh_N2C, n_2C[None])[0]
  gap_N = profile_N2[:, 0] - profile_N2[:, 1]
  terms = lambda s, sign: [(sign, s[:, 0], n_2C[0]), (-sign, s[:, 1], n_2C[1])]
  out = {"shuffled_logit_gap": _floats(gap_N),
         "shuffled_logit_gap_stderr": _floats(recency.contrast_stderr(terms(sh_N2C, 1.0))),
         "logit_gap_over_shuffled_stderr": _floats(recency.contrast_stderr(
             terms(s_N2C, 1.0) + terms(sh_N2C, -1.0)))}
  if f"{layer}/shuffled_delta_norm" in sums:
    scale_N = (np.asarray(sums[f"{layer}/m_norms"], np.float64)
               * float(sums[f"{layer}/shuffled_delta_norm"]))
    out["shuffled_alignment"] = _floats(gap_N / scale_N)
    out["shuffled_alignment_stderr"] = _floats(
        np.asarray(out["shuffled_logit_gap_stderr"]) / scale_N)
  return out


def linear_fields(sums: dict, layer: int) -> dict:
  decay = float(sums[f"{layer}/decay"])
  return {"mean_decay": decay, "recency_scale": float(linear_recency_scale(decay))}


def delta_fields(sums: dict, layer: int, head_dim: int) -> dict:
  decay, beta = float(sums[f"{layer}/decay"]), float(sums[f"{layer}/beta"])
  return {"mean_decay": decay, "mean_beta": beta,
          "recency_scale": float(delta_recency_scale(decay, beta, head_dim))}


def build(step: int, sums: dict, *, kinds, layer_types, boundaries, final_boundary: str,
          lags, far: int, d_model: int, readout_layers, linear_layers, delta_layers=(),
          head_dim: int | None = None, data_control: bool) -> list[dict]:
  """The records of one measurement: the data control (if asked), then one per layer and
  boundary, and the final norm on the last layer. `head_dim`: the delta layers' key dimension."""
  if delta_layers and head_dim is None:
    raise ValueError(f"delta layers {sorted(delta_layers)} need head_dim (their key dimension)")
  records = []
  head = lambda layer, kind, module: {"step": int(step), "layer": layer, "layer_type": kind,
                                      "module": module}
  if data_control:
    records.append({**head(DATA_LAYER, DATA_LAYER_TYPE, DATA_MODULE),
                    **boundary_fields(sums, "tokens", lags, far)})
  last = len(kinds) - 1
  for layer, kind in enumerate(kinds):
    extra = {}
    if layer in readout_layers:
      extra = readout_fields(sums, layer, lags, far, d_model)
    if layer in linear_layers:
      extra = linear_fields(sums, layer)
    if layer in delta_layers:
      extra = delta_fields(sums, layer, head_dim)
    modules = tuple(boundaries) + ((final_boundary,) if layer == last else ())
    for module in modules:
      key = f"{layer}/{module}"
      record = {**head(layer, layer_types[layer], module),
                **boundary_fields(sums, key, lags, far)}
      if module in COMPARED_WITH:
        record.update(change_fields(sums, key, f"{layer}/{COMPARED_WITH[module]}", lags, far))
      records.append({**record, **extra})
  return records


def encode_sums(sums: dict, lags, far: int) -> bytes:
  """One measurement's sums as a compressed .npz (float32: sums of at most ~1e6 cosines)."""
  buffer = io.BytesIO()
  exact = ("delta_norm",) + DELTA_PARTS  # ΔG's few summaries, kept as measured
  arrays = {k: np.asarray(v, np.float64 if k.endswith(exact) else np.float32)
            for k, v in sums.items()}
  np.savez_compressed(buffer, lags=np.asarray(lags, np.int64), far_lag=np.int64(far), **arrays)
  return buffer.getvalue()


def decode_sums(data: bytes) -> tuple[dict, tuple[int, ...], int]:
  """(sums, lags, far_lag) from `encode_sums` bytes."""
  with np.load(io.BytesIO(data)) as f:
    sums = {k: f[k] for k in f.files if k not in ("lags", "far_lag")}
    return sums, tuple(int(x) for x in f["lags"]), int(f["far_lag"])
