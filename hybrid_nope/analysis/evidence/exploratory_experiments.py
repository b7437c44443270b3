"""Which experiment plays which part in docs/results.md's exploratory rows: the global-only
baseline, the local configs, the mixer pairs, the windows compared, the RoPE-global controls.
Declared in a committed file (docs/results/exploratory.toml) beside the sweeps' configs, so the
evidence code names no experiment; `load` reads and checks it (a bad entry fails naming the
key)."""
from __future__ import annotations

import dataclasses
import tomllib

DEFAULT_PATH = "docs/results/exploratory.toml"
KEYS = ("baseline", "local", "mixer_pairs", "norm_series", "rope_global_controls", "windows")
WINDOW_KEYS = ("small", "large", "small_at_large_flops", "nope_in_swa_large")


class ExperimentsError(ValueError):
  pass


@dataclasses.dataclass(frozen=True)
class Windows:
  small: str
  large: str
  small_at_large_flops: str  # the small window trained for the large one's FLOPs
  nope_in_swa_large: str     # NoPE inside the large window's SWA layers


@dataclasses.dataclass(frozen=True)
class Experiments:
  baseline: str                         # global layers only
  local: tuple[str, ...]                # configs with a local mixer, in the page's order
  mixer_pairs: tuple[tuple[str, str], ...]  # (config, the one it is compared with)
  norm_series: tuple[str, ...]          # configs whose norm effect is traced over training
  rope_global_controls: tuple[str, ...]  # configs built to fail to extrapolate
  windows: Windows


def _check_keys(table: dict, keys: tuple[str, ...], where: str) -> None:
  missing, unknown = [k for k in keys if k not in table], sorted(set(table) - set(keys))
  if missing or unknown:
    raise ExperimentsError(f"{where}: missing key(s) {missing}, unknown key(s) {unknown}; "
                           f"expected {', '.join(keys)}")


def _names(value, where: str) -> tuple[str, ...]:
  if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
    raise ExperimentsError(f"{where}: expected a list of experiment names, got {value!r}")
  return tuple(value)


def load(path: str = DEFAULT_PATH) -> Experiments:
  try:
    with open(path, "rb") as f:
      raw = tomllib.load(f)
  except (OSError, tomllib.TOMLDecodeError) as e:
    raise ExperimentsError(f"{path}: cannot read the exploratory experiments: {e}") from e
  _check_keys(raw, KEYS, path)
  if not isinstance(raw["windows"], dict):
    raise ExperimentsError(f"{path}: windows: expected a table of {', '.join(WINDOW_KEYS)}")
  _check_keys(raw["windows"], WINDOW_KEYS, f"{path}: windows")
  if not isinstance(raw["baseline"], str) or not raw["baseline"]:
    raise ExperimentsError(f"{path}: baseline: expected an experiment name")
  pairs = tuple(_names(p, f"{path}: mixer_pairs") for p in raw["mixer_pairs"])
  if any(len(p) != 2 for p in pairs):
    raise ExperimentsError(f"{path}: mixer_pairs: each entry is [config, compared with]")
  windows = {k: _names([raw["windows"][k]], f"{path}: windows.{k}")[0] for k in WINDOW_KEYS}
  return Experiments(baseline=raw["baseline"], local=_names(raw["local"], f"{path}: local"),
                     mixer_pairs=pairs,
                     norm_series=_names(raw["norm_series"], f"{path}: norm_series"),
                     rope_global_controls=_names(raw["rope_global_controls"],
                                                 f"{path}: rope_global_controls"),
                     windows=Windows(**windows))
