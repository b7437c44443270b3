"""dry_run: the state's bytes are exact, the activation estimate lands near XLA's own memory
analysis of the compiled step, the FLOPs are flops.py's, and launch/train.py's --dry_run,
--help_config and --print_config work on the paper config without training. The dry run says
where the estimate does not fit the device and which keys would make it fit (the paper config
on one CPU device), and fails in one line on data launch/check_data.py refuses (issue 50,
item 7: both said "config valid: ready to train")."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import swa256_350m
from hybrid_nope import errors
from hybrid_nope.data.pipeline import loader
from hybrid_nope.train import dry_run, memory_fit, sharding
from hybrid_nope.train.flops import flops_per_token
from hybrid_nope.train.optimizer import make_optimizer
from hybrid_nope.train.state import abstract_train_state, init_train_state
from hybrid_nope.train.step import train_step_for
from tests import text_sources
from tests.helpers import REPO, tiny_config, tiny_flags

ONE_DEVICE = {"data": 1, "fsdp": 1, "sequence": 1, "tensor": 1}


def config(**overrides):
  return tiny_config(**{"model__d_model": 64, "model__head_dim": 16, "model__mlp_dim": 192,
                        "data__seq_len": 256, "data__batch_size": 4, "metrics__far_lag": 64,
                        "model__vocab_size": 512, **overrides})


def compiled_step_bytes(c) -> tuple[int, int]:
  """(argument bytes less the batch's, temporary bytes) of XLA's memory analysis of the compiled train step."""
  mesh = sharding.make_mesh(c)
  tx = make_optimizer(c.train)
  with sharding.activation_rules(mesh):
    model_def, state, shardings = abstract_train_state(c.model, tx, c.train.seed, mesh)
    batch = {k: jax.ShapeDtypeStruct((c.data.batch_size, c.data.seq_len),
                                     loader.BATCH_DTYPES[k]) for k in loader.BATCH_KEYS}
    step = jax.jit(train_step_for(c, model_def, tx), donate_argnums=0)
    memory = step.lower(state, batch).compile().memory_analysis()
  batch_bytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in batch.values())
  return memory.argument_size_in_bytes - batch_bytes, memory.temp_size_in_bytes


def test_state_bytes_are_those_of_an_initialised_state():
  c = config(model__param_dtype="bfloat16", train__opt_state_dtype="bfloat16")
  r = dry_run.report(c)
  _, state = init_train_state(c.model, make_optimizer(c.train), 0)
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
  assert r["memory_bytes"]["params"] == nbytes(state.params)
  assert r["memory_bytes"]["opt_state"] == nbytes(state.opt_state)
  # Gradients are float32 whatever the parameters' dtype: twice the bfloat16 parameters.
  assert r["memory_bytes"]["grads"] == 2 * nbytes(state.params)
  assert r["flops_per_token"] == flops_per_token(c.model, c.data.seq_len)


@pytest.mark.parametrize("overrides", [
    {}, {"model__remat": True}, {"model__pattern": "LD", "train__grad_accum_steps": 2},
    {"model__loss_block": 32, "model__vocab_size": 4096}],
    ids=["SG", "SG_remat", "LD_accum2", "SG_loss_block"])
def test_the_activation_estimate_is_near_xlas_memory_analysis(overrides):
  c = config(**overrides)
  r = dry_run.report(c)
  args, temp = compiled_step_bytes(c)
  m = r["memory_bytes"]
  # XLA's arguments are the state (exact in the test above), less any parameter it prunes.
  np.testing.assert_allclose(args, m["params"] + m["opt_state"] + 4, rtol=0.01)
  # The estimate is a formula, not a schedule: within a factor 2 of XLA's peak temporaries
  # (gradients, activations and logits), where dropping a term or a factor of the token count
  # would leave it.
  estimate = m["grads"] + m["activations"] + m["logits"]
  assert 0.5 < estimate / temp < 2, (estimate, temp)


def test_activations_divide_over_the_batch_axes_and_shrink_with_remat():
  c = config(model__num_layers=8)
  one = dry_run.activation_bytes(c, ONE_DEVICE)
  four = dry_run.activation_bytes(c, {"data": 2, "fsdp": 2, "sequence": 1, "tensor": 1})
  np.testing.assert_allclose([four["layers"], four["logits"]],
                             [one["layers"] / 4, one["logits"] / 4])
  c.model.remat = True
  assert dry_run.activation_bytes(c, ONE_DEVICE)["layers"] < one["layers"] / 2


def test_a_split_sequence_divides_the_tokens_and_adds_the_gathered_keys_of_global_layers():
  for pattern, global_layers in (("SG", 4), ("S", 0)):
    c = config(model__num_layers=8, model__pattern=pattern)
    m = c.model
    one = dry_run.activation_bytes(c, ONE_DEVICE)
    split = dry_run.activation_bytes(c, {**ONE_DEVICE, "sequence": 4})
    assert split["tokens"] == one["tokens"] / 4
    assert split["logits"] == one["logits"] / 4
    # Each G layer keeps its rows' keys and values whole: 2 × kv heads × head_dim per token.
    itemsize = np.dtype(dry_run.compute_dtype(m.dtype)).itemsize
    gathered = global_layers * 2 * m.num_kv_heads * m.head_dim * one["tokens"] * itemsize
    np.testing.assert_allclose(split["layers"], one["layers"] / 4 + gathered)


def test_the_state_laid_out_on_more_fsdp_chips_divides_the_leaves_sharded_over_fsdp():
  c = config()
  _, state, _ = abstract_train_state(c.model, make_optimizer(c.train), 0, sharding.make_mesh(c))
  over_fsdp = lambda x: "fsdp" in jax.tree.leaves(tuple(x.sharding.spec))
  leaves = jax.tree.leaves(state)  # Adam's step count is not sharded.
  expected = sum(x.size * x.dtype.itemsize / (4 if over_fsdp(x) else 1) for x in leaves)
  assert any(over_fsdp(x) for x in leaves) and not all(over_fsdp(x) for x in leaves)
  assert dry_run.per_device_bytes(state, {**ONE_DEVICE, "fsdp": 4}) == expected
  assert dry_run.per_device_bytes(state, {**ONE_DEVICE, "fsdp": 4}, itemsize=2) == sum(
      x.size * 2 / (4 if over_fsdp(x) else 1) for x in leaves)
  assert dry_run.per_device_bytes(state) == sum(x.size * x.dtype.itemsize for x in leaves)


def test_the_paper_config_on_one_cpu_device_does_not_fit_and_names_the_keys_that_would(
    monkeypatch):
  monkeypatch.setattr(memory_fit, "_available_ram", lambda: (16 * memory_fit.GIB, "test"))
  c = swa256_350m.get_config()
  lines = dry_run.report_text(c).splitlines()
  fit = next(l for l in lines if l.startswith("does not fit: "))
  assert "GiB per device (estimate) against 16.00 GiB, the available RAM of this host" in fit
  for key in ("mesh.fsdp", "model.remat", "model.loss_block", "train.grad_accum_steps"):
    assert key in fit, fit
  assert "config valid" not in lines[-1] and "does not fit the device's memory" in lines[-1]
  # The flags it names make it fit.
  flags = fit.split("it fits with ")[1].split(" (")[0].split()
  assert flags and all(f.startswith("--config.") for f in flags)
  for flag in flags:
    key, value = flag[len("--config."):].split("=")
    section, name = key.split(".")
    c[section][name] = type(c[section][name])(eval(value))  # pylint: disable=eval-used
  fits = dry_run.report(c)
  assert fits["fits"] and fits["fit_line"].startswith("fits: ")


def write_text_data(tmp_path, problem):
  records = text_sources.documents()
  if problem == "missing text column":
    records = [{"body": r["text"]} for r in records]
  path = text_sources.write("jsonl", tmp_path / "data", records)
  overrides = dict(data__source="jsonl", data__path=path, data__cache_dir=str(tmp_path / "c"),
                   data__eval_fraction=0.2, metrics__probe_pool_rows=4)
  if problem == "tokenizer larger than the vocabulary":
    import tokenizers  # pylint: disable=g-import-not-at-top
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"t{i}": i for i in range(300)}, "t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()  # A token per word.
    tok.save(str(tmp_path / "t.json"))
    overrides["data__tokenizer"] = str(tmp_path / "t.json")
  return overrides


DATA_PROBLEMS = {
    "missing text column": "part-0.jsonl line 1: no field 'text' (its fields: ['body'])",
    "tokenizer larger than the vocabulary": "config.model.vocab_size=258 is smaller than "
                                            "{tmp}/t.json's 300 token ids"}


@pytest.mark.parametrize("problem", sorted(DATA_PROBLEMS))
def test_a_dry_run_on_data_check_data_refuses_fails_in_one_line(problem, tmp_path):
  c = tiny_config(**write_text_data(tmp_path, problem))
  with pytest.raises(errors.UserError) as e:
    dry_run.report_text(c)
  message = str(e.value)
  assert "\n" not in message and message.startswith("1 problem with the data of this config "
                                                    "(data.source=jsonl): "), message
  assert DATA_PROBLEMS[problem].format(tmp=tmp_path) in message, message
  assert "python launch/check_data.py lists them" in message


def test_a_dry_run_on_good_data_checks_it_and_is_ready(tmp_path, monkeypatch):
  monkeypatch.setattr(memory_fit, "_available_ram", lambda: (16 * memory_fit.GIB, "test"))
  c = tiny_config(**write_text_data(tmp_path, None))
  assert dry_run.report_text(c).splitlines()[-2:] == [
      dry_run.report(c)["fit_line"], "config valid: ready to train"]


@pytest.mark.integration
def test_the_dry_run_of_a_missing_text_column_exits_2_with_one_line(tmp_path):
  overrides = write_text_data(tmp_path, "missing text column")
  out = subprocess.run([sys.executable, "launch/train.py", "--config=configs/demo.py",
                        *tiny_flags(**overrides), "--dry_run"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
  lines = [l for l in out.stderr.splitlines() if l.startswith("train.py:")]
  assert out.returncode == errors.USAGE_EXIT_CODE and len(lines) == 1, out.stderr[-3000:]
  assert "no field 'text'" in lines[0] and "Traceback" not in out.stderr
  assert "config valid" not in out.stdout


def run_train(*args):
  return subprocess.run([sys.executable, "launch/train.py", "--config=configs/swa256_350m.py",
                         *args], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_the_paper_config_dry_runs_without_data_and_exits_0():
  out = run_train("--dry_run", "--config.model.window=128")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "parameters: 346.1M non-embedding" in out.stdout
  assert "FLOPs per token: 3.4" in out.stdout  # Window 128 attends fewer pairs than 256's 3.51.
  assert "mesh: {'data': 1, 'fsdp': 1, 'sequence': 1, 'tensor': 1}" in out.stdout
  assert "to train: config.data.path=''" in out.stdout


@pytest.mark.integration
def test_help_and_print_config_show_the_resolved_paper_config():
  out = run_train("--help_config", "--print_config", "--config.model.window=128")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "  model.window = 128\n      S layers attend" in out.stdout
  assert "\n  window: 128\n" in out.stdout  # --print_config's YAML.
  bad = run_train("--dry_run", "--config.model.num_kv_heads=5")
  assert bad.returncode == 2 and "model.num_kv_heads" in bad.stderr
  assert run_train().returncode == 2  # Training needs --workdir.
