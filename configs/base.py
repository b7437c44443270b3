"""All defaults, and the builders the per-experiment files call.

Experiments are named by non-embedding parameter count (see docs/models.md for the exact shapes
and the command that counts them). Every paper config trains on ProLong data and needs its path:
  --config.data.path=/path/to/prolong-data-64K --config.eval.path=/path/to/textbook_chapters
"""
import ml_collections

# Shapes of the named sizes; non-embedding counts (python benchmarks/model_sizes.py):
# 120m -> 120.4M, 350m -> 346.1M.
SIZES = {
    "120m": dict(num_layers=12, d_model=768, num_heads=12, num_kv_heads=12, head_dim=64,
                 mlp_dim=3328),
    "350m": dict(num_layers=24, d_model=1024, num_heads=16, num_kv_heads=16, head_dim=64,
                 mlp_dim=3328),
}
WINDOWS = (64, 128, 256, 512, 1024, 2048, 4096)

# ProLong 64K training mixture (domain@proportion), as released by princeton-nlp.
PROLONG_DOMAINS = (
    "thestackv1_concat_by_repo-65536@0.3", "book-65536@0.3", "fineweb-edu@0.1",
    "fineweb-2023-50@0.1", "stackexchange@0.04", "dolmawiki@0.04", "tuluv2@0.03",
    "arxiv@0.03", "openwebmath@0.03", "textbooks@0.03",
)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()

  c.model = ml_collections.ConfigDict(dict(
      pattern="SG",            # S = sliding-window, G = global, L = gated linear attention,
                               # D = gated delta rule; repeated to num_layers
                               # (hybrid_nope/model/pattern.py).
      num_layers=12,           # Blocks (attention or linear mixer, then the SwiGLU MLP).
      d_model=768,             # Width of the residual stream.
      num_heads=12,            # Query heads.
      num_kv_heads=12,         # Key/value heads (fewer than num_heads: GQA; must divide it).
      head_dim=64,             # Per head, for queries, keys and values.
      mlp_dim=3328,            # Hidden width of the SwiGLU MLP.
      window=256,              # S layers attend to this many tokens, themselves included.
      swa_pos="rope",          # rope | nope (NoPE-in-SWA ablation)
      global_pos="nope",       # nope | rope (control only)
      rope_theta=10000.0,      # RoPE base frequency of the layers that use RoPE.
      vocab_size=128256,       # Llama-3 tokenizer (ProLong data).
      tie_embeddings=False,    # True: the output head is the token embedding, transposed.
      norm_eps=1e-5,           # RMSNorm's epsilon.
      dtype="auto",            # auto: float32 on CPU, bfloat16 elsewhere (the compute dtype).
      param_dtype="float32",   # float32 | bfloat16: the parameters' storage (bfloat16 halves
                               # their memory; updates below bf16's resolution are lost).
      logits_dtype="compute",  # compute | float32: the output head's matmul in the compute
                               # dtype or in float32; the loss is float32 either way.
      loss_block=1024,         # Positions of each row whose logits the head and loss compute
                               # at once (model/head.py), so [B, T, V] is never held; 0 = whole
                               # rows (the full logits). Same function either way.
      remat=False,             # True: scan the pattern repeats, keeping only the residual stream
                               # between them for the backward pass (long sequences, big models).
      attention_impl="auto",   # Kernel of the S and G layers: auto picks per platform
                               # (hybrid_nope/kernels/__init__.py: IMPLS).
      linear_impl="auto",      # Kernel of the gated linear attention (L) layers.
      delta_impl="auto",       # Kernel of the gated delta rule (D) layers.
      delta_gate="head",       # D layers' decay: "head" (one α per value head, Gated DeltaNet)
                               # or "channel" (one per key channel, Kimi Delta Attention).
      delta_gate_form="gla",   # D layers' gates (model/delta_gates.py): gla (GLA's low-rank
                               # logsigmoid; D's first form), mamba2 (Gated DeltaNet, Qwen3-Next:
                               # −exp(A_log)·softplus(x W_a + dt_bias); gate head) or kda (Kimi
                               # Linear: per channel, low rank, and its sigmoid output gate).
      delta_expand_v=1,        # D layers' value head dim = expand_v x head_dim (fla's GDN: 2).
      delta_v_heads=0,         # D layers' value heads: 0 = num_kv_heads; a multiple of it shares
                               # each q/k head among value heads (GVA, Qwen3-Next; needs
                               # num_heads == num_kv_heads).
      delta_qk_scale="1",      # D layers' query scale: "1" or "1/sqrt(d_k)" (the published one).
      delta_allow_neg_eigval=False,  # D layers' β = 2·sigmoid (in (0, 2)) instead of sigmoid.
  ))

  c.data = ml_collections.ConfigDict(dict(
      source="mds",            # mds (ProLong) | stdlib (embedded demo corpus) | documents (a
                               # prepared byte corpus: hybrid_nope/data/sources/documents.py) | jsonl |
                               # parquet | hf (a `datasets` save_to_disk directory): text
                               # tokenised on the fly (hybrid_nope/data/sources/text_rows.py).
      path="",                 # Required for mds, documents and the text sources (a file, glob
                               # or directory); a URL (gs://, hf://datasets/...) for mds and text.
      text_field="text",       # Text sources: the field or column holding each document.
      tokenizer="byte",        # Text sources: "byte" or a tokenizer.json path or URL.
      domains=PROLONG_DOMAINS,  # mds: the domains (subdirectories of data.path) mixed, each
                                # "name@proportion"; the proportions sum to 1.
      seq_len=8192,            # Tokens per training row (documents packed, boundaries kept).
      batch_size=64,           # Global, in sequences.
      seed=0,                  # The data order; follows train.seed unless set (below).
      eval_fraction=0.05,      # stdlib and text sources: held-out share of documents.
      document_masking=True,   # False: one sequence per packed sample (ProLong single_seq).
      cache_dir="",            # Where zstd MDS shards are decompressed, remote ones fetched
                               # and text indexes kept; "" = ~/.cache/hybrid_nope/mds.
      # A bool or "always" (a field of either type, so the command line takes both).
      verify_hashes=ml_collections.FieldReference(True, field_type=object),
                               # Check each MDS shard against index.json's hashes when first read;
                               # a stamp (size, mtime) skips it at later starts. "always": hash
                               # every shard at every start, past the stamps (bit rot): ~2 s per
                               # GB of shards on one core from the page cache (sha1, benchmarks/
                               # data.py), 0.02 s for the prose corpus' 8 MB. False: never.
      allow_changed_data=False,  # True: resume even if the data differs from the checkpoint's.
      skip_batches=0,          # Skip this many batches at this resume (after a rollback to step
                               # checkpoint.restore_step, as after a loss spike); applied once.
      exclude_samples=(),      # Samples never read, e.g. ("domain/shard.mds:7",): a bad sample
                               # the shard check refused; recorded in the data fingerprint.
  ))

  c.eval = ml_collections.ConfigDict(dict(
      path="",                 # TextbookChapters as prepared by
                               # `python -m hybrid_nope.data.sources.textbook_chapters`; required for mds.
      bucket_size=512,         # Eval loss is also reported per bucket of token positions.
      batch_size=8,            # Rows per eval batch.
      num_batches=16,          # Batches per evaluation (the same rows every time).
      every_steps=1000,        # Evaluate every this many steps (and at the last).
      length_multiples=(1,),   # Also evaluate on rows of k × data.seq_len (extrapolation), e.g.
                               # (1, 2, 4): logged as eval_loss@{k}x and by position bucket.
      sample_every_steps=0,    # Every this many steps (and at the last; 0 = off), greedy
                               # continuations of sample_prompts (tokenised as the training
                               # data) go to metrics.jsonl, TensorBoard text and W&B.
      sample_prompts=(),       # Strings to continue (see sample_every_steps).
      sample_max_new_tokens=64,  # Tokens generated per prompt.
  ))

  c.train = ml_collections.ConfigDict(dict(
      steps=20000,             # Optimizer updates in the run.
      learning_rate=6e-4,      # Peak learning rate (after warmup).
      min_learning_rate_ratio=0.1,  # The schedules end at this fraction of the peak.
      warmup_steps=1000,       # Linear from 0 to learning_rate, before every schedule.
      schedule="cosine",       # cosine | wsd (warmup-stable-decay) | linear | constant: the
                               # first three end at min_learning_rate_ratio x peak at
                               # train.steps (hybrid_nope/train/lr_schedule.py).
      decay_fraction=0.2,      # wsd: the last fraction of train.steps decays (1 - sqrt).
      schedule_offset=1,       # Update n runs at lr(n - 1 + offset): 1 trains from the first
                               # update; 0 (runs before this key) runs it at lr(0) = 0.
      z_loss=0.0,              # Coefficient of log²Z (softmax normaliser) added to the loss,
                               # as PaLM (1e-4); logged as z_loss. 0 = off.
      opt_state_dtype="float32",  # float32 | bfloat16: Adam's moments' storage.
      b1=0.9,                  # AdamW's first-moment decay.
      b2=0.95,                 # AdamW's second-moment decay.
      eps=1e-8,                # AdamW's denominator epsilon.
      weight_decay=0.1,        # Not applied to norm gains or embeddings.
      grad_clip=1.0,           # Clip the global gradient norm to this (> 0).
      grad_accum_steps=1,      # Microbatches per step (1 = off): the global batch is split into
                               # this many, scanned in one jitted step, for one update.
      seed=0,                  # Initialisation and (through data.seed) the data order.
      log_every_steps=10,      # Training scalars every this many steps.
      peak_flops=0.0,          # Per device, for MFU; 0 = look up / measure (hybrid_nope.train.flops).
      profile_start_step=0,    # jax.profiler trace of train.profile_steps steps from this one
      profile_steps=0,         # into WORKDIR/profile/ (TensorBoard, Perfetto); 0 = off.
      allow_changes=(),        # Keys a resume may change although they define the run (model.*,
                               # data.batch_size, data.seq_len, train.seed, the LR schedule),
                               # e.g. ("data.batch_size",); recorded in config_history.jsonl.
      overwrite=False,         # True: start afresh in a workdir whose records have no
                               # checkpoint (the old records are moved aside, not deleted).
  ))

  c.checkpoint = ml_collections.ConfigDict(dict(
      every_steps=1000,        # Save every this many steps (and at the last).
      keep=3,                  # Newest checkpoints kept; older ones are deleted.
      every_minutes=0.0,       # Also save when this many minutes passed since the last save
                               # (spot TPUs); 0 = off.
      directory="",            # "" = WORKDIR/checkpoints; use gs://... on multi-host pods.
      restore_step=0,          # 0 = resume from the newest; N = from kept step N (newer ones
                               # are moved to checkpoints/rolled_back/; done once).
  ))
  c.metrics = ml_collections.ConfigDict(dict(
      far_lag=4096,            # L: floor = f(L), gap = f(1) − f(L); must be < data.seq_len.
      probe_batch_size=32,     # Most eval rows the recency hook measures, chosen from the
      probe_pool_rows=256,     # first probe_pool_rows eval rows (all, in a smaller eval set)
                               # to span as many documents as they hold.
      query_positions=1024,    # Evenly spaced query positions averaged over; 0 = all.
      # How often the recency hook runs (step 0 always); follows checkpoint.every_steps unless set.
      every_steps=c.checkpoint.get_ref("every_steps") * 1,
      figures=True,            # Also draw the recency figures into TensorBoard and W&B at each
                               # measurement (host-side; ~1.5 s at 120m).
  ))
  # One seed per run: train.seed draws the initialisation and the training data order (the
  # eval set, the probe and its shuffled control never depend on a seed, so runs pair). Set
  # data.seed on its own to vary the order alone.
  c.data.seed = c.train.get_ref("seed") * 1  # A derived reference: setting data.seed leaves
                                            # train.seed as it is (a plain reference would not).
  c.mesh = ml_collections.ConfigDict(dict(
      data=-1,                 # Data-parallel devices; -1 = every device the others leave.
      fsdp=1,                  # Devices the parameters and optimizer state are sharded over.
      sequence=1,              # Devices one row's tokens are split over (context parallelism:
                               # SWA halos, gathered keys for G, state carried for L and D).
      tensor=1,                # Devices heads and the MLP width are split over (megatron).
  ))
  c.logging = ml_collections.ConfigDict(dict(
      wandb_project="",        # Weights & Biases project to log to; "" = off. Needs
                               # `pip install .[wandb]`; WANDB_MODE=offline logs locally.
      wandb_entity="",         # W&B team or user; "" = the logged-in user's default.
  ))
  return c


# The D layer as published (model/delta.py and delta_gates.py cite each form's source):
# Gated DeltaNet as fla's GatedDeltaNet defaults (Mamba2's gate, expand_v 2, q scaled by
# 1/sqrt(d_k)); KDA as Kimi Linear (transformers' KimiLinearDeltaAttention).
DELTA_PUBLISHED = {
    "gdn": dict(delta_gate_form="mamba2", delta_gate="head", delta_expand_v=2,
                delta_qk_scale="1/sqrt(d_k)"),
    "kda": dict(delta_gate_form="kda", delta_gate="channel", delta_qk_scale="1/sqrt(d_k)"),
}


def experiment(size: str, window: int | None, swa_pos: str = "rope", local: str = "S",
               locals_per_global: int = 1) -> ml_collections.ConfigDict:
  """A paper run: `size` in SIZES; `local` the local mixer interleaved with global NoPE layers,
  `locals_per_global` of them before each global layer (1: SG, LG, DG; 3: DDDG as Kimi Linear
  and Qwen3-Next): "S" (SWA with `window`; None is the global-NoPE-only baseline), "L" (gated
  linear attention) or "D" (gated delta rule); L and D layers have no window."""
  if size not in SIZES:
    raise ValueError(f"size={size!r}: expected one of {sorted(SIZES)}")
  if local not in ("S", "L", "D") or (local != "S" and window is not None):
    raise ValueError(f"local={local!r}, window={window!r}: expected local 'S' (with a window, "
                     "or None for global only), 'L' or 'D' (without a window)")
  if not (isinstance(locals_per_global, int) and locals_per_global >= 1):
    raise ValueError(f"locals_per_global={locals_per_global!r}: expected an int >= 1")
  c = get_config()
  c.model.update(SIZES[size])
  if local == "S" and window is None:
    c.model.pattern = "G"
  else:
    c.model.pattern = local * locals_per_global + "G"
  if local == "S" and window is not None:
    c.model.window = window
    c.model.swa_pos = swa_pos
  if size == "350m":
    c.train.learning_rate = 3e-4
  return c
