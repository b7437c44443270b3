# Tiers (pytest.ini): test_a_profile_of_two_steps_is_written_and_the_run_trains_to_the_end trains a
# run end to end, so it is integration, `make test-all` only.
# test-all only: train.profile_start_step / profile_steps write one trace and the run trains to
# the end (test_a_profile_of_two_steps_is_written_and_the_run_trains_to_the_end; the keys'
# validation stays in `make test`).
"""train.profile_start_step / profile_steps: a trace of those steps, and the run goes on."""
import glob
import json
import os

import pytest

from hybrid_nope.train import loop
from hybrid_nope.errors import ConfigError
from hybrid_nope.validate import validate
from tests.helpers import tiny_config


@pytest.mark.integration
def test_a_profile_of_two_steps_is_written_and_the_run_trains_to_the_end(tmp_path):
  summary = loop.train(tiny_config(train__profile_start_step=3, train__profile_steps=2),
                       str(tmp_path))
  assert summary["step"] == 8
  traces = glob.glob(str(tmp_path / "profile" / "plugins" / "profile" / "*" / "*.xplane.pb"))
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 1000
  with open(tmp_path / "metrics.jsonl") as f:
    assert sorted(json.loads(l)["step"] for l in f if '"loss"' in l) == list(range(1, 9))


@pytest.mark.parametrize("start, steps", [(0, 2), (-1, 0), (1, -1)])
def test_bad_profile_keys_fail_by_name(start, steps):
  with pytest.raises(ConfigError, match="config.train.profile_"):
    validate(tiny_config(train__profile_start_step=start, train__profile_steps=steps))
