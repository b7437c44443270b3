"""Text samples while training (levanter and nanoGPT print them): every eval.sample_every_steps
and at the last step, greedy continuations of eval.sample_prompts, up to
eval.sample_max_new_tokens each, go to metrics.jsonl (a record {"step", "samples": [{"prompt",
"text"}]}), TensorBoard text and W&B (MetricsWriter.write_samples).

The prompts are tokenised as the training data (data/tokenization/text_codec.py) and decoded with the cache
(model/decode.py), compiled once for the run. Sampling runs without the activation sharding
rules: a few prompts need not split over the mesh's batch axes.
"""
from __future__ import annotations

import flax.linen as nn

from hybrid_nope.data.tokenization.text_codec import TextCodecError, text_codec
from hybrid_nope.errors import UserError
from hybrid_nope.model import decode
from hybrid_nope.model.pattern import layer_kinds


class TrainingSamples:
  """`(step, params)` writes the samples; the loop's schedule runs it every `every` steps and at
  the last step (train/loop.py: _side_work)."""

  def __init__(self, config, model_def, writer):
    e = config.eval
    self.every, self.max_new_tokens = e.sample_every_steps, e.sample_max_new_tokens
    self.prompts = tuple(e.sample_prompts)
    self.model_def, self.writer = model_def, writer
    try:
      self.codec = text_codec(config)
    except TextCodecError as error:
      raise UserError(f"config.eval.sample_every_steps={self.every} needs the data's tokenizer "
                      f"to tokenise eval.sample_prompts: {error}") from None
    for kind in set(layer_kinds(config.model.pattern, config.model.num_layers)):
      decode.decoder_for(kind)  # A kind without a decoder fails now, not at the first sample.
    self.prompt_ids = [self.codec.encode(p) for p in self.prompts]

  def __call__(self, step: int, params) -> None:
    with nn.logical_axis_rules(()):
      rows = decode.generate(self.model_def.bind(params), self.prompt_ids, self.max_new_tokens,
                             eos_id=self.codec.eos_id)
    self.writer.write_samples(step, [{"prompt": p, "text": self.codec.decode(r)}
                                     for p, r in zip(self.prompts, rows)])


def for_run(config, model_def, writer) -> TrainingSamples | None:
  """The run's sampler, or None when eval.sample_every_steps is 0."""
  if not config.eval.sample_every_steps:
    return None
  return TrainingSamples(config, model_def, writer)
