"""Joins JAX's multi-process runtime when this process is one of several."""
from __future__ import annotations

import os

import jax
from absl import logging


def _cluster_detected() -> bool:
  env = os.environ
  if int(env.get("SLURM_NTASKS", "1")) > 1:
    return True
  # Cloud TPU VMs list every worker of a multi-host slice here.
  return "," in env.get("TPU_WORKER_HOSTNAMES", "")


def initialize() -> None:
  """Explicit: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID (any cluster, or
  several processes on one machine). Otherwise SLURM and TPU pods are detected by JAX itself.
  A single process does nothing."""
  env = os.environ
  if "JAX_COORDINATOR_ADDRESS" in env:
    kwargs = dict(coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
                  num_processes=int(env["JAX_NUM_PROCESSES"]),
                  process_id=int(env["JAX_PROCESS_ID"]))
  elif _cluster_detected():
    kwargs = {}
  else:
    return
  if env.get("JAX_PLATFORMS", "") == "cpu":
    # CPU devices of several processes talk through gloo (tests, CPU clusters).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kwargs)
  logging.info("process %d of %d, %d local / %d global devices", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
