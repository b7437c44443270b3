"""A tiny configuration shared by tests, as a ConfigDict and as command-line overrides."""
import json
import os
import re
import subprocess
import sys

import ml_collections
import numpy as np

from configs import demo
from hybrid_nope.xla_flags import HOST_DEVICE_COUNT, with_flag

# The demo config shrunk to something that compiles and steps in well under a second.
TINY = {
    "model.num_layers": 2, "model.d_model": 32, "model.num_heads": 4, "model.num_kv_heads": 2,
    "model.head_dim": 8, "model.mlp_dim": 64, "model.window": 4,
    "data.seq_len": 64, "data.batch_size": 2,
    "eval.batch_size": 2, "eval.num_batches": 2, "eval.every_steps": 4, "eval.bucket_size": 16,
    "train.steps": 8, "train.warmup_steps": 2, "train.log_every_steps": 1,
    "checkpoint.every_steps": 4, "checkpoint.keep": 100,
    "metrics.far_lag": 32, "metrics.probe_batch_size": 2,
    # Figures cost ~0.5 s per measurement; test_analysis_hook checks the hook draws them.
    "metrics.figures": False,
}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def xla_flags(devices=None):
  """The tests' XLA_FLAGS (tests/conftest.py), with `devices` simulated CPU devices or, when
  None, the default one."""
  return with_flag(os.environ.get("XLA_FLAGS", ""), HOST_DEVICE_COUNT, devices or None)


def run_8_devices(module, *args, env_extra=None, timeout=600):
  """Runs `python -m module args` on 8 simulated CPU devices; returns its RESULT json line."""
  env = dict(os.environ, XLA_FLAGS=xla_flags(devices=8),
             JAX_PLATFORMS="cpu", PYTHONPATH=REPO, **(env_extra or {}))
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):])


def tiny_config(**overrides) -> ml_collections.ConfigDict:
  """`overrides` use "section__key" names, e.g. model__pattern="G"."""
  c = demo.get_config()
  for key, value in {**TINY, **{k.replace("__", "."): v for k, v in overrides.items()}}.items():
    section, name = key.split(".")
    c[section][name] = value
  return c


def tiny_flags(**overrides) -> list[str]:
  values = {**TINY, **{k.replace("__", "."): v for k, v in overrides.items()}}
  return [f"--config.{k}={v}" for k, v in values.items()]


# Shapes that split over 8 devices in every test mesh (tensor 4 needs kv heads and vocab
# divisible by 4; 260 > 258 byte tokens, the extra two ids are never used).
MESH_TEST = dict(data__batch_size=8, eval__batch_size=8, model__num_kv_heads=4,
                 model__vocab_size=260, train__steps=3, checkpoint__every_steps=3,
                 eval__every_steps=3, metrics__probe_batch_size=2)


def take(iterator, n):
  """The next n items of an iterator."""
  return [next(iterator) for _ in range(n)]


def assert_process_shards_interleave(shards, whole):
  """Process p's batch k of n processes is rows p, p + n, ... of the global batch k."""
  for k, global_batch in enumerate(whole):
    for p, shard in enumerate(shards):
      for key in global_batch:
        np.testing.assert_array_equal(shard[k][key], global_batch[key][p::len(shards)], key)


def assert_same_batches(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], key)


def committed_probe_counts(tmp_dir: str) -> np.ndarray:
  """Pairs per document at lag 1 and at the far lag [2, C] of the committed swa16 seed-0 run's
  probe: the real cluster sizes the evidence tests simulate under."""
  from hybrid_nope import sweep  # pylint: disable=g-import-not-at-top
  from hybrid_nope.analysis.measure import records  # pylint: disable=g-import-not-at-top
  from hybrid_nope.run.run_dir import RunDir  # pylint: disable=g-import-not-at-top
  pack = os.path.join(REPO, "docs/results/runs/swa16/seed0.tar.gz")
  workdir = sweep.unpack_records(pack, tmp_dir)
  with open(RunDir(workdir).recency_sums_file(0), "rb") as f:
    sums, lags, far = records.decode_sums(f.read())
  near_i, far_i = records.near_far(lags, far)
  return np.asarray(sums["counts"], np.float64)[[near_i, far_i]]


def kill_before_first_save(command: list[str], workdir: str, *, env=None, timeout=600) -> None:
  """Starts `command` (a trainer on `workdir`) and kills its process group with SIGKILL once
  step 0's records exist and before any checkpoint, as an OOM or a lost node would."""
  import signal  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
  recency, deadline = os.path.join(workdir, "recency.jsonl"), time.time() + timeout
  while proc.poll() is None and time.time() < deadline:
    if os.path.exists(recency) and os.path.getsize(recency):
      os.killpg(proc.pid, signal.SIGKILL)
      break
    time.sleep(0.02)
  assert proc.wait() == -signal.SIGKILL, f"{command} exited {proc.returncode} before step 0"
  # The leader is reaped; its group's other members (the trainer under a wrapper script) may
  # still be exiting. A requeue comes after the whole job is gone, so wait for that too.
  while time.time() < deadline:
    try:
      os.killpg(proc.pid, 0)
    except ProcessLookupError:
      break
    time.sleep(0.05)
  steps = [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()]
  assert not steps, f"killed too late: checkpoints {steps} exist"


def largest_buffer(hlo_text: str) -> int:
  """Elements of the largest array shape in an HLO module's text."""
  shapes = re.findall(r"\b(?:f32|bf16|f16|s32)\[([0-9,]+)\]", hlo_text)
  return max(int(np.prod([int(n) for n in s.split(",")])) for s in shapes)
