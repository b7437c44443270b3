"""Continue text prompts on a checkpoint (`launch/generate.py`): the run's tokenizer
(data/tokenization/text_codec.py) and cached decoding (model/decode.py), timed.

Prompts are tokenised as training saw documents (the byte tokenizer starts each with BOS), so a
prompt is the beginning of a document. The prompts of one call decode as one batch.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from hybrid_nope.run import checkpoints
from hybrid_nope.model import checkpointed
from hybrid_nope.run.reader import RunReader
from hybrid_nope.data.tokenization.text_codec import text_codec
from hybrid_nope.model import decode


def generate_text(run: RunReader, prompts: list[str], *, step: int | None = None,
                  max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
                  seed: int = 0, tokenizer_path: str | None = None,
                  eos_token: str | None = None) -> dict:
  """{"step", "samples": [per prompt: prompt, text (the continuation), new_tokens, ids],
  "seconds": {compile, prefill, decode}, "prompt_tokens", "new_tokens", "decode_tokens_per_second"}.
  Decode tokens/s counts the tokens the token loop made (every row, after the first new token,
  which comes from the prompt pass) over its time."""
  if not prompts:
    raise checkpoints.AnalysisError("give at least one --prompt")
  codec = text_codec(run.config, run.tokenizer_path(tokenizer_path), eos_token)
  step, model_def, params = checkpointed.restore_params(run, step)
  generator = decode.Generator(model_def.bind(params), max_new_tokens, temperature=temperature,
                               top_p=top_p, eos_id=codec.eos_id)
  tokens_BT, start_B = decode.left_pad([codec.encode(p) for p in prompts])
  compile_seconds = generator.compile(tokens_BT, start_B)

  begin = time.perf_counter()
  first_B, caches, key = jax.block_until_ready(
      generator.prefill(tokens_BT, start_B, jax.random.key(seed)))
  prefilled = time.perf_counter()
  out_BN, made = jax.block_until_ready(
      generator.decode(first_B, caches, start_B, key, tokens_BT.shape[1]))
  done = time.perf_counter()

  rows = generator.rows(out_BN)
  samples = [{"prompt": prompt, "text": codec.decode(row), "new_tokens": len(row),
              "ids": row.tolist()} for prompt, row in zip(prompts, rows)]
  loop_tokens = (int(made) - 1) * len(prompts)
  return {"step": step, "samples": samples,
          "prompt_tokens": int(np.sum(tokens_BT.shape[1] - start_B)),
          "new_tokens": sum(len(r) for r in rows),
          "seconds": {"compile": compile_seconds, "prefill": prefilled - begin,
                      "decode": done - prefilled},
          "decode_tokens_per_second": loop_tokens / (done - prefilled) if loop_tokens else None}


def summary(result: dict) -> str:
  """The continuations, then a line of token counts and times."""
  lines = []
  for sample in result["samples"]:
    lines += [f"--- prompt: {sample['prompt']!r} ({sample['new_tokens']} new tokens)",
              sample["prompt"] + sample["text"]]
  s = result["seconds"]
  rate = result["decode_tokens_per_second"]
  lines.append(f"--- step {result['step']}: {result['prompt_tokens']} prompt tokens, "
               f"{result['new_tokens']} new; compile {s['compile']:.1f} s, prompt "
               f"{s['prefill'] * 1e3:.0f} ms, token loop {s['decode']:.2f} s"
               + (f" ({rate:.0f} tokens/s)" if rate else ""))
  return "\n".join(lines)
