"""Optional Weights & Biases logging beside metrics.jsonl and TensorBoard (`pip install .[wandb]`).

Off unless `config.logging.wandb_project` is set; then process 0 opens a W&B run whose id is
kept in DIR/wandb_run_id.txt, so rerunning the same command on the same workdir (a resume)
continues the same W&B run. wandb is imported only when a project is set. Offline use:
WANDB_MODE=offline, then `wandb sync` the run directory (WANDB_DIR, else the local workdir,
else a temporary directory for a URL workdir). Online use needs a login (`wandb login`, or
WANDB_API_KEY); without one the run fails at its start in one line saying so.

The files in DIR stay the record of a run; W&B gets a copy. A resume rewinds the files to the
restored step, but W&B cannot rewind a run: it drops, with a warning, rows logged at steps it has
already seen, so after a resume its rows of the replayed steps are those of the first attempt.
"""
from __future__ import annotations

import io
import os
import secrets
import string
import tempfile

import jax
import numpy as np

from hybrid_nope.run import storage
from hybrid_nope.errors import UserError
from hybrid_nope.run.run_dir import RunDir

LEADING_COLUMNS = ("step", "layer", "layer_type", "module")


class WandbSink:
  """`scalars`, `table`, `samples`, `images`, `finish`: no-ops when no project is set, or off
  process 0."""

  def __init__(self, config, workdir: str):
    self.run = None
    project, entity = config.logging.wandb_project, config.logging.wandb_entity
    if not project or jax.process_index() != 0:
      return
    import wandb  # Lazily: runs without a project never import it.
    self._wandb = wandb
    self.run_id = run_id(workdir)
    try:  # No login (UsageError), a bad key or no server (CommError): the user's to fix.
      self.run = wandb.init(project=project, entity=entity or None, config=config.to_dict(),
                            dir=_local_dir(workdir), id=self.run_id, resume="allow")
    except (wandb.errors.UsageError, wandb.errors.CommError) as e:
      raise UserError(
          f"config.logging.wandb_project={project!r}: W&B could not start a run "
          f"({' '.join(str(e).split())}): log in with `wandb login` (or set WANDB_API_KEY), "
          f"or log offline with WANDB_MODE=offline (then `wandb sync`), or set "
          f"--config.logging.wandb_project='' for no W&B") from None

  @property
  def active(self) -> bool:
    return self.run is not None

  def scalars(self, step: int, scalars: dict) -> None:
    # Several calls at one step (train metrics, progress, eval, hooks) merge into one W&B row.
    if self.active:
      self.run.log({k: float(v) for k, v in scalars.items()}, step=int(step))

  def table(self, name: str, step: int, records: list[dict]) -> None:
    """One measurement's records (e.g. the recency hook's) as a wandb.Table logged as `name`:
    a column per key, in first-seen order after LEADING_COLUMNS; lists (profiles, per-head
    values) as JSON strings; a key a record lacks is empty."""
    if not self.active or not records:
      return
    columns, data = table_rows(records)
    self.run.log({name: self._wandb.Table(columns=columns, data=data, allow_mixed_types=True)},
                 step=int(step))

  def samples(self, step: int, samples: list[dict]) -> None:
    """Generated text ({"prompt", "text"} each) as a table logged as "samples"."""
    if self.active and samples:
      self.run.log({"samples": self._wandb.Table(
          columns=["prompt", "text"], data=[[s["prompt"], s["text"]] for s in samples])},
                   step=int(step))

  def images(self, step: int, images: dict) -> None:
    """`images`: name -> PNG bytes or an HxWx3 uint8 array."""
    if self.active and images:
      self.run.log({name: self._wandb.Image(rgb_array(image)) for name, image in images.items()},
                   step=int(step))

  def finish(self) -> None:
    if self.active:
      self.run.finish()
      self.run = None


def rgb_array(image) -> np.ndarray:
  """An HxWx3 uint8 array of PNG bytes or of an array (as TensorBoard's add_image takes it)."""
  if isinstance(image, (bytes, bytearray)):
    from PIL import Image  # Pillow comes with matplotlib; imported only where images are.
    return np.asarray(Image.open(io.BytesIO(image)).convert("RGB"))
  return np.asarray(image, np.uint8)


def run_id(workdir: str) -> str:
  """The W&B run id kept in DIR/wandb_run_id.txt; a new one is written there first."""
  path = RunDir(workdir).wandb_id
  if storage.exists(path):
    kept = storage.read_text(path).strip()
    if kept:
      return kept
  # W&B's own form: 8 lowercase letters and digits.
  new = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
  storage.makedirs(workdir)
  storage.write_text(path, new + "\n")
  return new


def table_rows(records: list[dict]) -> tuple[list[str], list[list]]:
  """(columns, rows) of the records: scalars as they are, lists and dicts as JSON strings
  (`storage.to_json`: a non-finite number in them is null)."""
  columns = [c for c in LEADING_COLUMNS if any(c in r for r in records)]
  for r in records:
    columns += [k for k in r if k not in columns]

  def cell(value):
    if isinstance(value, (list, tuple, dict)):
      return storage.to_json(value)
    if isinstance(value, np.generic):
      return value.item()
    return value

  return columns, [[cell(r.get(c)) for c in columns] for r in records]


def _local_dir(workdir: str) -> str:
  """Where wandb keeps its run files: WANDB_DIR, else the local workdir, else a new temporary
  directory (a URL workdir; wandb writes local files only)."""
  local = os.environ.get("WANDB_DIR") or storage.local_path(workdir)
  if local is None:
    return tempfile.mkdtemp(prefix="hybrid_nope_wandb_")
  os.makedirs(local, exist_ok=True)
  return local
