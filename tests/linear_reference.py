"""The float64 numpy gated linear attention every linear kernel test compares against.

Written straight from the contract in DESIGN.md and independent of hybrid_nope: a sequential
recurrence over time per (batch row, kv head),
  S_t = diag(exp(log_decay_t)) S_{t-1} + k_t v_tᵀ,  out_t = H^(-1/2) q_tᵀ S_t,
with S_{t-1} = 0 where a run of equal nonzero segment ids starts, and 0 output on padding
(segment 0), which leaves the state alone. The gradients are the hand-written reverse
recurrence (checked against central finite differences in test_kernels_linear_attention.py).
"""
import os

import numpy as np


def _runs(segment_ids, B, T):
  """(reset [B,T]: a run of equal ids starts here, valid [B,T]: not padding)."""
  if segment_ids is None:
    seg = np.ones((B, T), np.int64)
  else:
    seg = np.asarray(segment_ids, np.int64)
  reset = np.ones((B, T), bool)
  reset[:, 1:] = seg[:, 1:] != seg[:, :-1]
  return reset, seg != 0


def linear_reference(q, k, v, log_decay, segment_ids=None, dout=None):
  """out [B,T,N,H] in float64, or (out, (dq, dk, dv, dlog_decay)) when `dout` is given."""
  q, k, v, g = (np.asarray(a, np.float64) for a in (q, k, v, log_decay))
  B, T, N, H = q.shape
  K = k.shape[2]
  G = N // K  # query head n reads kv head n // G
  scale = H ** -0.5
  reset, valid = _runs(segment_ids, B, T)
  a = np.exp(g)  # [B, T, K, H]
  qg = q.reshape(B, T, K, G, H)
  S = np.zeros((B, K, H, H))  # [key dim, value dim]
  states = np.zeros((T + 1, B, K, H, H))  # states[t + 1] = S after step t (for the backward)
  out = np.zeros((B, T, K, G, H))
  for t in range(T):
    S = np.where(reset[:, t, None, None, None], 0.0, S)
    new = a[:, t, :, :, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
    S = np.where(valid[:, t, None, None, None], new, S)
    states[t + 1] = S
    out[:, t] = scale * np.einsum("bkgd,bkde->bkge", qg[:, t], S) * valid[:, t, None, None, None]
  out = out.reshape(B, T, N, H)
  if dout is None:
    return out
  do = np.asarray(dout, np.float64).reshape(B, T, K, G, H) * valid[:, :, None, None, None]
  dq = np.zeros_like(qg)
  dk, dv, dg = np.zeros_like(k), np.zeros_like(v), np.zeros_like(g)
  dS = np.zeros((B, K, H, H))  # gradient of the state after step t
  for t in reversed(range(T)):
    S_t = states[t + 1]
    # out_t = scale q_tᵀ S_t
    dS = dS + scale * np.einsum("bkgd,bkge->bkde", qg[:, t], do[:, t])
    dq[:, t] = scale * np.einsum("bkde,bkge->bkgd", S_t, do[:, t])
    # S_t = a_t ⊙ S_prev + k_t v_tᵀ on valid steps, with S_prev = 0 at a reset.
    S_prev = np.where(reset[:, t, None, None, None], 0.0, states[t])
    m = valid[:, t, None, None]
    dk[:, t] = np.einsum("bkde,bke->bkd", dS, v[:, t]) * m
    dv[:, t] = np.einsum("bkde,bkd->bke", dS, k[:, t]) * m
    dg[:, t] = a[:, t] * np.sum(dS * S_prev, -1) * m
    passed = np.where(valid[:, t, None, None, None], a[:, t, :, :, None] * dS, dS)
    dS = np.where(reset[:, t, None, None, None], 0.0, passed)
  return out, (dq.reshape(B, T, N, H), dk, dv, dg)


def random_linear_inputs(rng, B, T, N, K, H, decay="mixed"):
  """q, k, v unit normal; log_decay per `decay`: "mixed" log-uniform per-step log decays in
  [-e^-6, -e^3] (decays from ~1 to ~0 in one batch), "near_one" in [-1e-6, 0], "near_zero"
  -80 and -1e4, "moderate" logsigmoid-like [-1, 0]."""
  q = rng.standard_normal((B, T, N, H))
  k = rng.standard_normal((B, T, K, H))
  v = rng.standard_normal((B, T, K, H))
  shape = (B, T, K, H)
  if decay == "mixed":
    g = -np.exp(rng.uniform(-6.0, 3.0, shape))
  elif decay == "near_one":
    g = -rng.uniform(0.0, 1e-6, shape)
    g[..., 0] = 0.0  # exactly 1: no decay at all in one channel
  elif decay == "near_zero":
    g = np.where(rng.random(shape) < 0.5, -80.0, -1e4)
  elif decay == "moderate":
    g = -rng.uniform(0.0, 1.0, shape)
  else:
    raise ValueError(decay)
  return q, k, v, g


def random_runs(rng, B, T, rate=0.05, padding=0.3):
  """Segment ids: packed documents starting with probability `rate` per position; a fraction
  `padding` of the documents are padding (id 0); equal ids may recur after another one."""
  starts = rng.random((B, T)) < rate
  starts[:, 0] = True
  doc = np.cumsum(starts, axis=1)
  ids = rng.integers(1, 4, size=(B, T + 1))  # few ids, so a later run may reuse one
  ids = np.where(rng.random((B, T + 1)) < padding, 0, ids)
  return np.take_along_axis(ids, doc, axis=1).astype(np.int32)


def seeded_rng(env_var: str):
  """(rng, seed): a fresh seed each run, printed so a failure names it; env_var=<seed> reruns it."""
  seed = int(os.environ.get(env_var, np.random.SeedSequence().entropy % 2**63))
  print(f"seed {seed}")
  return np.random.default_rng(seed), seed


def rel_err(a, b):
  """max|a − b| / max|b| over the whole tensor (max|b| floored at 1e-30)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)) if b.size else 0.0
