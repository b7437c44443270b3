import importlib.util
import os

from setuptools import find_packages, setup


def _commands():
  """hybrid_nope/commands.py, read by path (the package's dependencies are not installed yet):
  it names the console commands, hybrid-nope-train and one per launch/*.py."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hybrid_nope", "commands.py")
  spec = importlib.util.spec_from_file_location("hybrid_nope_commands", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


setup(
    name="hybrid_nope",
    version="0.1.0",
    description="Pretraining hybrid sliding-window / global-NoPE language models and measuring "
                "how local layers plant relative position into global NoPE layers.",
    python_requires=">=3.11",
    packages=find_packages(include=["hybrid_nope", "hybrid_nope.*"]),
    # Ranges here; the exact versions CI and `make` install are pinned in requirements.lock.
    install_requires=[
        "jax>=0.6", "flax>=0.12", "optax", "orbax-checkpoint", "grain", "ml-collections",
        "tensorflow-datasets", "tensorboardX", "numpy", "zstandard", "tokenizers", "pyarrow",
        "matplotlib", "safetensors",
    ],
    entry_points={"console_scripts": _commands().console_scripts()},
    # The accelerator builds of jax (make install-gpu / install-tpu pin them to the lock's jax).
    extras_require={"test": ["pytest", "pytest-xdist"], "cuda": ["jax[cuda13]"],
                    "cuda12": ["jax[cuda12]"], "tpu": ["jax[tpu]"], "wandb": ["wandb"]},
)
