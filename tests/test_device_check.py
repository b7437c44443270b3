# Tiers (pytest.ini): the numerics test interprets two Pallas kernels' forward and backward
# (~2 min on 2 shared cores), so it is integration, `make test-all` only; the table's own rules
# stay in `make test`.
"""benchmarks/device_check.py: a case past the budget or one that raises is a row that says so,
a kernel off its reference is a FAIL row, and the numerics pass for our kernels (interpret mode,
tiny shapes)."""
import dataclasses

import jax.numpy as jnp
import pytest

from benchmarks import device_check, fla_reference

TINY = dataclasses.replace(device_check.DRY, check_T=24, windows=(4,), heads=2, head_dim=8)


def test_a_case_past_the_budget_is_skipped_and_a_raising_one_is_failed(capsys):
  table = device_check.Table(budget_s=100.0)
  table.run("s", "fits", "i", "d", 1, lambda: ("1 ms", "ok"))
  table.run("s", "too long", "i", "d", 1000, lambda: pytest.fail("must not run"))

  def broken():
    raise RuntimeError("out of memory\nsecond line")
  table.run("s", "raises", "i", "d", 1, broken)
  assert table.rows[0] == "| s | fits | i | d | 1 ms | ok |"
  assert "skipped:" in table.rows[1]
  assert table.rows[2].endswith("FAILED RuntimeError: out of memory |")
  assert capsys.readouterr().out.count("\n") == 3  # each row printed as it is measured


@pytest.mark.integration
def test_numerics_pass_for_our_kernels_and_fail_for_a_wrong_one(monkeypatch):
  monkeypatch.setattr(device_check, "MIXER_FAMILIES", ("gla",))
  table = device_check.Table(budget_s=600.0)
  device_check.numerics(table, TINY, interpret=True)
  assert len(table.rows) == 4 and all(r.endswith("| PASS |") for r in table.rows), table.rows

  right = device_check._kernel_pair

  def off_by_a_bit(family, window, interpret):
    kernel, reference = right(family, window, interpret)
    return (lambda *a, segment_ids: kernel(*a, segment_ids=segment_ids) * 1.001), reference
  monkeypatch.setattr(device_check, "_kernel_pair", off_by_a_bit)
  table = device_check.Table(budget_s=600.0)
  device_check.numerics(table, TINY, interpret=True)
  # 1e-3 relative: over float32's 1e-4 bar, under bfloat16's 2e-2.
  assert [r.split("|")[4].strip() for r in table.rows] == ["float32", "bfloat16"] * 2
  assert [r.endswith("| FAIL |") for r in table.rows] == [True, False] * 2


def test_unknown_section_and_cpu_without_dry_are_refused():
  with pytest.raises(SystemExit, match="needs a GPU"):
    device_check.main([])
  with pytest.raises(SystemExit, match="'nope' is not one of"):
    device_check.main(["--dry", "--sections=nope"])


def test_fla_says_why_it_is_skipped_here():
  assert "not importable" in fla_reference.unavailable_reason()
  table = device_check.Table(budget_s=10.0)
  device_check.fla_timings(table, TINY, dry=True)
  assert len(table.rows) == 1 and "skipped: torch is not importable" in table.rows[0]
