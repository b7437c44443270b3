# Tiers (pytest.ini): test_config_validates_and_size_matches_its_name builds every paper config's
# model shapes (paper-config shapes, one test per config), and
# test_cli_config_and_workdir_errors_are_one_line_with_exit_code_2 runs launch/train.py in a
# subprocess for each case, so both are integration, `make test-all` only.
# test-all only: every experiment config validates, its non-embedding parameter count is within
# 15% of its name, its pattern and positions are the ones its name says, and the recurrent
# hybrids train on the data of the SWA run of their size
# (test_config_validates_and_size_matches_its_name; `make test` checks the sweep is complete and
# the demo config); launch/train.py's bad values, unknown keys and unusable workdirs end the
# command in one line with exit code 2 and no traceback
# (test_cli_config_and_workdir_errors_are_one_line_with_exit_code_2; the messages themselves are
# checked in process here in `make test`).
"""Every experiment config loads, validates, and names its size correctly."""
import importlib
import os

import pytest
from flax import nnx

from configs import base, costs
from hybrid_nope.model import LanguageModel, parameter_counts
from hybrid_nope.export import tokenizer as export_tokenizer
from hybrid_nope.errors import ConfigError
from hybrid_nope.validate import validate
from tests.helpers import tiny_config

CONFIG_NAMES = sorted(os.path.basename(p)[:-3] for p in costs.config_files())


def load(name):
  return importlib.import_module(f"configs.{name}").get_config()


def with_data_paths(config, tmp_path):
  config.data.path = str(tmp_path)
  config.eval.path = str(tmp_path)
  if config.data.source == "documents":  # A prepared corpus, as `make prose` writes one.
    from hybrid_nope.data.sources import documents  # pylint: disable=g-import-not-at-top
    config.data.path = str(tmp_path / "documents")
    if not os.path.exists(config.data.path):
      docs = [(f"chapter {i}", b"In the beginning. " * (i + 1)) for i in range(40)]
      documents.write(config.data.path, docs, eval_fraction=0.3, corpus={
          "name": "fake", "title": "fake", "licence": "made here", "source": "here"},
          tokenizer=export_tokenizer.byte_level_tokenizer().to_str())
  return config


def test_the_sweep_is_complete():
  expected = {"demo", "small", "small_prose", "lag4096", "nope_120m", "nope_350m", "gla_120m",
              "gla_350m", "gdn_120m", "gdn_350m", "kda_120m"} | {
      f"{kind}{w}_{size}" for kind in ("swa", "nopeswa") for w in base.WINDOWS
      for size in ("120m", "350m")}
  assert set(CONFIG_NAMES) == expected


@pytest.mark.parametrize("name", CONFIG_NAMES)
@pytest.mark.integration
def test_config_validates_and_size_matches_its_name(name, tmp_path):
  config = with_data_paths(load(name), tmp_path)
  validate(config)
  model = nnx.eval_shape(lambda: LanguageModel(config.model, rngs=nnx.Rngs(0)))
  non_embedding = parameter_counts(model)["non_embedding"]
  size = name.rsplit("_", 1)[-1]
  if size in base.SIZES:
    named = int(size[:-1]) * 1e6
    assert abs(non_embedding - named) / named <= 0.15, (name, non_embedding)
  if name.startswith("swa"):
    assert config.model.pattern == "SG" and config.model.swa_pos == "rope"
    assert config.model.window == int(name[3:].split("_")[0])
  if name.startswith("nopeswa"):
    assert config.model.pattern == "SG" and config.model.swa_pos == "nope"
  if name.startswith("nope_"):
    assert config.model.pattern == "G"
  if name.startswith("gla_"):
    assert config.model.pattern == "LG"
  if name.startswith("gdn_"):
    assert (config.model.pattern, config.model.delta_gate) == ("DG", "head")
  if name.startswith("kda_"):
    assert (config.model.pattern, config.model.delta_gate) == ("DDDG", "channel")
  if name.startswith(("gla_", "gdn_", "kda_")):  # comparable with the SWA runs of its size
    swa = with_data_paths(load(f"swa256_{size}"), tmp_path)
    for section in ("train", "data"):
      assert config[section].to_dict() == swa[section].to_dict(), section
    same = ("num_layers", "d_model", "num_heads", "num_kv_heads", "head_dim", "mlp_dim")
    assert {k: config.model[k] for k in same} == {k: swa.model[k] for k in same}
  assert config.model.global_pos == "nope"


def test_demo_runs_on_embedded_data_without_paths():
  config = load("demo")
  validate(config)
  assert config.data.source == "stdlib"


@pytest.mark.parametrize("key, value, message", [
    ("model.window", 0, "model.window"),
    ("model.window", -5, "model.window"),
    ("metrics.far_lag", 64, "metrics.far_lag"),     # = seq_len
    ("metrics.far_lag", 1000, "metrics.far_lag"),   # > seq_len
    ("model.num_kv_heads", 3, "model.num_kv_heads"),
    ("model.pattern", "SGX", "model.pattern"),
    ("model.pattern", "", "model.pattern"),
    ("model.num_layers", 3, "model.num_layers"),
    ("model.swa_pos", "alibi", "model.swa_pos"),
    ("model.dtype", "float16", "model.dtype"),
    ("model.attention_impl", "flash", "model.attention_impl"),
    ("model.delta_impl", "triton", "model.delta_impl"),
    ("model.delta_gate", "scalar", "model.delta_gate"),
    ("data.source", "web", "data.source"),
    ("train.warmup_steps", 8, "train.warmup_steps"),
    ("metrics.every_steps", 0, "metrics.every_steps"),
    ("train.learning_rate", float("inf"), "train.learning_rate"),
    ("train.b1", 1.5, "train.b1"),
    ("train.b2", float("nan"), "train.b2"),
    ("train.b2", 1.0, "train.b2"),
    ("train.weight_decay", float("nan"), "train.weight_decay"),
    ("train.weight_decay", -0.1, "train.weight_decay"),
    ("train.eps", 0.0, "train.eps"),
    ("train.grad_clip", float("inf"), "train.grad_clip"),
    ("model.norm_eps", -1.0, "model.norm_eps"),
    ("model.rope_theta", 0.0, "model.rope_theta"),
    ("metrics.probe_batch_size", 2000, "metrics.probe_pool_rows = 1024"),  # demo pool
    ("metrics.probe_pool_rows", 0, "metrics.probe_pool_rows"),
    ("eval.sample_every_steps", -1, "eval.sample_every_steps"),
    ("eval.sample_every_steps", 5, "eval.sample_prompts"),  # Samples, but no prompt.
    ("eval.sample_prompts", ("def ", ""), "eval.sample_prompts"),
    ("eval.sample_max_new_tokens", 0, "eval.sample_max_new_tokens"),
    ("train.schedule", "step", "train.schedule"),
    ("train.schedule_offset", 2, "train.schedule_offset"),
    ("train.decay_fraction", 0.0, "train.decay_fraction"),
    ("train.z_loss", -1e-4, "train.z_loss"),
    ("train.opt_state_dtype", "float16", "train.opt_state_dtype"),
    ("model.param_dtype", "float16", "model.param_dtype"),
    ("model.logits_dtype", "bfloat16", "model.logits_dtype"),
])
def test_bad_values_fail_naming_the_key(key, value, message):
  config = tiny_config(**{key.replace(".", "__"): value})
  with pytest.raises(ConfigError, match=message) as e:
    validate(config)
  assert "expected" in str(e.value)


def test_a_wsd_decay_longer_than_the_steps_after_warmup_fails_naming_the_key():
  # tiny: 8 steps, 2 of warmup; 0.9 x 8 rounds to 7 decay steps, more than the 6 left.
  with pytest.raises(ConfigError, match=r"train.decay_fraction=0.9 .* \(it gives 7\)"):
    validate(tiny_config(train__schedule="wsd", train__decay_fraction=0.9))
  validate(tiny_config(train__schedule="wsd", train__decay_fraction=0.75))


def test_missing_data_path_fails_naming_the_key(tmp_path):
  config = load("swa256_350m")
  with pytest.raises(ConfigError, match="data.path"):
    validate(config)
  config.data.path = str(tmp_path / "does_not_exist")
  with pytest.raises(ConfigError, match="data.path"):
    validate(config)
  config.data.path = str(tmp_path)
  with pytest.raises(ConfigError, match="eval.path"):
    validate(config)


def test_small_sweep_experiments():
  small = importlib.import_module("configs.small")
  for name, pattern, window, swa_pos in [("swa16", "SG", 16, "rope"), ("nopeswa256", "SG", 256, "nope"),
                                         ("nope", "G", None, None), ("gla", "LG", None, None),
                                         ("gdn", "DG", None, None), ("gdn3", "DDDG", None, None)]:
    config = small.get_config(name)
    validate(config)
    assert config.model.pattern == pattern
    if window:
      assert (config.model.window, config.model.swa_pos) == (window, swa_pos)
  with pytest.raises(ValueError, match="experiment='swa'"):
    small.get_config("swa")
  for name, pattern in [("swa64_deep", "SG"), ("nope_deep", "G")]:
    config = small.get_config(name)
    validate(config)
    assert (config.model.num_layers, config.model.pattern) == (8, pattern)
    shallow = small.get_config(name.removesuffix("_deep"))
    assert config.train.to_dict() == shallow.train.to_dict()
  with pytest.raises(ValueError, match="experiment='swa_deep'"):
    small.get_config("swa_deep")


def test_small_prose_is_small_on_the_prepared_prose_corpus(tmp_path, monkeypatch):
  from hybrid_nope.data.sources import documents, prose
  small, small_prose = (importlib.import_module(f"configs.{n}") for n in ("small", "small_prose"))
  monkeypatch.setenv(prose.DIR_ENV, str(tmp_path / "missing"))
  for name in ("swa64", "nopeswa256", "nope", "gla", "swa64_deep", "nope_deep"):
    config, stdlib = small_prose.get_config(name), small.get_config(name)
    assert (config.data.source, config.data.path) == ("documents", str(tmp_path / "missing"))
    assert config.model.vocab_size == prose.VOCAB_SIZE  # The corpus's BPE, not bytes.
    stdlib.model.vocab_size = prose.VOCAB_SIZE
    for section in ("model", "train"):
      assert config[section].to_dict() == stdlib[section].to_dict(), section
  with pytest.raises(ConfigError, match="config.data.path=.*missing.* is invalid.*make prose"):
    validate(small_prose.get_config("swa64"))
  docs = [(f"chapter {i}", b"In the beginning. " * (i + 1)) for i in range(400)]
  documents.write(str(tmp_path / "prose"), docs, eval_fraction=0.3, corpus={
      "name": "fake", "title": "fake", "licence": "made here", "source": "here"},
      tokenizer=export_tokenizer.byte_level_tokenizer().to_str())
  monkeypatch.setenv(prose.DIR_ENV, str(tmp_path / "prose"))
  validate(small_prose.get_config("nope_deep"))


def test_experiment_builds_each_local_mixer_and_ratio():
  assert base.experiment("120m", None, local="D").model.pattern == "DG"
  assert base.experiment("120m", None, local="D", locals_per_global=3).model.pattern == "DDDG"
  assert base.experiment("120m", 64, locals_per_global=3).model.pattern == "SSSG"
  with pytest.raises(ValueError, match="local='D', window=64"):
    base.experiment("120m", 64, local="D")
  with pytest.raises(ValueError, match="locals_per_global=0"):
    base.experiment("120m", None, local="D", locals_per_global=0)


@pytest.mark.parametrize("flag, workdir_kind, message", [
    ("--config.train.learning_rate=inf", "new",
     "train.py: config.train.learning_rate=inf is invalid: expected a finite float > 0"),
    ("--config.train.b1=1.5", "new", "train.py: config.train.b1=1.5 is invalid: expected a float"),
    ("--config.model.nonexistent=1", "new",
     "train.py: --config.model.nonexistent: config.model has no key 'nonexistent'"),
    ("--config.model.window.x=1", "new", "config.model.window is a value, not a section"),
    ("--config.train.b2=abc", "new", "--config.train.b2=abc: could not convert string to float"),
    ("", "file", "is a file: expected a directory"),
    ("", "under_a_file", "cannot be created"),
])
@pytest.mark.integration
def test_cli_config_and_workdir_errors_are_one_line_with_exit_code_2(tmp_path, flag,
                                                                    workdir_kind, message):
  import subprocess
  import sys
  from tests.helpers import REPO, tiny_flags
  workdir = tmp_path / "run"
  if workdir_kind == "file":
    workdir.write_text("not a directory")
  if workdir_kind == "under_a_file":
    (tmp_path / "file").write_text("not a directory")
    workdir = tmp_path / "file" / "run"
  proc = subprocess.run([sys.executable, "launch/train.py", "--config=configs/demo.py",
                         f"--workdir={workdir}", *tiny_flags(), *([flag] if flag else [])],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith("train.py: ")
  assert message in proc.stderr.strip().splitlines()[-1]
  assert "Traceback" not in proc.stderr


def test_a_workdir_the_system_refuses_to_write_fails_before_set_up(tmp_path, monkeypatch):
  import errno
  import tempfile
  from hybrid_nope.run.workdir_check import check_workdir

  def read_only_filesystem(*args, **kwargs):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))
  monkeypatch.setattr(tempfile, "mkstemp", read_only_filesystem)
  with pytest.raises(ConfigError, match="not writable by this process: Read-only file system"):
    check_workdir(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_a_read_only_workdir_fails_before_set_up(tmp_path):
  from hybrid_nope.run.workdir_check import check_workdir
  tmp_path.chmod(0o500)
  try:
    with pytest.raises(ConfigError, match="not writable"):
      check_workdir(str(tmp_path))
  finally:
    tmp_path.chmod(0o700)


def test_a_workdir_on_a_full_disk_is_refused_before_anything_is_written(tmp_path, monkeypatch):
  # Issue 38 case 5 (records): a full disk under the records surfaced as an OSError traceback
  # from the recency hook after step 0; now the start refuses in one line.
  import collections
  import shutil
  from hybrid_nope.run import workdir_check
  from hybrid_nope.train import loop
  full, roomy = tmp_path / "full", tmp_path / "roomy"
  real = shutil.disk_usage
  usage = collections.namedtuple("usage", "total used free")
  monkeypatch.setattr(workdir_check.shutil, "disk_usage", lambda p: usage(
      2**30, 2**30 - 2**20, 2**20) if str(p).startswith(str(full)) else real(p))
  with pytest.raises(ConfigError, match=rf"--workdir={full} has 1.0 MiB free: a run's records "
                     r".* need at least 64 MiB there; free space on that disk or use another "
                     r"--workdir"):
    loop.train(tiny_config(), str(full))
  assert os.listdir(full) == []
  workdir_check.check_workdir(str(roomy))  # The advice: another --workdir with room.


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_docstring_states_the_generated_command_and_cost(name):
  import difflib
  path = f"configs/{name}.py"
  with open(path, encoding="utf-8") as f:
    source = f.read()
  module = importlib.import_module(f"configs.{name}")
  expected = costs.rewritten(source, module, name)
  diff = "".join(difflib.unified_diff(source.splitlines(True), expected.splitlines(True),
                                      path, "generated"))
  assert source == expected, (f"{path}: the docstring's command or cost no longer matches the "
                              "code; regenerate with `python -m configs.costs --write`"
                              f"\n{diff}")
  for paragraph in costs.generated(module, name):
    assert paragraph in source
  if costs.PAPER_NAME.fullmatch(name):
    assert f"--config=configs/{name}.py" in source and "at an assumed" in source


def test_train_seed_drives_the_data_order_and_data_seed_can_be_set_alone():
  c = base.get_config()
  c.train.seed = 3
  assert c.data.seed == 3
  c.data.seed = 7  # A plain FieldReference would set train.seed to 7 as well.
  assert (c.train.seed, c.data.seed) == (3, 7)


def test_verify_hashes_takes_always_beside_the_booleans():
  # A bool default would refuse "always" (ml_collections keeps a field's type): the field is
  # typed object, and validate reads it through config_values.verify_hashes.
  for value in (True, False, "always"):
    config = tiny_config()
    config.data.verify_hashes = value
    validate(config)
  config.data.verify_hashes = "yes"
  with pytest.raises(ConfigError, match="config.data.verify_hashes='yes' is invalid"):
    validate(config)
