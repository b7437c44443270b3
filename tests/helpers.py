"""Small configs shared by tests."""
import ml_collections

from configs import demo


def tiny_config(**model_overrides) -> ml_collections.ConfigDict:
  """The demo config shrunk to something that compiles and steps in well under a second."""
  c = demo.get_config()
  c.model.update(dict(num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8,
                      mlp_dim=64, window=4))
  c.model.update(model_overrides)
  c.data.update(dict(seq_len=64, batch_size=2))
  c.eval.update(dict(batch_size=2, num_batches=2, every_steps=4))
  c.train.update(dict(steps=8, warmup_steps=2, log_every_steps=1))
  c.checkpoint.update(dict(every_steps=4, keep=10))
  c.metrics.far_lag = 32
  return c
