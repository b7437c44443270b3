"""The layer letters: one table read by the model, the validation, the hook and the analysis."""
import ml_collections
import pytest

from hybrid_nope.model import pattern


def test_layer_kinds_repeat_the_pattern_and_reject_unknown_letters_by_name():
  assert pattern.layer_kinds("SG", 4) == "SGSG"
  assert pattern.layer_kinds("LG", 2) == "LG"
  assert pattern.layer_kinds("DDDG", 8) == "DDDGDDDG"
  with pytest.raises(ValueError, match=r"unknown letters \['X'\]"):
    pattern.layer_kinds("SX", 4)
  with pytest.raises(ValueError, match="multiple of len"):
    pattern.layer_kinds("SG", 3)


@pytest.mark.parametrize("letters, window", [("SG", 256), ("G", None), ("LG", None),
                                             ("SLG", 256), ("DDDG", None), ("SDG", 256)])
def test_window_is_read_only_where_a_layer_is_sliding(letters, window):
  model = ml_collections.ConfigDict(dict(pattern=letters, window=256))
  assert pattern.window_of(model) == window


def test_record_layer_types_are_distinct_and_the_local_mixers_are_s_l_and_d():
  types = [k.layer_type for k in pattern.KINDS.values()]
  assert sorted(types) == ["delta", "global", "linear", "swa"]
  assert {k for k, v in pattern.KINDS.items() if v.local} == {"S", "L", "D"}
