"""What differs between the two jax versions the locks pin (requirements.lock: jax 0.10;
requirements-next.lock: jax 0.11), kept to one place."""


def lower_triton_without_gpu() -> None:
  """Lets a Pallas Triton kernel lower for cuda on a machine with no GPU (launch/lower.py, the
  lowering tests). jax 0.10 did so for compute capability 9.0 when it found no GPU; jax 0.11
  raises instead, unless an abstract GPU device is set. Setting one means a mesh context, which
  our own meshes (jax.set_mesh) replace, so the CPU host is registered as an H100 (9.0, as
  before); a real GPU or an abstract device set by the caller still decides."""
  try:
    from jax._src.pallas.triton import gpu_info
  except ImportError:  # jax 0.10: its own fallback.
    return
  if hasattr(gpu_info, "registry"):
    gpu_info.registry.setdefault(
        "cpu", lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H100))
