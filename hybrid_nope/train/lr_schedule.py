"""The learning-rate schedules of train.schedule, each a linear warmup from 0 to the peak
(train.learning_rate) over train.warmup_steps, then:

  cosine    cosine decay to the floor (min_learning_rate_ratio × peak) at train.steps;
  wsd       warmup-stable-decay: the peak until the last decay_fraction × steps, then a 1 − sqrt
            cooldown to the floor. Hägele et al. 2024 ("Scaling Laws and Compute-Optimal
            Training Beyond Fixed Training Durations", §3) found 1 − sqrt beat linear cooldowns
            and, over 20% of training, matched cosine; MiniCPM (Hu et al. 2024) introduced WSD.
            A run can be stopped or extended before the decay without a new schedule;
  linear    linear decay to the floor at train.steps;
  constant  the peak to the end.

optax builds each; only the 1 − sqrt cooldown is written here (optax has no such schedule).

Update n (n = 1, 2, ...) runs at lr(n − 1 + train.schedule_offset): offset 1 trains from the
first update (lr(1) = peak / warmup_steps) and the last update runs at the floor; offset 0 is
the runs from before the key, whose first update ran at lr(0) = 0 (run_config.ADDED_KEYS).
"""
from __future__ import annotations

import jax.numpy as jnp
import optax

from hybrid_nope.config_values import SCHEDULES, decay_steps



def one_minus_sqrt(peak: float, floor: float, steps: int) -> optax.Schedule:
  """peak → floor over `steps`: floor + (peak − floor)(1 − sqrt(t / steps)), then floor."""
  def schedule(count):
    done = jnp.clip(count / steps, 0.0, 1.0)
    return floor + (peak - floor) * (1.0 - jnp.sqrt(done))
  return schedule


def _by_step(train_cfg) -> optax.Schedule:
  """lr at schedule step t (t = 0 before any update)."""
  kind, peak = train_cfg.schedule, train_cfg.learning_rate
  warmup, steps = train_cfg.warmup_steps, train_cfg.steps
  floor = peak * train_cfg.min_learning_rate_ratio
  if kind == "cosine":  # Runs from before train.schedule; keep its exact arithmetic.
    return optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=peak,
                                              warmup_steps=warmup, decay_steps=steps,
                                              end_value=floor)
  ramp = optax.linear_schedule(0.0, peak, warmup)
  if kind == "constant":  # Not optax.warmup_constant_schedule: without warmup it stays at 0.
    return optax.join_schedules([ramp, optax.constant_schedule(peak)], [warmup])
  if kind == "linear":
    return optax.join_schedules([ramp, optax.linear_schedule(peak, floor, steps - warmup)],
                                [warmup])
  if kind == "wsd":
    cooldown = decay_steps(train_cfg)
    return optax.join_schedules(
        [ramp, optax.constant_schedule(peak), one_minus_sqrt(peak, floor, cooldown)],
        [warmup, steps - cooldown])
  raise ValueError(f"train.schedule={kind!r}: expected one of {SCHEDULES}")


def learning_rate_schedule(train_cfg) -> optax.Schedule:
  """count (updates applied before this one) -> this update's learning rate."""
  by_step, offset = _by_step(train_cfg), train_cfg.schedule_offset
  if offset == 0:
    return by_step
  return lambda count: by_step(count + offset)
