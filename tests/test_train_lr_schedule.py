"""Each train.schedule against its formula written here in numpy, and train.schedule_offset:
the first update trains (offset 1), or runs at lr 0 as the runs before the key (offset 0)."""
import importlib

import numpy as np
import pytest

from hybrid_nope.train.lr_schedule import SCHEDULES, learning_rate_schedule
from tests.helpers import tiny_config

PEAK, RATIO, WARMUP, STEPS, FRACTION = 1e-3, 0.1, 10, 100, 0.2
FLOOR = PEAK * RATIO


def reference(kind: str, t: np.ndarray) -> np.ndarray:
  """lr at schedule step t, float64: a linear warmup from 0, then the schedule's shape."""
  t = np.asarray(t, np.float64)
  after = np.clip((t - WARMUP) / (STEPS - WARMUP), 0.0, 1.0)  # Fraction of the post-warmup.
  if kind == "cosine":
    rest = FLOOR + (PEAK - FLOOR) * 0.5 * (1 + np.cos(np.pi * after))
  elif kind == "linear":
    rest = PEAK + (FLOOR - PEAK) * after
  elif kind == "constant":
    rest = np.full_like(t, PEAK)
  else:  # wsd: peak, then 1 - sqrt over the last FRACTION of the steps.
    cooldown = FRACTION * STEPS
    done = np.clip((t - (STEPS - cooldown)) / cooldown, 0.0, 1.0)
    rest = FLOOR + (PEAK - FLOOR) * (1 - np.sqrt(done))
  return np.where(t < WARMUP, PEAK * t / WARMUP, rest)


def train_cfg(kind: str, offset: int = 1, **more):
  return tiny_config(**{**dict(train__schedule=kind, train__learning_rate=PEAK,
                               train__min_learning_rate_ratio=RATIO, train__warmup_steps=WARMUP,
                               train__steps=STEPS, train__decay_fraction=FRACTION,
                               train__schedule_offset=offset), **more}).train


# Warmup, its end, the stable phase, the wsd decay's start, middle and end, and past the end.
STEPS_CHOSEN = np.array([0, 1, 5, 9, 10, 11, 30, 50, 79, 80, 81, 90, 99, 100, 120])


@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize("offset", [0, 1])
def test_each_schedule_matches_its_formula(kind, offset):
  lr = learning_rate_schedule(train_cfg(kind, offset))
  got = np.array([float(lr(int(count))) for count in STEPS_CHOSEN])
  np.testing.assert_allclose(got, reference(kind, STEPS_CHOSEN + offset), rtol=2e-6,
                             atol=1e-12)


@pytest.mark.parametrize("kind", SCHEDULES)
def test_the_first_update_trains_and_the_last_reaches_the_floor(kind):
  lr = learning_rate_schedule(train_cfg(kind))
  assert float(lr(0)) == pytest.approx(PEAK / WARMUP)  # count 0: the first update.
  assert float(lr(WARMUP - 1)) == pytest.approx(PEAK)  # Update WARMUP runs at the peak.
  end = PEAK if kind == "constant" else FLOOR
  assert float(lr(STEPS - 1)) == pytest.approx(end)  # The last update.


def test_offset_zero_keeps_the_older_runs_first_update_at_lr_zero():
  assert float(learning_rate_schedule(train_cfg("cosine", offset=0))(0)) == 0.0
  assert float(learning_rate_schedule(train_cfg("cosine", offset=1))(0)) > 0.0


def test_without_warmup_every_schedule_starts_at_the_peak():
  for kind in SCHEDULES:
    lr = learning_rate_schedule(train_cfg(kind, offset=0, train__warmup_steps=0))
    assert float(lr(0)) == pytest.approx(PEAK), kind


@pytest.mark.parametrize("name", ["small", "small_prose"])
def test_the_committed_sweeps_configs_pin_the_first_update_at_lr_zero(name):
  # Their runs (docs/results/runs*) trained before train.schedule_offset: resumes and reruns
  # must keep that trajectory (run_config.ADDED_KEYS reads their config.json as offset 0).
  config = importlib.import_module(f"configs.{name}").get_config("swa64")
  assert config.train.schedule_offset == 0
  assert tiny_config().train.schedule_offset == 1  # New runs train from the first update.
