# Tiers (pytest.ini): test_each_logged_step_carries_seconds_per_step_eta_and_memory trains a run
# end to end, so it is integration, `make test-all` only.
# test-all only: each logged step of a run carries seconds per step, tokens/s, memory and an ETA
# in its record and log line, and no trace is written unless asked
# (test_each_logged_step_carries_seconds_per_step_eta_and_memory; the ETA arithmetic, duration
# text and memory reading stay in `make test`).
"""The progress line: throughput, MFU, seconds per step, ETA and memory, in the log and records."""
import json
import logging

import jax
import numpy as np
import pytest

from hybrid_nope.train import flops, loop, progress
from tests.helpers import tiny_config


def test_memory_in_use_is_the_host_peak_on_cpu_and_grows_with_an_allocation():
  before, kind = progress.memory_in_use()
  assert kind == "host peak RSS" and before > 1e6
  block = np.ones(64 * 2**20, np.uint8)  # 64 MiB, touched.
  after, _ = progress.memory_in_use()
  assert after >= before and after >= block.nbytes


@pytest.mark.parametrize("seconds, text", [(0, "0m00s"), (59.6, "1m00s"), (754, "12m34s"),
                                           (3 * 3600 + 5 * 60, "3h05m")])
def test_duration_text(seconds, text):
  assert progress._duration(seconds) == text


@pytest.mark.integration
def test_each_logged_step_carries_seconds_per_step_eta_and_memory(tmp_path, caplog):
  config = tiny_config(train__log_every_steps=2)
  with caplog.at_level(logging.INFO):
    loop.train(config, str(tmp_path))
  with open(tmp_path / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f if "seconds_per_step" in line]
  assert [r["step"] for r in records] == [2, 4, 6, 8]
  for r in records:  # tokens/s is the batch's tokens over the measured seconds per step.
    tokens = config.data.batch_size * config.data.seq_len
    assert r["tokens_per_second"] == pytest.approx(tokens / r["seconds_per_step"], rel=1e-9)
    assert r["memory_bytes"] > 1e6
    assert 0 < r["mfu"] < 1  # Against the stated CPU roofline (train/flops.py).
  lines = [m for m in caplog.messages if m.startswith("step 8/8")]
  assert lines and "s/step | ETA 0m00s | host peak RSS" in lines[0]
  assert not (tmp_path / "profile").exists()  # No trace unless train.profile_steps asks.
  eta = [m for m in caplog.messages if m.startswith("step 2/8")][0]
  seconds = records[0]["seconds_per_step"] * 6  # Six steps to go at step 2.
  assert f"ETA {progress._duration(seconds)}" in eta


def test_the_eta_adds_the_side_work_still_due_to_the_mean_step_time(monkeypatch):
  """Steps of 1 s, an eval every 5 steps taking 10 s: at step 6 of 10 the ETA is 4 steps plus
  the eval at step 10, and throughput counts the steps' own time only."""
  now = [0.0]
  monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
  config = tiny_config(train__steps=10, eval__every_steps=5, metrics__every_steps=100,
                       checkpoint__every_steps=100, train__peak_flops=1e12)
  p = progress.Progress(config, 0)
  now[0] += 30.0
  p.note("compile", 30.0)  # The first step's compile is not a step.
  for step in range(1, 7):
    now[0] += 1.0
    record = p.report(step, 1.0, 0.0)
    assert record["seconds_per_step"] == pytest.approx(1.0)
    if step == 5:
      now[0] += 10.0
      p.note("eval", 10.0)
  assert p.eta_seconds(6) == pytest.approx(4 * 1.0 + 10.0)
  assert p.eta_seconds(10) == 0.0
  for seconds in (28.0, 13.0, 11.0):  # The first hook also compiled: left out once others come.
    p.note("hooks", seconds)
  assert p._mean("hooks") == pytest.approx(12.0)


# The tiny config's training FLOPs per token, by hand: per layer q,k,v,o 32·8·(2·4 + 2·2) = 3072
# and the MLP 3·32·64 = 6144, two layers, the head 32·258 = 8256: 26688 matmul params, × 6;
# attention 4·N·H per attended pair, S (window 4) 250/64 pairs per query and G 32.5 at T=64,
# × 3 for forward and backward.
TINY_FLOPS_PER_TOKEN = 6 * 26688 + 3 * (4 * 4 * 8 * (250 / 64) + 4 * 4 * 8 * 32.5)


def test_mfu_is_the_models_flops_over_the_stated_peak_which_the_progress_line_names(
    monkeypatch, caplog):
  now = [0.0]
  monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
  config = tiny_config(train__peak_flops=1e9)
  with caplog.at_level(logging.INFO):
    p = progress.Progress(config, 0)
    now[0] += 2.0
    record = p.report(2, 3.0, 1e-3)  # Two steps of 2 × 64 tokens in 2 s: 128 tokens/s.
  devices = jax.device_count()
  assert record["mfu"] == pytest.approx(128 * TINY_FLOPS_PER_TOKEN / (1e9 * devices), rel=1e-12)
  assert p.peak_source.startswith(f"{1 * devices} GFLOP/s: config train.peak_flops")
  assert f"MFU against {p.peak_source}" in caplog.messages
  line = [m for m in caplog.messages if m.startswith("step 2/8")][0]
  assert f"MFU {100 * record['mfu']:.1f}% of {1 * devices} GFLOP/s |" in line
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_mfu_above_the_peak_warns_once_naming_it(monkeypatch, caplog):
  now = [0.0]
  monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
  p = progress.Progress(tiny_config(train__peak_flops=1e3), 0)
  with caplog.at_level(logging.WARNING):
    for step in (1, 2):
      now[0] += 1.0
      assert p.report(step, 3.0, 1e-3)["mfu"] > 1
  (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert "above 100%" in warning and p.peak_source in warning
  assert "set train.peak_flops" in warning and flops.CPU_ROOFLINE_COMMAND in warning


def test_the_cpu_peak_is_the_stated_roofline_per_core_times_the_cores():
  peak, source = flops.peak_flops_per_device()
  cores, devices = flops.host_cores(), jax.local_device_count()
  assert peak == flops.CPU_PEAK_FLOPS_PER_CORE * cores / devices
  assert f"{flops.CPU_PEAK_FLOPS_PER_CORE / 1e9:.1f} GFLOP/s per core × {cores} cores" in source
  assert flops.CPU_ROOFLINE_COMMAND in source
  assert flops.peak_flops_per_device(5e12) == (5e12, "config train.peak_flops")


@pytest.mark.parametrize("rate, text", [(131.9e9, "131.9 GFLOP/s"), (989e12, "989 TFLOP/s"),
                                        (32 * 459e12, "14.69 PFLOP/s")])
def test_rates_read_in_their_unit(rate, text):
  assert progress._rate(rate) == text
