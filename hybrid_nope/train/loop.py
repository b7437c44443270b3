"""The training loop: init or resume, train, evaluate, log, run the hooks it is handed, checkpoint."""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import numpy as np
from absl import logging

from hybrid_nope.data.pipeline import loader
from hybrid_nope.data.fingerprint import data_fingerprint
from hybrid_nope.logs import quiet_library_logs
from hybrid_nope.errors import RunStopped
from hybrid_nope.model import parameter_counts
from hybrid_nope.model.loss import UNIGRAM_ENTROPY_KEY
from hybrid_nope import run as run_lib
from hybrid_nope.run import resume, run_identity
from hybrid_nope.run.checkpoint import Checkpointer
from hybrid_nope.run.metrics_writer import MetricsWriter
from hybrid_nope.train import sharding
from hybrid_nope.train.hooks import HookFactory, RunContext
from hybrid_nope.train.optimizer import make_optimizer
from hybrid_nope.train import evaluation, samples, schedule
from hybrid_nope.train.preemption import Interrupted, PreemptionWatcher
from hybrid_nope.train.profiling import StepProfiler
from hybrid_nope.train.schedule import on_every_process
from hybrid_nope.train.progress import Progress
from hybrid_nope.train.state import sharded_train_state
from hybrid_nope.train.step import train_step_for
from hybrid_nope.validate import validate


_clock = time.monotonic  # For checkpoint.every_minutes; tests substitute a fake clock.


class NonFiniteLossError(RunStopped, FloatingPointError):
  pass


def _write_finite(writer, records: list[tuple[int, dict]], last_saved: int | None) -> None:
  """Writes records in order; stops at the first step whose loss or update is not finite, before
  anything is saved. The train step refused that update, so every checkpoint is finite."""
  for step, metrics in records:
    metrics = dict(metrics)
    update_finite = bool(metrics.pop("update_finite"))
    if not (np.isfinite(metrics["loss"]) and update_finite):
      what = (f"loss is {metrics['loss']}" if not np.isfinite(metrics["loss"]) else
              f"the update is not finite (loss {metrics['loss']:.4g}, gradient norm "
              f"{metrics['grad_norm']:.4g})")
      kept = ("no checkpoint was saved yet" if last_saved is None else
              f"the last checkpoint, step {last_saved}, has finite parameters and is kept")
      raise NonFiniteLossError(
          f"{what} at step {step}; the update was refused and the run stops without saving: "
          f"{kept}. Lower train.learning_rate or check the train.* config, then rerun to resume "
          "(a run-defining key needs --config.train.allow_changes=KEY, e.g. "
          "train.learning_rate; add --config.checkpoint.restore_step=N to resume from an "
          "older kept step N).")
    writer.write(step, metrics)


def _minutes_due(every_minutes: float, saved_at: float) -> bool:
  """Whether checkpoint.every_minutes (0 = off) have passed since the last save; process 0's
  clock decides for all, since processes that disagree on a save would deadlock in it."""
  if not every_minutes:
    return False
  return on_every_process([_clock() - saved_at >= 60 * every_minutes])[0]


@dataclasses.dataclass
class _Run:
  """What a run builds once: the mesh, the model, the data, the compiled steps, the stores."""
  config: object
  mesh: object
  model_def: object
  state_shardings: object
  data_iter: object
  eval_sets: list  # evaluation.EvalSet per eval.length_multiples entry, the training length first
  run_context: RunContext
  fingerprint: str
  ckpt: Checkpointer
  writer: MetricsWriter
  train_step: object
  start_row: int  # The data iterator's first row of the global stream.
  history: list   # The lineage's events (run_identity), saved in every checkpoint's meta.

  def meta(self) -> dict:
    """A checkpoint's meta, but the checksums Checkpointer.save adds."""
    batches = self.data_iter.get_state()["next_index"]
    return {"data": self.fingerprint, "config": run_identity.defining(self.config),
            "history": self.history,
            "data_position": {"rows": self.start_row + batches * self.config.data.batch_size}}


def _model_and_state(config, mesh):
  tx = make_optimizer(config.train)
  with sharding.activation_rules(mesh):
    model_def, state, state_shardings = sharded_train_state(config.model, tx, config.train.seed,
                                                            mesh)
  counts = parameter_counts(model_def.bind(state.params))
  logging.info("parameters: %.2fM non-embedding, %.2fM total", counts["non_embedding"] / 1e6,
               counts["total"] / 1e6)
  return tx, model_def, state, state_shardings


def _resume(config, plan: resume.ResumePlan, ckpt: Checkpointer, state, state_shardings,
            fingerprint) -> tuple[object, int]:
  """(state, training rows consumed): restored from the plan's checkpoint, if there is one."""
  if plan.step is None:
    return state, 0
  target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, state_shardings)
  state, rows = ckpt.restore(plan.step, target, plan.meta, data_fingerprint=fingerprint,
                             allow_changed_data=config.data.allow_changed_data,
                             batch_size=plan.batch_size_at_step)
  logging.info("resumed from %s at step %d (%d training rows read)", ckpt.directory, plan.step,
               rows)
  if plan.roll_back:  # Only after the restore held: those steps are trained again.
    moved, where = ckpt.roll_back_after(plan.step)
    if moved:
      logging.warning("checkpoint.restore_step=%d: moved the newer checkpoints %s to %s "
                      "(kept, not deleted)", plan.step, moved, where)
  if plan.skip_rows:
    logging.warning("data.skip_batches=%d: skipping rows %d to %d of the training stream",
                    config.data.skip_batches, rows, rows + plan.skip_rows - 1)
  return state, rows + plan.skip_rows


def _compile_train_step(config, mesh, model_def, tx, state_shardings):
  batch_shardings = {k: sharding.batch_sharding(mesh) for k in loader.BATCH_KEYS}
  return jax.jit(train_step_for(config, model_def, tx),
                 in_shardings=(state_shardings, batch_shardings),
                 out_shardings=(state_shardings, sharding.replicated(mesh)), donate_argnums=0)


def _replicator(mesh):
  replicated = sharding.replicated(mesh)
  return lambda tree: jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(replicated, np.asarray(x)), tree)


def _start(config, opened: run_lib.Run, mesh):
  """Builds the run and its state, resumed as `opened.plan` says."""
  ckpt, plan = opened.checkpointer, opened.plan
  logging.info("mesh %s over %d devices in %d processes", dict(mesh.shape), jax.device_count(),
               jax.process_count())
  tx, model_def, state, state_shardings = _model_and_state(config, mesh)
  space = ckpt.expected_size_warning(state)
  if space:
    logging.warning("%s", space)
  eval_rows, unigram = evaluation.eval_rows(config)
  fingerprint = data_fingerprint(config, eval_rows)
  state, start_row = _resume(config, plan, ckpt, state, state_shardings, fingerprint)
  data_iter = loader.train_iterator(config, process_index=jax.process_index(),
                                      process_count=jax.process_count(), start_row=start_row)
  start = int(state.step)
  if start >= config.train.steps:
    logging.warning("%s already holds a run trained to step %d (train.steps=%d): nothing to "
                    "train; its metrics are in %s. Use a new --workdir, or raise train.steps "
                    "(with --config.train.allow_changes=train.steps), to train more.",
                    opened.workdir, start, config.train.steps, opened.layout.metrics)
  writer = opened.open_writer(start)
  writer.write_config(start, config)  # TensorBoard: the config and hparams in force.
  if plan.step is None:
    writer.write(0, {UNIGRAM_ENTROPY_KEY: unigram})
  with sharding.activation_rules(mesh):
    train_step = _compile_train_step(config, mesh, model_def, tx, state_shardings)
    eval_sets = evaluation.eval_sets(config, mesh, model_def, state_shardings, eval_rows)
    ckpt.checksums(state)  # Compiles the checksums now, not inside the first save.
  run_context = RunContext(config=config, model_def=model_def, eval_batches=eval_rows,
                           probe_rows=loader.probe_pool(config), writer=writer,
                           replicate=_replicator(mesh))
  run = _Run(config=config, mesh=mesh, model_def=model_def, state_shardings=state_shardings,
             data_iter=data_iter, eval_sets=eval_sets, run_context=run_context,
             fingerprint=fingerprint, ckpt=ckpt, writer=writer, train_step=train_step,
             start_row=start_row, history=plan.history)
  return run, state


def _write_pending(run: _Run, pending: list, last_saved) -> tuple[int, dict]:
  """Fetches the pending steps' metrics and writes them in step order (stopping at a non-finite
  one); returns the last step's."""
  records = [(s, jax.device_get(m)) for s, m in pending]
  pending.clear()
  _write_finite(run.writer, records, last_saved)
  return records[-1]


def _log(run: _Run, progress: Progress, pending: list, last_saved) -> dict:
  """Writes the pending steps' metrics and the progress scalars; returns the summary fields."""
  step, metrics = _write_pending(run, pending, last_saved)
  loss = float(metrics["loss"])
  scalars = progress.report(step, loss, float(metrics["learning_rate"]))
  run.writer.write(step, scalars)
  run.writer.flush()
  return {"step": step, "loss": loss, "tokens_per_second": scalars["tokens_per_second"]}


def train(config, workdir: str, hooks: Sequence[HookFactory] = ()) -> dict:
  """Trains per `config`, resuming from the newest checkpoint in `workdir` if there is one.

  `hooks`: factories `RunContext -> hook(step, params)` (`train/hooks.py`), run at step 0 of a
  fresh run and every `metrics.every_steps` (or the hook's own `every_steps`) and at the last
  step, as entries of the one schedule of side work (`train/schedule.py`). A preempted step
  skips eval and hooks; the resumed run redoes what its first step owed and is not on record.
  Before anything is built, the workdir is locked to this trainer and the resume is planned
  (`run/resume.py`): a config that would make it another run, or a fresh start over another
  run's records, is refused.

  Returns a summary: final step, last train loss, last eval loss, tokens/s, wall time, and
  whether the run stopped early for preemption.
  """
  validate(config)
  loader.check_vocabulary(config)
  quiet_library_logs()
  watcher = PreemptionWatcher()  # From here a signal saves (or, before any state, just stops).
  try:
    with run_lib.open(workdir, config) as opened:  # Checked and locked before anything is built.
      mesh = sharding.make_mesh(config)
      plan = opened.plan_resume(sharding.replicated(mesh))
      try:
        run, state = _start(config, opened, mesh)
      except BaseException:
        opened.checkpointer.close()
        raise
      return _train(run, state, plan.step, hooks, watcher, opened.layout.profile)
  finally:
    watcher.close()


def _side_work(run: _Run, hooks, sampler, save, minutes_due, summary) -> list[schedule.Entry]:
  """The run's side work in the order it runs at a step: eval, samples, the save, the hooks."""
  c = run.config

  def evaluate(step, state):
    summary["eval_loss"] = evaluation.evaluate_and_log(run.eval_sets, state.params, run.writer,
                                                       step)

  entries = [schedule.Entry("eval", c.eval.every_steps, evaluate, done_key="eval_loss")]
  if sampler is not None:
    entries.append(schedule.Entry("samples", sampler.every,
                                  lambda step, state: sampler(step, state.params)))
  # A save runs whole, also on the preempted step (it is that step's whole point).
  entries.append(schedule.Entry("checkpoint", c.checkpoint.every_steps, save, at_preemption=True,
                                interruptible=False, also_due=minutes_due))
  return entries + [schedule.hook_entry(h, c.metrics.every_steps) for h in hooks]


def _train(run: _Run, state, last_saved, hooks, watcher: PreemptionWatcher, profile_dir: str):
  c = run.config
  start = int(state.step)
  t_start = time.perf_counter()
  # A run with nothing left to train reports what it ended with, from its records; a
  # throughput only once steps are timed (`_log`).
  summary = {"step": start, "loss": run.writer.latest("loss"),
             "eval_loss": run.writer.latest("eval_loss"), "preempted": False}
  profiler = StepProfiler(profile_dir, c.train.profile_start_step, c.train.profile_steps)
  run.writer.critical = watcher.deferred  # A signal in a hook never cuts a write in half.
  pending = []
  saved_at = _clock()

  def save(step, state):
    nonlocal last_saved, saved_at
    if pending:  # Every record up to a checkpoint is written first (and checked finite).
      summary.update(_log(run, progress, pending, last_saved))
    run.ckpt.save(step, state, run.meta())
    last_saved, saved_at = step, _clock()

  def stop_preempted(step, state):
    """A stop signal: save this step (unless saved) and stop; at a step boundary, or where it
    cut an eval or a hook short."""
    if last_saved != step:
      save(step, state)
    run.writer.flush()
    logging.warning("preempted: saved step %d; rerun the same command to resume", step)
    summary.update(step=step, preempted=True)

  try:
    with sharding.activation_rules(run.mesh):
      active_hooks = [make(run.run_context) for make in hooks]
      sampler = samples.for_run(c, run.model_def, run.writer)
      progress = Progress(c, start)
      summary["mfu_against"] = progress.peak_source
      entries = _side_work(run, active_hooks, sampler, save,
                           lambda: _minutes_due(c.checkpoint.every_minutes, saved_at), summary)
      side_work = schedule.Schedule(entries, run.writer, progress, watcher)
      try:
        side_work.run(side_work.owed_at_resume(start, final=start == c.train.steps), start,
                      state)
      except Interrupted:
        stop_preempted(start, state)
        return _finished(summary, t_start)
      saved_at = _clock()
      for step in range(start + 1, c.train.steps + 1):
        profiler.before(step)
        if step == start + 1:
          logging.info("compiling the train step...")
          compile_start = time.perf_counter()
        state, metrics = run.train_step(state, sharding.global_batch(next(run.data_iter),
                                                                     run.mesh))
        if step == start + 1:  # The first call returns once compiled and dispatched.
          compiled = time.perf_counter() - compile_start
          progress.note("compile", compiled)
          logging.info("train step compiled in %.1f s", compiled)
        run.ckpt.check_saved()
        profiler.after(step, metrics)
        pending.append((step, metrics))
        preempted = watcher.should_stop(step, run.ckpt.manager)
        due = side_work.due(step, final=step == c.train.steps, preempted=preempted)
        saving = any(e.name == "checkpoint" for e in due)
        # Losses are fetched only at log and save steps so the host runs ahead of the devices.
        if step % c.train.log_every_steps == 0 or saving:
          summary.update(_log(run, progress, pending, last_saved))
        elif due:  # Side work writes at this step: the steps before it go first, since W&B
          # drops a row logged below a step it has seen (and metrics.jsonl stays in order).
          step_done, metrics = _write_pending(run, pending, last_saved)
          summary.update(step=step_done, loss=float(metrics["loss"]))
        try:
          side_work.run(due, step, state)
        except Interrupted:
          stop_preempted(step, state)
          break
        if preempted:  # Saved above (a preempted step is the last); the records go out with it.
          stop_preempted(step, state)
          break
        if saving:
          run.writer.flush()  # On a URL workdir, every record up to the checkpoint is on storage.
    run.ckpt.wait()  # The last save's failure, too, is this run's, in one line.
  finally:
    # Also on errors: an async save already started is a good checkpoint; let it finish.
    profiler.close()
    run.ckpt.let_finish()
    run.ckpt.close()
    run.writer.close()
  return _finished(summary, t_start)


def _finished(summary: dict, t_start: float) -> dict:
  summary["wall_seconds"] = time.perf_counter() - t_start
  return summary
