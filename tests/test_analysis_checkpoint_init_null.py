"""The empirical init null (analysis/checkpoint/init_null.py): moments over fresh draws, and the
draws themselves kept in seed order so statistics that combine records pair them by draw."""

import numpy as np
import pytest

from hybrid_nope.analysis.checkpoint import init_null


def _fake(num_seeds):
  rng = np.random.default_rng(0)
  gaps = {seed: rng.normal(size=2) for seed in
          range(init_null.INIT_SEED_BASE, init_null.INIT_SEED_BASE + num_seeds)}
  records_of = lambda params: [
      {"layer": layer, "module": "input", "gap": float(params["gaps"][layer]),
       "logit_gap": [1.0, float(params["gaps"][layer])]} for layer in range(2)]
  init = lambda seed: {"gaps": gaps[seed]}
  summarize = lambda records: {"gap": float(np.mean([r["gap"] for r in records]))}
  return gaps, init_null.measure(records_of, init, summarize, num_seeds)


def test_moments_and_draws_follow_the_seeds():
  gaps, null = _fake(5)
  draws = np.asarray([gaps[s] for s in null["seeds"]])
  for layer in range(2):
    got = null["records"][f"{layer}/input"]["gap"]
    assert got["values"] == pytest.approx(draws[:, layer].tolist())
    assert got["mean"] == pytest.approx(draws[:, layer].mean())
    assert got["sd"] == pytest.approx(draws[:, layer].std(ddof=1))
    assert got["draws"] == 5
    head_mean = null["records"][f"{layer}/input"]["logit_gap"]["values"]
    assert head_mean == pytest.approx(((1.0 + draws[:, layer]) / 2).tolist())
  assert null["summary"]["gap"]["values"] == pytest.approx(draws.mean(1).tolist())


def test_a_missing_draw_stays_in_its_place():
  m = init_null._moments([0.5, None, float("nan"), 1.5])
  assert m["values"] == [0.5, None, None, 1.5]
  assert m["draws"] == 2 and m["mean"] == pytest.approx(1.0)


def test_one_draw_is_refused():
  with pytest.raises(ValueError, match="init_seeds=1"):
    init_null.measure(lambda p: [], lambda s: {}, lambda r: {}, 1)
