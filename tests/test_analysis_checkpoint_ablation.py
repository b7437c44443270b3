# Tiers (pytest.ini): test-all only (integration, each two or more 10 s+ compiles cold): on a
# zeroed local branch every record and loss of the three conditions is equal
# (test_an_intervention_on_a_zero_branch_changes_no_measurement; make test checks the logits);
# --ablate=local end to end on the tiny trained run of tests/analysis_runs.py writes
# ablation_T64.json with the documented keys (test_ablate_local_end_to_end_writes_the_...),
# and launch/analyze.py refuses --ablate=local on a global-only run in one line with exit code
# 2 (test_cli_refuses_ablate_local_on_a_global_only_run_in_one_line).
"""The causal test: the local mixers' outputs permuted within documents, and its control."""
import functools
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from hybrid_nope.analysis.checkpoint import ablation, context_loss, controls, report
from hybrid_nope.analysis.measure import recency
from hybrid_nope.analysis.measure.hook import RecencyHook
from hybrid_nope.data.pipeline import loader
from hybrid_nope.errors import UserError
from hybrid_nope.model.definition import init_model
from hybrid_nope.run import checkpoints, run_dir
from hybrid_nope.run.reader import open_readonly
from tests.analysis_runs import trained_run
from tests.helpers import REPO, tiny_config

# Two rows: documents 0, 1 then padding; document 1 continues into row 1, then document 2.
DOC_IDS = np.array([[0] * 5 + [1] * 7 + [-1] * 4, [1] * 6 + [2] * 10])


def _intervene(x_BTD, perm_BT, condition, rotation_DD=None, lam=1.0, in_document_BT=None):
  rotation_DD = ablation.rotation(x_BTD.shape[-1]) if rotation_DD is None else rotation_DD
  in_document_BT = np.ones(perm_BT.shape, bool) if in_document_BT is None else in_document_BT
  inputs = ablation.intervention_inputs(perm_BT, in_document_BT, rotation_DD, condition, lam)
  fn = jax.jit(lambda x: ablation.intervener((3,))(inputs, 3, "mixer", x))
  return np.asarray(fn(x_BTD))


def test_the_permutation_stays_inside_each_documents_piece_of_a_row_and_keeps_every_vector():
  perm = ablation.permutation_within_documents(DOC_IDS, seed=5)
  assert perm.dtype == np.int32
  for b in range(2):
    np.testing.assert_array_equal(np.sort(perm[b]), np.arange(16))  # a bijection per row
    np.testing.assert_array_equal(DOC_IDS[b, perm[b]], DOC_IDS[b])  # never crosses a document
  padding = DOC_IDS == -1
  np.testing.assert_array_equal(perm[padding], np.nonzero(padding)[1])  # padding stays
  assert (perm != np.arange(16)).sum() > 10  # and it does move the tokens
  np.testing.assert_array_equal(perm, ablation.permutation_within_documents(DOC_IDS, seed=5))
  assert (perm != ablation.permutation_within_documents(DOC_IDS, seed=6)).any()

  x = np.random.default_rng(0).standard_normal((2, 16, 8)).astype(np.float32)
  out = _intervene(x, perm, ablation.ABLATED)
  np.testing.assert_array_equal(out, x[np.arange(2)[:, None], perm])
  for b in range(2):
    for doc in np.unique(DOC_IDS[b]):
      where = DOC_IDS[b] == doc  # The same multiset of vectors in each document's piece.
      np.testing.assert_array_equal(np.unique(out[b, where], axis=0),
                                    np.unique(x[b, where], axis=0))
  np.testing.assert_array_equal(np.sort(np.linalg.norm(out, axis=-1), axis=1),
                                np.sort(np.linalg.norm(x, axis=-1), axis=1))
  # Another layer or boundary is untouched.
  inputs = ablation.intervention_inputs(perm, DOC_IDS != -1, ablation.rotation(8),
                                       ablation.ABLATED)
  for layer, boundary in ((2, "mixer"), (3, "pre_mixer_norm")):
    assert ablation.intervener((3,))(inputs, layer, boundary, x) is x


def test_the_control_moves_each_token_as_far_as_the_ablation_in_a_rotated_direction():
  x = np.random.default_rng(1).standard_normal((2, 16, 32)).astype(np.float32)
  perm = ablation.permutation_within_documents(DOC_IDS)
  rotation = ablation.rotation(32)
  np.testing.assert_allclose(rotation @ rotation.T, np.eye(32), atol=1e-5)
  ablated = _intervene(x, perm, ablation.ABLATED, rotation)
  control = _intervene(x, perm, ablation.ROTATED, rotation)
  np.testing.assert_allclose(np.linalg.norm(control - x, axis=-1),
                             np.linalg.norm(ablated - x, axis=-1), rtol=2e-5, atol=1e-5)
  np.testing.assert_allclose(control - x, (ablated - x) @ rotation, rtol=1e-5, atol=1e-5)
  moved = np.linalg.norm(ablated - x, axis=-1) > 0
  assert moved.sum() > 10 and not np.allclose(control[moved], ablated[moved], atol=1e-2)
  with pytest.raises(ValueError, match="condition"):
    ablation.intervention_inputs(perm, DOC_IDS != -1, rotation, ablation.CLEAN)


def test_a_readout_of_the_branchs_position_signal_loses_its_gap_when_ablated_not_in_control():
  """The branch h_i = a_i u carries a smooth position signal a (a moving average of noise) along
  u, and the global layer's M = u uᵀ reads exactly that. With u chosen so that uᵀ R u = 0, the
  control's perturbation (a_π − a) uᵀ R has no component along u: the control's logit profile
  is the clean one exactly, while the ablation leaves the permuted signal, whose gap is ~0."""
  D, T, w, far = 64, 256, 8, 64
  rotation = ablation.rotation(D)
  evals, vecs = np.linalg.eigh((rotation + rotation.T) / 2)
  u = np.sqrt(evals[-1]) * vecs[:, 0] + np.sqrt(-evals[0]) * vecs[:, -1]
  u /= np.linalg.norm(u)
  assert abs(u @ rotation @ u) < 1e-6
  noise = np.random.default_rng(2).standard_normal((2, T + w))
  a_BT = np.stack([np.convolve(n, np.ones(w) / np.sqrt(w), "valid")[:T] for n in noise])
  h_BTD = (a_BT[..., None] * u).astype(np.float32)
  seg_BT = np.repeat([[1] * 128 + [2] * 128], 2, axis=0)
  perm = ablation.permutation_within_documents(seg_BT - 1)
  w_D11 = u[:, None, None].astype(np.float32)

  def logit_gap(x_BTD):
    profile = recency.logit_profile(x_BTD, w_D11, w_D11, (1, far), segment_ids=seg_BT)
    return float(profile[0, 0] - profile[0, 1])

  clean = logit_gap(h_BTD)
  ablated = logit_gap(_intervene(h_BTD, perm, ablation.ABLATED, rotation))
  control = logit_gap(_intervene(h_BTD, perm, ablation.ROTATED, rotation))
  assert clean > 0.5  # ≈ 1 − 1/w of the signal's variance, against ≈ 0 at lag far > w
  assert control == pytest.approx(clean, abs=1e-5)
  assert abs(ablated) < 0.25 * clean


def _smooth_branch(rows, T, D, w, seed):
  """A branch with recency: each row a moving average (window w) of Gaussian vectors."""
  noise = np.random.default_rng(seed).standard_normal((rows, T + w, D))
  kernel = np.ones(w) / np.sqrt(w)
  return np.stack([np.stack([np.convolve(n[:, d], kernel, "valid")[:T] for d in range(D)], -1)
                   for n in noise]).astype(np.float32)


def test_the_controls_take_the_ablations_norm_at_every_token_and_leave_padding_alone():
  x = (np.random.default_rng(3).standard_normal((2, 16, 32))
       * (1 + np.arange(16)[None, :, None])).astype(np.float32)  # Norms grow with position.
  perm = ablation.permutation_within_documents(DOC_IDS)
  in_doc = DOC_IDS != -1
  ablated = _intervene(x, perm, ablation.ABLATED, in_document_BT=in_doc)
  target = np.linalg.norm(ablated, axis=-1)
  for c in (ablation.NOISE, ablation.OTHER_ROW):
    out = _intervene(x, perm, c, in_document_BT=in_doc)
    np.testing.assert_allclose(np.linalg.norm(out[in_doc], axis=-1), target[in_doc], rtol=1e-5)
    np.testing.assert_array_equal(out[~in_doc], x[~in_doc])  # Padding untouched, exactly.
    assert not np.allclose(out[in_doc], x[in_doc], atol=1e-2)
    # The dial: λ < 1 blends from the branch, λ > 1 scales the target.
    np.testing.assert_allclose(_intervene(x, perm, c, lam=0.25, in_document_BT=in_doc)[in_doc],
                               (x + 0.25 * (out - x))[in_doc], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_intervene(x, perm, c, lam=3.0, in_document_BT=in_doc)[in_doc],
                               3.0 * out[in_doc], rtol=1e-5)
    np.testing.assert_array_equal(_intervene(x, perm, c, lam=0.0), x)
  # other_row: the other row's vector at the same position, rescaled (row 0 <- row 1 here).
  other = _intervene(x, perm, ablation.OTHER_ROW)
  partner = controls.derangement(2)
  cos = np.sum(other * x[partner], -1) / np.linalg.norm(other, axis=-1) / np.linalg.norm(
      x[partner], axis=-1)
  np.testing.assert_allclose(cos, 1.0, rtol=1e-5)
  with pytest.raises(ValueError, match="lam"):
    ablation.intervention_inputs(perm, in_doc, ablation.rotation(32), ablation.NOISE, -0.1)


def test_the_derangement_moves_every_row_and_one_row_is_refused():
  for n in range(2, 40):
    d = controls.derangement(n)
    np.testing.assert_array_equal(np.sort(d), np.arange(n))
    assert (d != np.arange(n)).all(), n
  np.testing.assert_array_equal(controls.derangement(9), controls.derangement(9))
  with pytest.raises(ValueError, match="other row"):
    controls.derangement(1)


def test_noise_carries_no_position_and_other_row_keeps_it():
  """On a branch with window-8 recency (lag-1 cosine ≈ 7/8), the noise control's lagged cosine
  profile is flat at 0 within its sampling noise at every lag, as is the ablation's; the
  other_row control keeps the profile (another row's branch has the same recency)."""
  B, T, D, w = 8, 256, 16, 8
  x = _smooth_branch(B, T, D, w, seed=4)
  seg = np.ones((B, T), int)
  perm = ablation.permutation_within_documents(seg - 1)
  lags = (1, 2, 4, 8, 16, 32)
  profile = lambda v: np.asarray(recency.cosine_profile(v, lags, segment_ids=seg))
  clean = profile(x)
  assert clean[0] > 0.7 and clean[-1] < 0.2
  sd = 1 / np.sqrt(D * B * (T - max(lags)))  # A cosine's SE over the pairs (≈ 1/sqrt(D) each).
  for c in (ablation.NOISE, ablation.ABLATED):
    got = profile(_intervene(x, perm, c))
    assert np.abs(got).max() < 6 * sd + 0.02, (c, got)  # Flat: no lag stands out.
  np.testing.assert_allclose(profile(_intervene(x, perm, ablation.OTHER_ROW)), clean, atol=0.1)


def _stream_with_a_recent_branch():
  """(h, r, perm, gap): a branch h with window-8 recency (lag-1 cosine c ≈ 7/8), a
  recency-free rest r of twice its norm, one document per row's permutation, and the stream's
  gap f(1) − f(64)."""
  B, T, D, w = 8, 256, 32, 8
  h = _smooth_branch(B, T, D, w, seed=5)
  r = 2 * np.random.default_rng(6).standard_normal((B, T, D)).astype(np.float32)
  seg = np.ones((B, T), int)
  perm = ablation.permutation_within_documents(seg - 1)
  gap = lambda v: float(np.subtract(*np.asarray(
      recency.cosine_profile(v, (1, 64), segment_ids=seg))))
  return h, r, perm, gap


def test_rotated_control_raises_the_streams_gap_noise_adds_no_position():
  """The audit's flaw on a stream x = r + h, r a recency-free part twice the branch's norm (the
  residual stream holds more than one branch), h a branch with recency c(1) ≈ 7/8. The rotated
  control's perturbation δR keeps ⟨δ_t, δ_s⟩ ⊃ ⟨h_t, h_s⟩: lag-1 cosine ≈ 2c|h|²/(|r|² + 3|h|²)
  = 2c/7 against clean c/5, a raised gap. The noise control leaves the stream with no recency:
  the same as the ablation (both remove the branch's, neither adds any); other_row keeps it."""
  h, r, perm, gap = _stream_with_a_recent_branch()
  clean = gap(r + h)
  assert clean == pytest.approx(0.875 / 5, abs=0.03)
  rotated, noise, ablated = (gap(r + _intervene(h, perm, c)) for c in (
      ablation.ROTATED, ablation.NOISE, ablation.ABLATED))
  assert rotated == pytest.approx(2 * 0.875 / 7, abs=0.03) and rotated > clean + 0.04
  assert abs(noise) < 0.02 and abs(noise - ablated) < 0.02
  assert gap(r + _intervene(h, perm, ablation.OTHER_ROW)) == pytest.approx(clean, abs=0.03)


def test_the_additive_controls_keep_the_branch_and_add_the_ablations_norm_without_position():
  """added_noise and scattered: h plus a perturbation of the ablation's norm ‖h_π − h‖ at every
  token, padding untouched, the dial
  scaling the perturbation on both sides of 1. On the stream r + h of the test above the
  perturbation carries no position: the lag-1 cosine is the branch's, diluted by the
  perturbation's norm (|δ|² ≈ 2|h|²): c/7 against clean c/5 and the ablation's 0."""
  x = (np.random.default_rng(3).standard_normal((2, 16, 32))
       * (1 + np.arange(16)[None, :, None])).astype(np.float32)
  perm = ablation.permutation_within_documents(DOC_IDS)
  in_doc = DOC_IDS != -1
  delta = np.linalg.norm(_intervene(x, perm, ablation.ABLATED, in_document_BT=in_doc) - x, axis=-1)
  for c in (ablation.ADDED_NOISE, ablation.SCATTERED):
    out = _intervene(x, perm, c, in_document_BT=in_doc)
    added = np.linalg.norm(out - x, axis=-1)
    np.testing.assert_allclose(added[in_doc], delta[in_doc], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out[~in_doc], x[~in_doc])
    for lam in (0.25, 3.0):
      np.testing.assert_allclose(_intervene(x, perm, c, lam=lam, in_document_BT=in_doc),
                                 x + lam * (out - x), rtol=1e-5, atol=1e-4)
  h, r, perm, gap = _stream_with_a_recent_branch()
  ablated = gap(r + _intervene(h, perm, ablation.ABLATED))
  sources = np.asarray(controls.scatter_sources(np.eye(6)[[0, 1, 2, 3, 4, 0, 5, 1]] *
                                                 np.array([1, 1, 0, 1, 1, 1, 0, 1])[:, None]))
  assert set(sources) == {0, 1, 3, 4, 5, 7}  # Every live token, never a dead one (2 and 6).
  for c in (ablation.ADDED_NOISE, ablation.SCATTERED):
    got = gap(r + _intervene(h, perm, c))
    assert got == pytest.approx(0.875 / 7, abs=0.03), c
    assert got > ablated + 0.08, c


def test_match_damage_brackets_and_bisects_to_the_target():
  calls = []

  def loss(lam):  # clean 1.0, the ablation's 3.0; the control reaches it at λ = 2.6.
    calls.append(lam)
    return 1.0 + 2.0 * min(lam, 4.0) / 2.6
  out = controls.match_damage(loss, 3.0, tolerance=0.01)
  assert out["matched"] and abs(out["loss"] - 3.0) <= 0.01
  assert out["lam"] == pytest.approx(2.6, abs=0.02)
  assert [t[0] for t in out["trace"][:3]] == [1.0, 2.0, 4.0] and len(calls) <= 14
  out = controls.match_damage(lambda lam: 1.0 + 4.0 * lam, 2.0, known={1.0: 5.0})
  assert out["matched"] and out["lam"] == pytest.approx(0.25, abs=0.003)
  assert out["trace"][0] == [1.0, 5.0]  # Known: not evaluated again.
  out = controls.match_damage(lambda lam: 1.0 + 0.1 * lam, 3.0)  # Cannot cost as much.
  assert not out["matched"] and out["lam"] == controls.LAMBDA_MAX
  assert out["target"] == 3.0


def test_damage_matching_reaches_a_target_loss_on_a_tiny_model():
  """The bisection on a real forward: an initialised tiny SG model, its SWA branch under the
  noise and other_row dials (one compilation for every λ), matched to a loss 0.1 nats over
  clean (an initialised model's ablation may cost nothing; the trained run's end-to-end test
  matches the ablation's own loss)."""
  config = tiny_config()
  model_def, params = init_model(config.model, 0)
  params["blocks"][0]["attn"]["wo_NHD"] = 8 * np.asarray(params["blocks"][0]["attn"]["wo_NHD"])
  moved = ablation.with_permutations(loader.eval_batches(config)[:2])
  evaluate = lambda b, token_losses: context_loss.evaluate_by_context(
      model_def, params, b, bucket_size=config.eval.bucket_size,
      train_seq_len=config.data.seq_len, token_losses=token_losses)
  token_losses = ablation.eval_token_losses(model_def, (0,), config.model.d_model)
  target = evaluate(moved, None)["loss"] + 0.1
  for c in (ablation.NOISE, ablation.OTHER_ROW):
    out = controls.match_damage(
        lambda lam, c=c: evaluate(ablation.for_condition(moved, c, lam),
                                  token_losses)["loss"], target)
    assert out["matched"] and abs(out["loss"] - target) <= controls.DAMAGE_TOLERANCE, out
    assert 0 < out["lam"] <= controls.LAMBDA_MAX


def _zeroed_local_setup():
  config = tiny_config()  # pattern SG: layer 0 SWA, layer 1 global NoPE
  model_def, params = init_model(config.model, 0)
  params["blocks"][0]["attn"]["wo_NHD"] = np.zeros_like(params["blocks"][0]["attn"]["wo_NHD"])
  hook = RecencyHook(config, model_def, loader.probe_pool(config), writer=None,
                     lags=(1, config.metrics.far_lag))  # Few lags: a quicker compile.
  evaluate = lambda batches, token_losses: context_loss.evaluate_by_context(
      model_def, params, batches, bucket_size=config.eval.bucket_size,
      train_seq_len=config.data.seq_len, token_losses=token_losses)
  return config, hook, params, evaluate


def test_an_intervention_on_a_zero_branch_leaves_the_token_losses_unchanged():
  """The forward the loss is scored with, under each condition and a λ on each side of 1, in
  one compiled program (mode and λ are arrays of the batch)."""
  config = tiny_config()
  model_def, params = init_model(config.model, 0)
  params["blocks"][0]["attn"]["wo_NHD"] = np.zeros_like(params["blocks"][0]["attn"]["wo_NHD"])
  (moved,) = ablation.with_permutations(loader.eval_batches(config)[:1])
  token_losses = ablation.eval_token_losses(model_def, (0,), config.model.d_model)
  assert token_losses is ablation.eval_token_losses(model_def, (0,), config.model.d_model)
  runs = [(c, lam) for c in controls.MODES for lam in (1.0, 0.5, 3.0)]
  batches = [ablation.for_condition([moved], c, lam)[0] for c, lam in runs]
  fn = jax.jit(lambda p, bs: [model_def.token_losses(p, bs[0])[0]]
               + [token_losses(p, b)[0] for b in bs])
  clean, *others = jax.device_get(fn(params, batches))
  for (c, lam), out in zip(runs, others):
    np.testing.assert_array_equal(out, clean, err_msg=f"{c} λ={lam}")
  params["blocks"][0]["attn"]["wo_NHD"] = np.ones_like(params["blocks"][0]["attn"]["wo_NHD"])
  clean, *others = jax.device_get(fn(params, batches[::3]))  # A live branch: each changes them.
  for c, out in zip(controls.MODES, others):
    assert np.abs(out - clean).max() > 1e-3, c


@pytest.mark.long
@pytest.mark.integration
def test_an_intervention_on_a_zero_branch_changes_no_measurement():
  config, hook, params, evaluate = _zeroed_local_setup()
  layers = ablation.check("local", config.model)
  assert layers == [0]
  out = ablation.measure(hook, params, loader.eval_batches(config), evaluate, step=3,
                         layers=layers)
  (g,) = out["global_layers"]
  assert (g["layer"], g["nope"]) == (1, True)
  for key in ("gap", "logit_gap", "logit_gap_heads", "alignment", "alignment_heads"):
    for c in ablation.ALL_CONDITIONS:
      assert g[c][key] == g[ablation.CLEAN][key], (c, key)
  for name, _, _ in ablation.DIFFERENCES:
    for key in ("gap", "logit_gap", "logit_gap_signed", "alignment"):
      assert g[name][key] == 0.0, (name, key)
    assert g[name]["logit_gap_heads"] == [0.0] * config.model.num_heads
  ev = out["eval"]
  for c in ablation.ALL_CONDITIONS:
    assert ev[c] == ev[ablation.CLEAN], c
  # Every control costs what the ablation costs (nothing) at λ = 1: matched at once.
  for c in ablation.MATCHED:
    assert out["damage"][c]["matched"] and out["damage"][c]["trace"] == [[1.0, ev[c]["loss"]]]
  assert out["loss_delta"]["ablated_minus_clean"]["loss"] == 0.0
  (local,) = out["local_layers"]
  assert local["layer"] == 0 and local["layer_type"] == "swa"
  assert out["permutation_seed"] == ablation.PERMUTATION_SEED
  assert out["rotation_seed"] == ablation.ROTATION_SEED
  lines = ablation.summary_lines(out)
  assert len(lines) == 3 + len(ablation.ALL_CONDITIONS) - 2
  assert lines[1].startswith("  layer 1 global: gap at input")


def test_check_names_the_flag_and_the_pattern_in_one_line():
  with pytest.raises(checkpoints.AnalysisError) as e:
    ablation.check("local", tiny_config(model__pattern="G").model)
  assert "--ablate=local" in str(e.value) and "model.pattern='G'" in str(e.value)
  assert "\n" not in str(e.value) and isinstance(e.value, UserError)
  with pytest.raises(checkpoints.AnalysisError, match="expected one of local"):
    ablation.check("global", tiny_config().model)
  with pytest.raises(checkpoints.AnalysisError, match="no global layer"):
    ablation.check("local", tiny_config(model__pattern="S").model)
  assert ablation.check("local", tiny_config(model__pattern="LDG", model__num_layers=6)
                        .model) == [0, 1, 3, 4]


def test_analyze_refuses_a_global_only_run_before_restoring_anything(tmp_path):
  with open(tmp_path / run_dir.CONFIG, "w") as f:
    f.write(tiny_config(model__pattern="G").to_json_best_effort())
  with pytest.raises(checkpoints.AnalysisError, match=r"--ablate=local: model.pattern='G'"):
    # No checkpoints: would fail otherwise.
    report.analyze(open_readonly(str(tmp_path)), ablate="local")
  assert os.listdir(tmp_path) == [run_dir.CONFIG]


@pytest.mark.long
@pytest.mark.integration
def test_ablate_local_end_to_end_writes_the_documented_keys(tmp_path_factory, tmp_path):
  workdir = trained_run(tmp_path_factory)
  result = report.analyze(open_readonly(workdir), step=8, lengths=(), out_dir=str(tmp_path),
                          figures=False,
                          ablate="local")
  path = os.path.join(str(tmp_path), run_dir.ABLATION_FILE.format(seq_len=64))
  assert path in result["files"]
  with open(path) as f:
    out = json.load(f)
  assert set(out) == {"workdir", "train_seq_len", "step", "seq_len", "ablate", "conditions",
                      "control", "far_lag", "lags", "permutation_seed", "rotation_seed",
                      "noise_seed", "derangement_seed", "added_noise_seed", "scatter_seed",
                      "damage", "local_layers",
                      "global_layers", "summary", "eval", "loss_delta", "probe", "logit_sums"}
  assert out["conditions"] == list(ablation.ALL_CONDITIONS)
  assert out["control"] == "added_noise_matched"
  for c in ablation.MATCHED:  # The bisection reached the ablation's loss on this run.
    d = out["damage"][c]
    assert set(d) == {"lam", "loss", "target", "matched", "trace", "tolerance"}
    assert d["matched"] and abs(out["eval"][c]["loss"] - out["eval"]["ablated"]["loss"]) <= (
        d["tolerance"])
  assert (out["step"], out["seq_len"], out["ablate"]) == (8, 64, "local")
  assert [r["layer"] for r in out["local_layers"]] == [0]
  (g,) = out["global_layers"]
  per_condition = {"gap", "floor", "gap_stderr", "logit_gap", "logit_gap_stderr",
                   "logit_gap_heads", "logit_gap_heads_stderr", "logit_gap_null", "alignment",
                   "alignment_heads"}
  difference = {"gap", "gap_stderr", "logit_gap", "logit_gap_stderr", "logit_gap_signed",
                "logit_gap_heads", "logit_gap_heads_stderr", "alignment", "alignment_stderr",
                "alignment_heads", "alignment_heads_stderr"}
  for c in ablation.ALL_CONDITIONS:
    assert set(g[c]) == per_condition
    assert out["eval"][c]["seq_len"] == 64
  for name, _, _ in ablation.DIFFERENCES:
    assert set(g[name]) == difference and np.isfinite(g[name]["logit_gap_stderr"])
    assert len(out["loss_delta"][name]["loss_by_position"]) == 4
  # The clean condition is the analysis itself.
  clean = [r for r in result["analysis"]["records"]
           if (r["layer"], r["module"]) == (1, "pre_mixer_norm")][0]
  assert g["clean"]["logit_gap_heads"] == clean["logit_gap"]
  assert out["eval"]["clean"] == result["analysis"]["eval"]
  # The per-document logit sums give back each condition's head-mean logit gap.
  sums, n = out["logit_sums"], out["logit_sums"]["counts"]
  assert sums["layers"] == [1]
  for c in ablation.ALL_CONDITIONS:
    near, far = (np.asarray(sums[c]["1"][k]) for k in ("near", "far"))
    per_head = (near.sum(0) / np.sum(n["near"]) - far.sum(0) / np.sum(n["far"]))
    np.testing.assert_allclose(per_head.mean(), g[c]["logit_gap"], rtol=1e-6, atol=1e-9)
  # The branch's own recency is gone when ablated.
  mixer = out["local_layers"][0]["mixer_gap"]
  assert abs(mixer["ablated"]) < abs(mixer["clean"])
  assert set(out["summary"]) == set(ablation.ALL_CONDITIONS) | {
      name for name, _, _ in ablation.DIFFERENCES}
  assert set(out["summary"]["ablated_minus_added_noise_matched"]) == {
      "gap", "gap_stderr", "logit_gap", "logit_gap_stderr", "logit_gap_signed",
      "logit_gap_signed_stderr", "alignment"}
  assert "ablated − added_noise_matched" in report.summary_text(result)


@pytest.mark.integration
def test_cli_refuses_ablate_local_on_a_global_only_run_in_one_line(tmp_path):
  with open(tmp_path / run_dir.CONFIG, "w") as f:
    f.write(tiny_config(model__pattern="G").to_json_best_effort())
  run = functools.partial(subprocess.run, capture_output=True, text=True, cwd=REPO, timeout=120)
  proc = run([sys.executable, os.path.join(REPO, "launch", "analyze.py"),
              f"--workdir={tmp_path}", "--ablate=local"])
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1] == (
      "analyze.py: --ablate=local: model.pattern='G' has no local mixer (S, L or D) to "
      "ablate; the causal test needs a hybrid such as 'SG'")
  proc = run([sys.executable, os.path.join(REPO, "launch", "analyze.py"),
              f"--workdir={tmp_path}", "--ablate=global"])
  assert proc.returncode == 2 and "value should be one of <local>" in proc.stderr
