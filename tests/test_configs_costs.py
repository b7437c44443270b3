"""The cost paragraph of config docstrings and the rewrite that keeps them in sync."""
import pytest

from configs import base
from configs import costs
from hybrid_nope.train.flops import PEAK_FLOPS, flops_per_token


class Module:
  """Stands in for a configs/NAME.py module."""

  def __init__(self, config):
    self.get_config = lambda: config


def test_the_priced_slice_is_v5p_64_of_32_chips_at_the_datasheet_peak():
  assert (costs.DOCSTRING_TPU, costs.DOCSTRING_CHIPS) == ("v5p-64", 32)
  assert costs.DOCSTRING_PEAK == PEAK_FLOPS["TPU v5p"] == 459e12
  assert 0 < costs.DOCSTRING_MFU < 1


def test_cost_summary_of_a_paper_config_is_flops_per_token_times_tokens_on_the_slice():
  config = base.experiment("350m", 256)
  config.train.steps = 1000
  text = costs.cost_summary(config, "swa256_350m").replace("\n", " ")
  per_token = flops_per_token(config.model, 8192)
  total = per_token * 1000 * 64 * 8192
  hours = total / (32 * 459e12 * costs.DOCSTRING_MFU) / 3600
  assert text.startswith(f"Cost: {per_token / 1e9:.3g} GFLOP/token × 524 M tokens "
                         "(1000 steps × 64 × 8192) = ")
  assert f"= {costs.scientific(total)} FLOPs;" in text
  assert f"~{hours * 60:.0f} min on v5p-64 (32 chips, 459 TFLOP/s each)" in text
  assert text.endswith(f"at an assumed {costs.DOCSTRING_MFU:.0%} MFU.")
  assert "TPU" not in costs.cost_summary(config, "demo") and "MFU" not in costs.cost_summary(
      config, "demo")


@pytest.mark.parametrize("value, text", [(3.675e19, "3.7e19"), (1.04e13, "1.0e13"),
                                         (9.96e5, "1.0e6")])
def test_scientific(value, text):
  assert costs.scientific(value) == text


def test_rewrite_replaces_stale_paragraphs_in_place_keeps_the_rest_and_is_idempotent():
  # A config another engineer adds (gated linear attention), with a stale command, no cost.
  config = base.experiment("120m", None)
  config.model.pattern = "LG"
  source = ('"""120M hybrid, GLA : global NoPE, 1:1.\n\n'
            "  python launch/train.py --config=configs/gla_120m.py --workdir=$WORKDIR\n\n"
            'Hand-written notes stay.\n"""\nfrom configs import base\n')
  new = costs.rewritten(source, Module(config), "gla_120m")
  command, cost = costs.generated(Module(config), "gla_120m")
  assert new == (f'"""120M hybrid, GLA : global NoPE, 1:1.\n\n{command}\n\n{cost}\n\n'
                 'Hand-written notes stay.\n"""\nfrom configs import base\n')
  assert "gs://BUCKET/gla_120m" in command and "v5p-64" in cost
  assert costs.rewritten(new, Module(config), "gla_120m") == new


def test_a_config_without_a_docstring_fails_naming_the_file():
  with pytest.raises(ValueError, match="configs/x_120m.py: expected a module docstring"):
    costs.rewritten("import os\n", Module(base.experiment("120m", 64)), "x_120m")
