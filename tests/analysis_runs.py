"""Tiny trained (and analysed) runs shared by the analysis tests, built once per process."""
import os

from hybrid_nope.analysis.checkpoint import report
from hybrid_nope.analysis.measure.hook import RecencyHook
from hybrid_nope.train import loop
from hybrid_nope.run.reader import open_readonly
from tests.helpers import tiny_config

_CACHE = {}


def trained_run(tmp_path_factory) -> str:
  """A tiny SG run: 8 steps, checkpoints at 4 and 8, recency at 0, 4, 8, eval at 4 and 8."""
  if "run" not in _CACHE:
    workdir = str(tmp_path_factory.mktemp("tiny_run"))
    config = tiny_config()
    loop.train(config, workdir, hooks=[RecencyHook.for_run])
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):  # Older loops did not write it.
      with open(path, "w") as f:
        f.write(config.to_json_best_effort())
    _CACHE["run"] = workdir
  return _CACHE["run"]


def analyzed_run(tmp_path_factory) -> tuple[str, dict]:
  """trained_run analysed at step 8, training length, extrapolation at 1x and 2x."""
  if "analysis" not in _CACHE:
    workdir = trained_run(tmp_path_factory)
    _CACHE["analysis"] = report.analyze(open_readonly(workdir), step=8, lengths=(1, 2))
  return _CACHE["run"], _CACHE["analysis"]
