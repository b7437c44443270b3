# Tiers (pytest.ini): both tests here generate on a run that tests/analysis_runs.py trains end to
# end (8 steps, once per process), and the greedy test runs launch/generate.py in a subprocess,
# so they are integration, `make test-all` only.
# test-all only: greedy continuations on a checkpoint are the forward pass's argmax and the
# command prints them
# (test_greedy_continuations_are_the_forward_pass_argmax_and_the_command_prints_them; the
# sampler's greedy path is checked in `make test` by test_model_sampling.py and
# test_model_decode.py); no prompt is refused (test_no_prompt_is_refused).
"""Generating text on a checkpoint: greedy continuations are the forward pass's argmax, as the
command prints them."""
import subprocess
import sys

import jax
import numpy as np
import pytest

from hybrid_nope.analysis.checkpoint import generate
from hybrid_nope.run import checkpoints
from hybrid_nope.model import checkpointed
from hybrid_nope.data.tokenization.text_codec import text_codec
from hybrid_nope.run.reader import open_readonly
from tests.analysis_runs import trained_run
from tests.helpers import REPO

PROMPTS = ["def recency(x):\n", "import "]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return trained_run(tmp_path_factory)


@pytest.mark.integration
def test_greedy_continuations_are_the_forward_pass_argmax_and_the_command_prints_them(run):
  result = generate.generate_text(open_readonly(run), PROMPTS, max_new_tokens=12)
  config = checkpoints.load_config(run)
  codec = text_codec(config)
  _, model_def, params = checkpointed.restore_params(open_readonly(run, config))
  forward = jax.jit(model_def.bind(params))
  for prompt, sample in zip(PROMPTS, result["samples"]):
    ids, new = codec.encode(prompt), np.array(sample["ids"])
    assert sample["new_tokens"] == len(new) and sample["text"] == codec.decode(new)
    assert len(new) == 12 or new[-1] == codec.eos_id
    # Causal: one forward pass over the whole sequence gives the logits after each prefix.
    logits = np.asarray(forward(np.concatenate([ids, new]).astype(np.int32)[None]))[0]
    np.testing.assert_array_equal(new, logits[len(ids) - 1:-1].argmax(-1))
  assert result["step"] == 8 and result["prompt_tokens"] == sum(len(p) + 1 for p in PROMPTS)
  assert set(result["seconds"]) == {"compile", "prefill", "decode"}

  printed = subprocess.run(
      [sys.executable, "launch/generate.py", f"--workdir={run}", "--max_new_tokens=12",
       *(f"--prompt={p}" for p in PROMPTS)], cwd=REPO, capture_output=True, text=True,
      timeout=300)
  assert printed.returncode == 0, printed.stderr[-2000:]
  for sample in result["samples"]:
    assert sample["prompt"] + sample["text"] in printed.stdout
  assert "tokens/s" in printed.stdout.splitlines()[-1]


@pytest.mark.integration
def test_no_prompt_is_refused(run):
  with pytest.raises(checkpoints.AnalysisError, match="--prompt"):
    generate.generate_text(open_readonly(run), [])
