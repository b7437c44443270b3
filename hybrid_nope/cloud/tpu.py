"""The gcloud commands that create a Cloud TPU, install this repo on every worker, start
training on every worker, and inspect or delete it. Pure functions returning argv lists, so
`launch/tpu.py --dry-run` prints exactly what would run."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from hybrid_nope.errors import UserError
from hybrid_nope.run.run_dir import CHECKPOINTS

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

  @property
  def workers(self) -> int | None:
    """Hosts in the slice (8 TensorCores on v4/v5p, 8 chips on v5e/v6e per host at most);
    None when --tpu-type is not given."""
    if not self.tpu_type:
      return None
    return max(1, int(self.tpu_type.rsplit("-", 1)[1]) // 8)

  def check_workdir(self, workdir: str) -> None:
    """On several workers the run's records must outlive worker 0's disk (spot preemption,
    `delete`): only shared storage will do."""
    if (self.workers or 1) > 1 and not workdir.startswith("gs://"):
      raise TpuArgError(
          f"--workdir={workdir}: a {self.tpu_type} slice has {self.workers} workers, and a local "
          f"workdir would live on worker 0's disk and die with the VM; pass "
          f"--workdir=gs://BUCKET/RUN (records, TensorBoard and checkpoints all go there)")

  def fetch(self, workdir: str, dest: str) -> list[list[str]]:
    """Copies a run's records and figures (not its checkpoints) to `dest` on this machine."""
    if workdir.startswith("gs://"):
      return [["gcloud", "storage", "rsync", "--recursive", f"--exclude=^{CHECKPOINTS}/",
               workdir, dest]]
    archive = "~/hybrid_nope_records.tar.gz"
    return [self._ssh(f"tar -czf {archive} --exclude=./{CHECKPOINTS} -C {REMOTE_DIR}/{workdir} .",
                      worker="0"),
            ["gcloud", "compute", "tpus", "tpu-vm", "scp", f"{self.name}:{archive}",
             f"{dest}.tar.gz", f"--zone={self.zone}", "--worker=0"],
            ["bash", "-c", f"mkdir -p {shlex.quote(dest)} && tar -xzf {shlex.quote(dest)}.tar.gz "
                           f"-C {shlex.quote(dest)}"]]

  def state(self) -> list[str]:
    """Prints the node's state (READY, PREEMPTED, ...); fails if it does not exist."""
    return self._vm("describe", "--format=value(state)")

  def finished(self) -> list[str]:
    """Prints how many times the training log says the run finished (not preempted)."""
    return self._ssh(f"grep -c \"done: .*'preempted': False\" {LOG} || true", worker="0")

  # "[l]aunch": the pattern does not match the shell that runs it.
  TRAINER = "'[l]aunch/train.py'"

  def trainer_exited(self) -> list[str]:
    """Prints "exited" for each worker on which no trainer process runs."""
    return self._ssh(f"pgrep -f {self.TRAINER} > /dev/null || echo exited")

  def stop_trainers(self) -> list[str]:
    """Stops the trainers still running (the others of a slice wait on one that exited)."""
    return self._ssh(f"pkill -f {self.TRAINER} || true")

  def delete(self) -> list[str]:
    if self.queued:
      return ["gcloud", "compute", "tpus", "queued-resources", "delete", self.name,
              f"--zone={self.zone}", "--force", "--quiet"]
    return self._vm("delete", "--quiet")


def relaunch(tpu: Tpu, start: list[list[str]], runner, *, sleep, poll_seconds: float,
             max_relaunches: int) -> int:
  """Keeps a spot or queued TPU training until the run finishes: while the node is READY and
  its trainers run it waits; when it is gone or PREEMPTED it deletes what is left, re-creates
  it and runs `start` (copy, install, train), and the run resumes from its gs:// checkpoints.
  On a READY node whose trainer exited short of the end (kill -9, an OOM, an error) it stops
  the other workers' trainers and runs the train command (`start[-1]`) again: it resumes, or,
  killed before its first save, starts afresh (run/resume.py). Each counts as a relaunch.
  `runner(cmd)` runs a command and returns (exit code, stdout). Returns the relaunches."""
  relaunches = 0
  while True:
    code, out = runner(tpu.state())
    if code == 0 and out.strip() == "READY":
      code, out = runner(tpu.trainer_exited())  # Before `finished`: a trainer may end between.
      exited = code == 0 and "exited" in out
      code, out = runner(tpu.finished())
      if code == 0 and out.strip().splitlines() and int(out.strip().splitlines()[-1]) > 0:
        return relaunches
      if not exited:
        sleep(poll_seconds)
        continue
      if relaunches >= max_relaunches:
        raise TpuArgError(f"{tpu.name} is READY but its trainer exited before the run finished, "
                          f"after {relaunches} relaunches (--max-relaunches): see "
                          "`launch/tpu.py logs`")
      for command in (tpu.stop_trainers(), start[-1]):
        code, out = runner(command)
        if code != 0:
          raise TpuArgError(f"relaunch failed at: {shlex.join(command)}")
      relaunches += 1
      continue
    if relaunches >= max_relaunches:
      raise TpuArgError(f"{tpu.name} is {out.strip() or 'gone'} and was relaunched "
                        f"{relaunches} times already (--max-relaunches)")
    if code == 0:  # It exists but is not READY (PREEMPTED, TERMINATED, ...): remove it first.
      runner(tpu.delete())
    for command in (tpu.create(), *start):
      code, out = runner(command)
      if code != 0:
        raise TpuArgError(f"relaunch failed at: {shlex.join(command)}")
    relaunches += 1
