"""Per-head sign flips of the logit gap and the seed-clustered test of two configs
(analysis/evidence/flip_counts.py): the count is compare.sign_flips per head; the exact sign-flip
test over seeds keeps its size under a run-level random effect where a test that treats heads as
independent across seeds over-rejects; a large difference is found; and the committed
nopeswa256 / swa256 packs give the page's numbers."""
import os

import numpy as np
import pytest
import scipy.stats

from hybrid_nope import sweep
from hybrid_nope.analysis.evidence import compare, flip_counts
from hybrid_nope.run.reader import open_readonly

STEPS = np.arange(21) * 32  # the committed runs' recency steps: 0, 32, …, 640
LAYERS, HEADS_PER_LAYER, SEEDS, SE = (1, 3), 4, 5, 0.05
HEADS = len(LAYERS) * HEADS_PER_LAYER


def simulate(rng, sweeps, scales, tau, seeds=SEEDS):
  """Logit-gap series [steps, sweeps, config, seed, head] of two configs: per head a fixed
  offset, a random walk whose per-step scale is the config's times exp(run effect), and
  measurement noise of SD SE. The run effect (N(0, tau) on the log scale, one per seed ×
  config) is shared by the run's heads: heads of one run are correlated, as in training."""
  run = rng.normal(0.0, tau, (sweeps, 2, seeds, 1))
  scale = np.asarray(scales)[None, :, None, None] * np.exp(run)
  shape = (len(STEPS), sweeps, 2, seeds, HEADS)
  walk = np.cumsum(rng.normal(0.0, 1.0, shape), axis=0) * scale
  values = rng.normal(0.0, 0.2, shape[1:]) + walk + rng.normal(0.0, SE, shape)
  return values, np.full(shape, SE)


def flipped(values, stderrs):
  """Whether each head flips after init: [sweeps, config, seed, head]."""
  return flip_counts.significant_flips(values[1:], stderrs[1:]) > 0


def pooled_heads_p(f):
  """The mutant: every head of every seed an independent trial (a one-sided two-proportion z
  test of config 0 > config 1 on the pooled counts), the seed cluster ignored."""
  n = f.shape[2] * f.shape[3]
  pa, pb = f[:, 0].mean(axis=(1, 2)), f[:, 1].mean(axis=(1, 2))
  pooled = (pa + pb) / 2
  z = (pa - pb) / np.sqrt(np.maximum(pooled * (1 - pooled) * 2 / n, 1e-12))
  return scipy.stats.norm.sf(z)


def as_layers(values):
  """One run's [steps, heads] series as load_layers returns them."""
  return {layer: {"steps": list(STEPS),
                  "logit_gap": values[:, i * HEADS_PER_LAYER:(i + 1) * HEADS_PER_LAYER].tolist(),
                  "logit_gap_stderr": np.full((len(STEPS), HEADS_PER_LAYER), SE).tolist()}
          for i, layer in enumerate(LAYERS)}


def test_the_count_is_compare_sign_flips_per_head():
  assert flip_counts.SIGNIFICANT_SE == compare.SIGNIFICANT_SE
  rng = np.random.default_rng(0)
  values = rng.normal(0.0, 0.1, (21, 6))
  stderrs = rng.uniform(0.01, 0.06, (21, 6))
  values[3, 1], stderrs[7, 2], values[0, 4] = np.nan, np.nan, None  # unknown points skip
  got = flip_counts.significant_flips(values, stderrs)
  for h in range(6):
    assert got[h] == compare.sign_flips(list(values[:, h]), list(stderrs[:, h]))
  assert list(flip_counts.significant_flips([[1.0], [-1.0], [0.01], [1.0]],
                                            [[0.1]] * 4)) == [2]  # noise neither flips nor resets


def test_head_flips_leave_out_init_and_keep_layer_order():
  up_down = np.array([[1.0] * 4] * 2 + [[-1.0] * 4] * 19)  # flips between steps 32 and 64
  run = {3: {"steps": list(STEPS), "logit_gap": (-up_down).tolist(),
             "logit_gap_stderr": [[0.1] * 4] * 21},
         1: {"steps": list(STEPS), "logit_gap": up_down.tolist(),
             "logit_gap_stderr": [[0.1] * 4] * 21}}
  assert list(flip_counts.head_flips(run)) == [1] * 8
  run[1]["logit_gap"][1] = [-1.0] * 4  # step 32 now agrees with the rest: layer 1 flips only
  assert list(flip_counts.head_flips(run)) == [0] * 4 + [1] * 4  # at step 0, left out
  assert list(flip_counts.head_flips(run, after_init=False)) == [1] * 8


def test_sign_flip_p_is_the_exact_paired_permutation_test():
  d = [0.1, 0.25, -0.05, 0.3, 0.125]
  got = flip_counts.sign_flip_p(d)
  ref = scipy.stats.permutation_test((np.array(d),), np.mean, permutation_type="samples",
                                     alternative="greater", n_resamples=np.inf)
  assert got["p_one_sided"] == pytest.approx(ref.pvalue)
  assert got["p_one_sided"] == pytest.approx(2 / 32)  # only all-positive beats it, with d
  assert got["p_two_sided"] == pytest.approx(4 / 32) and not got["at_floor"]
  best = flip_counts.sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5])
  assert best["p_one_sided"] == best["min_p_one_sided"] == pytest.approx(1 / 32)
  assert best["p_two_sided"] == pytest.approx(1 / 16) and best["at_floor"]
  tied = flip_counts.sign_flip_p([0.0, 0.2, 0.3, 0.4, 0.5])
  assert tied["p_one_sided"] == pytest.approx(2 / 32) and tied["at_floor"] and tied["zeros"] == 1


def test_size_under_a_run_level_random_effect_where_pooling_heads_over_rejects():
  """Equal flip propensity in both configs, each run's propensity drawn (tau = 1): over 2000
  sweeps the exact test rejects at 5% in ≤ 5% (+3 MC SEs); the pooled-heads mutant far more.
  Without the random effect the mutant holds its size: the cluster is what it ignores."""
  rng = np.random.default_rng(1)
  sweeps, alpha = 2000, 0.05
  slack = 3 * np.sqrt(alpha * (1 - alpha) / sweeps)
  f = flipped(*simulate(rng, sweeps, (0.1, 0.1), tau=1.0))
  assert 0.2 < f.mean() < 0.8  # flips are neither rare nor universal
  rates = f.mean(axis=-1)
  d = rates[:, 0] - rates[:, 1]
  perm = np.array([flip_counts.sign_flip_p(x)["p_one_sided"] for x in d])
  assert np.mean(perm <= alpha) <= alpha + slack
  assert np.mean(pooled_heads_p(f) <= alpha) > alpha + slack + 0.04
  independent = flipped(*simulate(rng, 1000, (0.1, 0.1), tau=0.0))
  assert np.mean(pooled_heads_p(independent) <= alpha) <= alpha + 0.02


def test_a_large_difference_is_found():
  rng = np.random.default_rng(2)
  f = flipped(*simulate(rng, 300, (0.3, 0.01), tau=0.3))
  rates = f.mean(axis=-1)
  assert rates[:, 0].mean() > 0.5 > 0.1 > rates[:, 1].mean()
  power = np.mean([flip_counts.sign_flip_p(x)["p_one_sided"] <= 0.05
                   for x in rates[:, 0] - rates[:, 1]])
  assert power >= 0.9


def test_compare_flips_end_to_end_and_its_verdict():
  rng = np.random.default_rng(3)
  values, _ = simulate(rng, 1, (0.3, 0.005), tau=0.0)
  runs = [{s: as_layers(values[:, 0, c, s]) for s in range(SEEDS)} for c in (0, 1)]
  result = flip_counts.compare_flips(*runs, names=("nopeswa256", "swa256"))
  assert result["heads"] == {"nopeswa256": HEADS, "swa256": HEADS}
  a, b = (np.array(result["rate"][n]["per_seed"]) for n in ("nopeswa256", "swa256"))
  assert result["difference"]["mean"] == pytest.approx((a - b).mean())
  assert result["rate"]["swa256"]["se"] == pytest.approx(b.std(ddof=1) / np.sqrt(SEEDS))
  assert np.all(a > b)
  assert result["permutation"]["p_one_sided"] == pytest.approx(1 / 32)
  assert 0 < result["bootstrap"]["low"] <= result["difference"]["mean"]
  text = flip_counts.verdict_text(result)
  assert flip_counts.CLAIM in text and "Supported at" in text and "floor binds" in text
  assert "1/32" in text
  assert "Not supported" in flip_counts.verdict_text(result, p=0.031 * 3)  # e.g. Holm over 3
  swapped = flip_counts.compare_flips(runs[1], runs[0])
  assert "Not supported" in flip_counts.verdict_text(swapped)
  four = flip_counts.compare_flips({s: runs[0][s] for s in range(4)},
                                   {s: runs[1][s] for s in range(4)})
  assert "cannot be supported at this number of seeds" in flip_counts.verdict_text(four, 0.05)


def test_the_committed_nopeswa256_and_swa256_runs(tmp_path):
  """As results_page would use it: the committed packs unpacked, per-head flips compared."""
  runs = {}
  for experiment in ("nopeswa256", "swa256"):
    runs[experiment] = {}
    for seed in range(SEEDS):
      pack = os.path.join(sweep.REPO, f"docs/results/runs/{experiment}/seed{seed}.tar.gz")
      workdir = sweep.unpack_records(pack, str(tmp_path / experiment / str(seed)))
      runs[experiment][seed] = flip_counts.load_layers(open_readonly(workdir))
  layers = runs["nopeswa256"][0]
  assert sorted(layers) == list(LAYERS) and layers[1]["steps"] == list(STEPS)
  assert np.shape(layers[1]["logit_gap"]) == (21, HEADS_PER_LAYER)
  result = flip_counts.compare_flips(runs["nopeswa256"], runs["swa256"],
                                     names=("nopeswa256", "swa256"))
  # The figures the page reports (5 seeds × 8 heads each): fewer NoPE heads flip, not more.
  assert result["rate"]["nopeswa256"]["mean"] == pytest.approx(23 / 40)
  assert result["rate"]["swa256"]["mean"] == pytest.approx(28 / 40)
  assert result["difference"]["mean"] == pytest.approx(-0.125)
  assert result["permutation"]["p_one_sided"] == pytest.approx(28 / 32)
  assert "Not supported" in flip_counts.verdict_text(result)
