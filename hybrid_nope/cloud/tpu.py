"""The gcloud commands that create a Cloud TPU, install this repo on every worker, start
training on every worker, and inspect or delete it. Pure functions returning argv lists, so
`launch/tpu.py --dry-run` prints exactly what would run."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from hybrid_nope.errors import UserError

TPU_TYPE = re.compile(r"^v(\d+)([a-z]*)-(\d+)$")  # v4-32, v5p-64, v5litepod-16, v6e-8
# Runtime images by generation (cloud.google.com/tpu/docs/runtimes); --runtime-version overrides.
RUNTIMES = {"v4": "tpu-ubuntu2204-base", "v5p": "v2-alpha-tpuv5", "v5litepod": "v2-alpha-tpuv5-lite",
            "v5e": "v2-alpha-tpuv5-lite", "v6e": "v2-alpha-tpuv6e"}
REMOTE_DIR = "~/hybrid_nope"
LOG = "~/hybrid_nope_train.log"


class TpuArgError(UserError):
  pass


@dataclass(frozen=True)
class Tpu:
  name: str
  zone: str
  tpu_type: str = ""
  runtime_version: str = ""
  spot: bool = False
  queued: bool = False

  def __post_init__(self):
    if not self.zone:
      raise TpuArgError("--zone is required (e.g. --zone=us-east5-a)")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", self.name or ""):
      raise TpuArgError(f"--name={self.name!r}: expected lowercase letters, digits and dashes")
    if self.tpu_type and not TPU_TYPE.match(self.tpu_type):
      raise TpuArgError(f"--tpu-type={self.tpu_type!r}: expected <generation>-<cores>, such as "
                        "v4-32, v5p-64, v5litepod-16 or v6e-8")

  @property
  def runtime(self) -> str:
    if self.runtime_version:
      return self.runtime_version
    generation = self.tpu_type.rsplit("-", 1)[0]
    if generation not in RUNTIMES:
      raise TpuArgError(f"no default runtime for {self.tpu_type!r}; pass --runtime-version "
                        f"(known generations: {sorted(RUNTIMES)})")
    return RUNTIMES[generation]

  def _vm(self, verb: str, *extra: str) -> list[str]:
    return ["gcloud", "compute", "tpus", "tpu-vm", verb, self.name, f"--zone={self.zone}", *extra]

  def _ssh(self, command: str, worker: str = "all") -> list[str]:
    return self._vm("ssh", f"--worker={worker}", f"--command={command}")

  def create(self) -> list[str]:
    if not self.tpu_type:
      raise TpuArgError("--tpu-type is required to create a TPU (e.g. --tpu-type=v5p-64)")
    spot = ["--spot"] if self.spot else []
    if self.queued:
      return ["gcloud", "compute", "tpus", "queued-resources", "create", self.name,
              f"--node-id={self.name}", f"--zone={self.zone}",
              f"--accelerator-type={self.tpu_type}", f"--runtime-version={self.runtime}", *spot]
    return self._vm("create", f"--accelerator-type={self.tpu_type}", f"--version={self.runtime}",
                    *spot)

  def copy(self, tarball: str) -> list[list[str]]:
    """Ship a `git archive` of the repo to every worker and unpack it."""
    return [
        ["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball, f"{self.name}:~/",
         f"--zone={self.zone}", "--worker=all"],
        self._ssh(f"rm -rf {REMOTE_DIR} && mkdir -p {REMOTE_DIR} && "
                  f"tar -xzf ~/{tarball.rsplit('/', 1)[-1]} -C {REMOTE_DIR}"),
    ]

  def install(self) -> list[str]:
    """What `make install-tpu` runs: the pinned lock with the TPU build of the locked jax
    version (and gcsfs for gs:// checkpoints), from launch/install.sh."""
    return self._ssh(f"cd {REMOTE_DIR} && bash launch/install.sh tpu")

  def run(self, config: str, workdir: str, overrides: tuple[str, ...] = ()) -> list[str]:
    args = " ".join(shlex.quote(a) for a in (f"--config={config}", f"--workdir={workdir}",
                                             *overrides))
    # Every worker runs the same command; jax.distributed finds the slice's other workers.
    return self._ssh(f"cd {REMOTE_DIR} && nohup .venv/bin/python launch/train.py {args} "
                     f"> {LOG} 2>&1 &")

  def status(self) -> list[str]:
    if self.queued:
      return ["gcloud", "compute", "tpus", "queued-resources", "describe", self.name,
              f"--zone={self.zone}"]
    return self._vm("describe")

  def logs(self, lines: int = 200) -> list[str]:
    return self._ssh(f"tail -n {lines} {LOG}", worker="0")

  def delete(self) -> list[str]:
    if self.queued:
      return ["gcloud", "compute", "tpus", "queued-resources", "delete", self.name,
              f"--zone={self.zone}", "--force", "--quiet"]
    return self._vm("delete", "--quiet")
