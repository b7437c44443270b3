"""A rerun of the causal test replacing a run's packed one (analysis/checkpoint/ablation_rerun.py):
only a rerun of the same checkpoint and probe may, and then only that record changes."""
import json

import pytest

from hybrid_nope import sweep
from hybrid_nope.analysis.checkpoint import ablation_rerun

REL = "analysis/step_640/ablation_T1024.json"


def _ablation(**changes):
  out = {"step": 640, "seq_len": 1024, "train_seq_len": 1024, "far_lag": 512, "ablate": "local",
         "permutation_seed": 1, "probe": {"rows": [0, 1, 2]},
         "eval": {"clean": {"loss": 1.4293}, "ablated": {"loss": 3.5551}},
         "conditions": ["clean", "ablated", "noise_matched"]}
  out.update(changes)
  return out


def _pack(tmp_path, ablation):
  return sweep.write_pack({REL: json.dumps(ablation).encode(), "metrics.jsonl": b"m\n",
                           "config.json": b"{}"}, str(tmp_path / "seed0.tar.gz"))


def _rerun(tmp_path, ablation):
  path = tmp_path / "run" / REL
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps(ablation))
  return str(tmp_path / "run")


def test_a_rerun_of_the_same_checkpoint_replaces_only_the_ablation_file(tmp_path):
  pack = _pack(tmp_path, _ablation())
  before = sweep.read_pack(pack)
  newer = _ablation(conditions=["clean", "ablated", "noise_matched", "added_noise_matched"])
  newer["eval"]["clean"]["loss"] *= 1 + 6e-5  # A retrain on another thread count: allowed.
  assert ablation_rerun.replace_in_pack(pack, _rerun(tmp_path, newer)).endswith(REL)
  after = sweep.read_pack(pack)
  replaced = json.loads(after[REL])
  assert replaced["conditions"][-1] == "added_noise_matched"
  assert replaced["rerun_of"] == {"clean": {"packed_eval_loss": 1.4293},
                                  "ablated": {"packed_eval_loss": 3.5551}, "bitwise": False}
  assert {k: v for k, v in after.items() if k != REL} == {
      k: v for k, v in before.items() if k != REL}


@pytest.mark.parametrize("changes, named", [
    ({"eval": {"clean": {"loss": 1.4400}, "ablated": {"loss": 3.5551}}}, "clean eval loss"),
    ({"eval": {"clean": {"loss": 1.4293}, "ablated": {"loss": 3.6}}}, "ablated eval loss"),
    ({"step": 576}, "step: packed 640, rerun 576"),
    ({"probe": {"rows": [0, 1, 3]}}, "probe rows differ"),
    ({"permutation_seed": 2}, "permutation_seed")])
def test_a_rerun_of_another_checkpoint_or_probe_is_refused_and_nothing_written(
    tmp_path, changes, named):
  pack = _pack(tmp_path, _ablation())
  before = open(pack, "rb").read()
  with pytest.raises(ValueError, match=named):
    ablation_rerun.replace_in_pack(pack, _rerun(tmp_path, _ablation(**changes)))
  assert open(pack, "rb").read() == before


def test_a_pack_without_a_causal_test_is_refused(tmp_path):
  pack = sweep.write_pack({"metrics.jsonl": b"m\n"}, str(tmp_path / "seed0.tar.gz"))
  with pytest.raises(ValueError, match="expected one ablation_T"):
    ablation_rerun.replace_in_pack(pack, str(tmp_path))


def test_the_cli_replaces_or_refuses_in_one_line(tmp_path):
  import os
  import subprocess
  import sys
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  pack = _pack(tmp_path, _ablation())
  run = lambda workdir: subprocess.run(
      [sys.executable, os.path.join(repo, "launch/replace_ablation.py"), f"--pack={pack}",
       f"--workdir={workdir}"], capture_output=True, text=True, cwd=str(tmp_path))
  refused = run(_rerun(tmp_path / "other", _ablation(step=576)))
  assert refused.returncode != 0 and "did not measure" in refused.stderr
  done = run(_rerun(tmp_path, _ablation()))
  assert done.returncode == 0 and "its causal test replaced by" in done.stdout
  assert json.loads(sweep.read_pack(pack)[REL])["rerun_of"]["bitwise"] is True
