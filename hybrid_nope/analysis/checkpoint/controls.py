"""The causal test's interventions on the local branches (ablation.py measures them).

At every ablated local layer the mixer's branch output h_BTD (tokens t of a row, padding kept
as is everywhere) is replaced by a target c, blended by a dial λ ≥ 0:

    branch(λ) = h + λ (c − h)  for λ < 1,   λ c  for λ ≥ 1,

so λ = 1 is the target itself, λ < 1 keeps (1 − λ) of the clean branch and λ > 1 scales the
target up (its norm λ times the ablation's). The targets, each with the ablation's norm
‖h_π(t)‖ at every token t (except `rotated`, whose *perturbation* has the ablation's norm):

- ablated: h_π, the branch's own vectors permuted within each document (PERMUTATION_SEED):
  content and the set of norms kept, position gone.
- rotated: h + (h_π − h) R with R Haar (ROTATION_SEED), the first control (kept so old files
  still read). Its perturbation keeps the Gram matrix ⟨δ_t, δ_s⟩ of the ablation's, which holds
  ⟨h_t, h_s⟩: it *adds* the branch's recency a second time (an audit measured the global
  input's gap rising, 0.205 → 0.241) and is no null for position.
- noise: i.i.d. Gaussian directions, independent across tokens and layers (NOISE_SEED), scaled
  to ‖h_π(t)‖: no content and no position (its lagged cosines are 0 at every lag ≥ 1).
- other_row: the branch of another row of the same forward at the same position t (rows paired
  by a fixed derangement, DERANGEMENT_SEED: no row keeps its own), scaled to ‖h_π(t)‖: the
  recency a branch carries at every position kept, this row's content gone.

Two more keep the branch h itself and add a perturbation with the ablation's norm ‖h_π(t) − h_t‖
at every token (the rotated control without its Gram structure): the branch's position and
content stay, and what is added carries no position. Their dial scales the perturbation at
every λ (h + λ (c − h)), so the damage-matched one is the same perturbation, larger:

- added_noise: h + i.i.d. Gaussian directions (ADDED_NOISE_SEED, per layer).
- scattered: h + the ablation's own perturbation h_π − h of another token of the forward (a
  seeded random one the ablation moves, `scatter_sources`), rescaled to this token's ‖h_π − h‖:
  the ablation's perturbations in kind and size, their order across tokens gone.

Damage matching (`match_damage`): λ is bisected on the eval loss until the control costs what
the ablation costs (|loss − ablated loss| ≤ DAMAGE_TOLERANCE nats); both the norm-matched
control (λ = 1) and the damage-matched one are measured.

Everything the forward reads (the permutation, the document mask, the mode and λ per row) is
traced, so one compilation serves every condition and every λ of the bisection.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_nope.analysis.measure import probe as probe_lib

ABLATED, ROTATED, NOISE, OTHER_ROW = "ablated", "rotated", "noise", "other_row"
ADDED_NOISE, SCATTERED = "added_noise", "scattered"
MODES = (ABLATED, ROTATED, NOISE, OTHER_ROW, ADDED_NOISE, SCATTERED)  # Index: the traced mode.
ADDITIVE = (ADDED_NOISE, SCATTERED)  # h kept: the dial scales the perturbation at every λ.
PERMUTATION_SEED = 1  # Not the shuffled-token control's (hook.SHUFFLE_SEED = 0).
ROTATION_SEED = 2
NOISE_SEED = 3
DERANGEMENT_SEED = 4
ADDED_NOISE_SEED = 5
SCATTER_SEED = 6
BOUNDARY = "mixer"  # Where the branch output is replaced.
DAMAGE_TOLERANCE = 0.01  # nats: a damage-matched control's eval loss within this of the ablation's.
LAMBDA_MAX = 8.0  # The dial's largest value (the target at 8x the ablation's norm).
MAX_EVALS = 14  # Eval passes the bisection may spend per control.
_TINY = 1e-30


# ---- the fixed random pieces --------------------------------------------------------------------

def permutation_within_documents(doc_ids_BT: np.ndarray,
                                 seed: int = PERMUTATION_SEED) -> np.ndarray:
  """int32 [B, T]: for each position the position whose vector moves there, a random
  permutation of each row's piece of each document (padding and every other token stay).
  The shuffled-token control's permutation (`probe.shuffled_within_documents`) of the indices."""
  doc_ids_BT = np.asarray(doc_ids_BT)
  index_BT = np.broadcast_to(np.arange(doc_ids_BT.shape[1], dtype=np.int32), doc_ids_BT.shape)
  return probe_lib.shuffled_within_documents(index_BT, doc_ids_BT, seed).astype(np.int32)


def rotation(d_model: int, seed: int = ROTATION_SEED) -> np.ndarray:
  """float32 [D, D]: a Haar-random orthogonal matrix (QR of a Gaussian, signs fixed)."""
  q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((d_model, d_model)))
  return (q * np.sign(np.diag(r))).astype(np.float32)


def scatter_sources(delta_ND, seed: int = SCATTER_SEED) -> jax.Array:
  """int32 [N]: the token whose perturbation token i takes, drawn from the tokens the ablation
  moves (padding and a permutation's fixed points have none to give): those in a seeded random
  order, token i taking the (i mod their count)-th, so neighbours take unrelated ones."""
  live = jnp.linalg.norm(delta_ND, axis=-1) > 0
  keys = jnp.where(live, jax.random.uniform(jax.random.PRNGKey(seed), live.shape), 2.0)
  order = jnp.argsort(keys)  # The live tokens first.
  return order[jnp.arange(live.shape[0]) % jnp.maximum(live.sum(), 1)]


def derangement(n: int, seed: int = DERANGEMENT_SEED) -> np.ndarray:
  """int32 [n]: row b takes row derangement[b]'s branch; a uniformly random n-cycle (Sattolo),
  so no row keeps its own. Fails for n < 2 (one row has no other row)."""
  if n < 2:
    raise ValueError(f"other_row control: a forward of {n} row(s) has no other row to take a "
                     f"branch from; use at least 2 rows per call (rows_per_call, eval.batch_size)")
  rng = np.random.default_rng(seed)
  perm = np.arange(n)
  for i in range(n - 1, 0, -1):
    j = int(rng.integers(0, i))
    perm[i], perm[j] = perm[j], perm[i]
  return perm.astype(np.int32)


# ---- the intervention --------------------------------------------------------------------------

def intervention_inputs(permutation_BT, in_document_BT, rotation_DD, condition: str,
                        lam: float = 1.0) -> dict:
  """The traced arrays `intervene` reads: one compilation serves every target and λ."""
  if condition not in MODES:
    raise ValueError(f"condition {condition!r}: expected one of {', '.join(map(repr, MODES))}")
  if not 0.0 <= lam <= LAMBDA_MAX:
    raise ValueError(f"lam={lam}: expected 0 <= lam <= {LAMBDA_MAX}")
  rows = np.shape(permutation_BT)[0]
  return {"permutation": jnp.asarray(permutation_BT, jnp.int32),
          "in_document": jnp.asarray(in_document_BT, bool),
          "rotation": jnp.asarray(rotation_DD, jnp.float32),
          "mode": jnp.full((rows,), MODES.index(condition), jnp.int32),
          "lam": jnp.full((rows,), lam, jnp.float32)}


def _unit(v, axis=-1):
  return v / jnp.maximum(jnp.linalg.norm(v, axis=axis, keepdims=True), _TINY)


def targets(inputs: dict, layer: int, x_BTD) -> jnp.ndarray:
  """float32 [len(MODES), B, T, D]: each target c of the branch x_BTD (module docstring)."""
  x = x_BTD.astype(jnp.float32)
  B = x.shape[0]
  moved = x[jnp.arange(B)[:, None], inputs["permutation"]]
  norm_BT1 = jnp.linalg.norm(moved, axis=-1, keepdims=True)
  rotated = x + jnp.einsum("btd,de->bte", moved - x, inputs["rotation"],
                           precision=jax.lax.Precision.HIGHEST)
  key = jax.random.fold_in(jax.random.PRNGKey(NOISE_SEED), layer)
  noise = norm_BT1 * _unit(jax.random.normal(key, x.shape, jnp.float32))
  other = norm_BT1 * _unit(x[derangement(B)])  # Static B: a fixed derangement per size.
  delta = moved - x
  delta_norm_BT1 = jnp.linalg.norm(delta, axis=-1, keepdims=True)
  key = jax.random.fold_in(jax.random.PRNGKey(ADDED_NOISE_SEED), layer)
  added = x + delta_norm_BT1 * _unit(jax.random.normal(key, x.shape, jnp.float32))
  flat = delta.reshape(-1, delta.shape[-1])
  scattered = x + delta_norm_BT1 * _unit(flat[scatter_sources(flat)].reshape(delta.shape))
  return jnp.stack([moved, rotated, noise, other, added, scattered])


def _intervene(layers: frozenset, inputs: dict, layer: int, boundary: str, x_BTD):
  if boundary != BOUNDARY or layer not in layers:
    return x_BTD
  x = x_BTD.astype(jnp.float32)
  target = jnp.take_along_axis(targets(inputs, layer, x_BTD),
                               inputs["mode"][None, :, None, None], axis=0)[0]
  lam = inputs["lam"][:, None, None]
  additive = jnp.asarray([m in ADDITIVE for m in MODES])[inputs["mode"]][:, None, None]
  # λ = 1: the target exactly.
  out = jnp.where((lam < 1.0) | additive, x + lam * (target - x), lam * target)
  out = jnp.where(inputs["in_document"][..., None], out, x)  # Padding stays.
  return out.astype(x_BTD.dtype)


@functools.lru_cache(maxsize=64)
def intervener(layers: tuple[int, ...]) -> Callable:
  """`intervene(inputs, layer, boundary, x_BTD) -> x_BTD` for `RecencyHook.sums`: at `layers`'
  mixer boundary the branch replaced by `inputs`' target and λ; elsewhere the stream unchanged.
  One function per tuple of layers (the hook compiles once per function)."""
  return functools.partial(_intervene, frozenset(layers))


@functools.lru_cache(maxsize=16)
def eval_token_losses(model_def, layers: tuple[int, ...], d_model: int,
                      rotation_seed: int = ROTATION_SEED) -> Callable:
  """`token_losses(params, batch)` (as `ModelDef.token_losses`, blocked where model.loss_block
  says so) under the batch's intervention (`for_condition`'s arrays: "permutation",
  "in_document", "mode", "lam", all cut by rows with the batch);
  `context_loss.evaluate_by_context`'s token_losses, one compilation for every condition and λ."""
  intervene, rotation_DD = intervener(layers), rotation(d_model, rotation_seed)

  def token_losses(params, batch):
    inputs = {"permutation": batch["permutation"], "in_document": batch["in_document"],
              "rotation": jnp.asarray(rotation_DD), "mode": batch["mode"], "lam": batch["lam"]}
    return model_def.token_losses(params, batch, observe=functools.partial(intervene, inputs))
  return token_losses


def with_permutations(batches: Sequence[dict], seed: int = PERMUTATION_SEED) -> list[dict]:
  """The eval batches, each with its "permutation" within the documents of its rows and its
  "in_document" mask (False on padding)."""
  seg = np.concatenate([np.asarray(b["segment_ids"]) for b in batches])
  pos = np.concatenate([np.asarray(b["positions"]) for b in batches])
  doc_RT = probe_lib.document_ids(seg, pos)
  perm_RT = permutation_within_documents(doc_RT, seed)
  cuts = np.cumsum([len(b["segment_ids"]) for b in batches])[:-1]
  return [{**b, "permutation": p, "in_document": d != probe_lib.NOT_A_DOCUMENT}
          for b, p, d in zip(batches, np.split(perm_RT, cuts), np.split(doc_RT, cuts))]


def for_condition(batches: Sequence[dict], condition: str, lam: float = 1.0) -> list[dict]:
  """`with_permutations`' batches with a condition's mode and λ per row."""
  if condition not in MODES:
    raise ValueError(f"condition {condition!r}: expected one of {', '.join(map(repr, MODES))}")
  return [{**b, "mode": np.full(len(b["inputs"]), MODES.index(condition), np.int32),
           "lam": np.full(len(b["inputs"]), lam, np.float32)} for b in batches]


# ---- damage matching ---------------------------------------------------------------------------

def match_damage(loss_at: Callable[[float], float], target: float, *,
                 tolerance: float = DAMAGE_TOLERANCE, lam_max: float = LAMBDA_MAX,
                 max_evals: int = MAX_EVALS, known: dict | None = None) -> dict:
  """The dial λ at which a control's eval loss `loss_at(λ)` equals `target` (the ablation's).

  λ = 1 first; if it costs less than the target, λ doubles (up to `lam_max`) until it costs
  more; then bisection on the bracket (the loss is taken to rise with λ, λ = 0 being the clean
  model) until within `tolerance` nats or `max_evals` evaluations. `known`: {λ: loss} already
  measured. Returns {"lam", "loss", "target", "matched" (within tolerance), "trace" [[λ, loss],
  ...] in the order evaluated}: the closest λ found, matched or not (a control that cannot
  cost as much at `lam_max` says so with matched False)."""
  trace: list[list[float]] = []
  cache = dict(known or {})

  def f(lam):
    if lam not in cache:
      cache[lam] = float(loss_at(lam))
    trace.append([float(lam), cache[lam]])
    return cache[lam]

  def done():
    lam, loss = min(trace, key=lambda t: (abs(t[1] - target), t[0]))
    return {"lam": lam, "loss": loss, "target": float(target),
            "matched": bool(abs(loss - target) <= tolerance), "trace": trace}

  lo, hi = 0.0, 1.0
  value = f(hi)
  while value < target - tolerance and hi < lam_max and len(trace) < max_evals:
    lo, hi = hi, min(2 * hi, lam_max)
    value = f(hi)
  if abs(value - target) <= tolerance or value < target:
    return done()
  while len(trace) < max_evals:
    mid = 0.5 * (lo + hi)
    value = f(mid)
    if abs(value - target) <= tolerance:
      break
    lo, hi = (mid, hi) if value < target else (lo, mid)
  return done()
