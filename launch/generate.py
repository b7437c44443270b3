"""Continue prompts on a checkpoint: python launch/generate.py --workdir=DIR --prompt=TEXT
    [--prompt=TEXT ...] [--step=N] [--max_new_tokens=256] [--temperature=0] [--top_p=1]
    [--seed=0] [--tokenizer=tokenizer.json] [--eos_token=TOKEN] [--out=FILE.json]

Prints each prompt with its continuation, then the times and decode tokens/s
(hybrid_nope/analysis/checkpoint/generate.py; the cached decoding is hybrid_nope/model/decode.py).
Temperature 0 is greedy; several --prompt decode as one batch.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from hybrid_nope import cli  # noqa: E402
from hybrid_nope.run import storage
from hybrid_nope.analysis.checkpoint import generate  # noqa: E402
from hybrid_nope.run.reader import open_readonly  # noqa: E402

flags.DEFINE_string("workdir", None, "Run directory written by launch/train.py.")
flags.DEFINE_multi_string("prompt", None, "Text to continue; repeat for a batch.")
flags.DEFINE_integer("step", None, "Checkpoint step; default the latest.")
flags.DEFINE_integer("max_new_tokens", 256, "Tokens to generate after each prompt.")
flags.DEFINE_float("temperature", 0.0, "0 = greedy; else softmax(logits / temperature).")
flags.DEFINE_float("top_p", 1.0, "Nucleus sampling: keep the most probable tokens up to this "
                   "probability (1 = all).")
flags.DEFINE_integer("seed", 0, "Seed of the sampling key.")
flags.DEFINE_string("tokenizer", None, "A tokenizer.json; default the run's data tokenizer "
                    "(an imported model's own).")
flags.DEFINE_string("eos_token", None, "A tokenizer.json's end-of-document token to stop at, "
                    "e.g. '<|end_of_text|>' (the byte tokenizer stops at its EOS).")
flags.DEFINE_string("out", None, "Also write the result as JSON here.")
flags.mark_flags_as_required(["workdir", "prompt"])


def main(argv):
  del argv
  f = flags.FLAGS
  result = generate.generate_text(open_readonly(f.workdir), f.prompt, step=f.step,
                                  max_new_tokens=f.max_new_tokens, temperature=f.temperature,
                                  top_p=f.top_p, seed=f.seed, tokenizer_path=f.tokenizer,
                                  eos_token=f.eos_token)
  print(generate.summary(result))
  if f.out:
    with open(f.out, "w") as out:
      out.write(storage.to_json(result, indent=2) + "\n")


if __name__ == "__main__":
  cli.run(main)
