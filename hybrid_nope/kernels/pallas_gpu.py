"""Flash attention for GPUs in Pallas (Triton lowering): forward, dq and dk/dv kernels.

Our own kernel rather than jax.experimental.pallas.ops.gpu.attention because that one has no
sliding window, no GQA and walks every causal key block; here each query block visits only the
key blocks its window and its segments reach, and each key block only the query blocks that
read it (bounds from blocking.py, per batch row), so a window costs O(T·w) and packed short
documents cost O(Σ len²) even in a global layer.

Layout stays [B, T, heads, H] (no transposes): a grid step owns one (batch, head, block); keys,
values and segment ids are addressed over the whole sequence and sliced in the loop. T is padded
to the block size and H to a power of two >= 16 (Triton's tile minimum); the zero columns
change no logit. Scores are base 2 (exp2), with the 1/sqrt(H) scale applied in float32.

`interpret=True` runs the same kernels through the Pallas interpreter on any backend; that is
how the CPU tests check their numerics.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from hybrid_nope.kernels import blocking
from hybrid_nope.kernels.blocking import LOG2E, MASKED

# Pallas APIs move between jax releases: a missing module disables this kernel (impl="pallas"
# then raises a clear ValueError) instead of breaking `import hybrid_nope.kernels`.
try:
  from jax.experimental import pallas as pl
except ImportError:  # pragma: no cover - depends on the jax build
  pl = None
try:
  from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover - depends on the jax build
  plgpu = None

_SQUEEZED = getattr(pl, "squeezed", None)  # A block dim of size 1 dropped in the kernel.

_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Query/key block edges (powers of two, >= 16 when compiled) for each kernel."""
  forward: int = 64
  backward: int = 64
  num_warps: int = 4
  num_stages: int = 2


def available() -> bool:
  """Whether the compiled (Triton) kernel can be built; interpret mode needs only Pallas."""
  return pl is not None and plgpu is not None


def _dot(a, b, dims):
  # Triton runs float32 dots at TF32 unless asked for HIGHEST (IEEE): on the H200 that missed the
  # float32 check's 1e-4 by 1.5-7.2x (docs/performance.md, "GPU: one H200"). float32 here is the
  # numerics path (speed runs are bfloat16), so it computes float32; bfloat16 is unaffected.
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _mask(qpos, kpos, window, seg_q, seg_k):
  allowed = kpos[None, :] <= qpos[:, None]
  if window is not None:
    allowed &= kpos[None, :] > qpos[:, None] - window
  if seg_q is not None:
    allowed &= seg_q[:, None] == seg_k[None, :]
  return allowed


def _forward_kernel(lo_ref, q_ref, k_ref, v_ref, *rest, block, window, scale, has_segments):
  if has_segments:
    segq_ref, segk_ref, o_ref, lse_ref = rest
  else:
    (o_ref, lse_ref), segq_ref, segk_ref = rest, None, None
  i = pl.program_id(2)
  q = q_ref[...]
  qpos = i * block + jnp.arange(block, dtype=jnp.int32)
  seg_q = None if segq_ref is None else segq_ref[...]
  # lax.div: Triton lowers it directly; bounds are >= 0. An int32 divisor, also under x64.
  first = lax.div(lo_ref[i], jnp.int32(block))
  count = i + 1 - first

  def step(t, carry):  # Newest key block first: the diagonal makes every row's max finite.
    m, l, acc = carry
    start = (i - t) * block
    k = k_ref[pl.ds(start, block), :]
    v = v_ref[pl.ds(start, block), :]
    seg_k = None if segk_ref is None else segk_ref[pl.ds(start, block)]
    s = _dot(q, k, _NT) * scale
    s = jnp.where(_mask(qpos, start + jnp.arange(block, dtype=jnp.int32), window, seg_q, seg_k), s, MASKED)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    correction = jnp.exp2(m - m_new)
    p = jnp.exp2(s - m_new[:, None])
    acc = acc * correction[:, None] + _dot(p.astype(v.dtype), v, (((1,), (0,)), ((), ())))
    return m_new, l * correction + jnp.sum(p, axis=1), acc

  H = q_ref.shape[-1]
  init = (jnp.full((block,), MASKED, jnp.float32), jnp.zeros((block,), jnp.float32),
          jnp.zeros((block, H), jnp.float32))
  m, l, acc = lax.fori_loop(0, count, step, init)
  o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
  lse_ref[...] = m + jnp.log2(l)


def _dq_kernel(lo_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *rest, block, window,
               scale, has_segments):
  if has_segments:
    segq_ref, segk_ref, dq_ref = rest
  else:
    (dq_ref,), segq_ref, segk_ref = rest, None, None
  i = pl.program_id(2)
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  qpos = i * block + jnp.arange(block, dtype=jnp.int32)
  seg_q = None if segq_ref is None else segq_ref[...]
  first = lax.div(lo_ref[i], jnp.int32(block))

  def step(j, dq):
    start = j * block
    k = k_ref[pl.ds(start, block), :]
    v = v_ref[pl.ds(start, block), :]
    seg_k = None if segk_ref is None else segk_ref[pl.ds(start, block)]
    s = _dot(q, k, _NT) * scale
    s = jnp.where(_mask(qpos, start + jnp.arange(block, dtype=jnp.int32), window, seg_q, seg_k), s, MASKED)
    p = jnp.exp2(s - lse[:, None])
    ds = p * (_dot(do, v, _NT) - delta[:, None])
    return dq + _dot(ds.astype(k.dtype), k, (((1,), (0,)), ((), ())))

  dq = lax.fori_loop(first, i + 1, step, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * (scale / LOG2E)).astype(dq_ref.dtype)


def _dkv_kernel(hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *rest, block, window,
                scale, has_segments, groups):
  if has_segments:
    segq_ref, segk_ref, dk_ref, dv_ref = rest
  else:
    (dk_ref, dv_ref), segq_ref, segk_ref = rest, None, None
  j = pl.program_id(2)
  k, v = k_ref[...], v_ref[...]
  kpos = j * block + jnp.arange(block, dtype=jnp.int32)
  seg_k = None if segk_ref is None else segk_ref[...]
  last = lax.div(hi_ref[j], jnp.int32(block))

  def step_for(g):  # The G query heads sharing this kv head all add into its dk, dv.
    def step(i, carry):
      dk, dv = carry
      start = i * block
      q = q_ref[pl.ds(start, block), g, :]
      do = do_ref[pl.ds(start, block), g, :]
      lse = lse_ref[g, pl.ds(start, block)]
      delta = delta_ref[g, pl.ds(start, block)]
      seg_q = None if segq_ref is None else segq_ref[pl.ds(start, block)]
      s = _dot(q, k, _NT) * scale
      s = jnp.where(_mask(start + jnp.arange(block, dtype=jnp.int32), kpos, window, seg_q, seg_k), s, MASKED)
      p = jnp.exp2(s - lse[:, None])
      dv = dv + _dot(p.astype(do.dtype), do, _TN)
      ds = p * (_dot(do, v, _NT) - delta[:, None])
      return dk + _dot(ds.astype(q.dtype), q, _TN), dv
    return step

  carry = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
  for g in range(groups):
    carry = lax.fori_loop(j, last + 1, step_for(g), carry)
  dk, dv = carry
  dk_ref[...] = (dk * (scale / LOG2E)).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _call(kernel, grid, in_specs, out_specs, out_shape, sizes, interpret, name):
  params = None
  if not interpret and plgpu is not None:
    params = plgpu.CompilerParams(num_warps=sizes.num_warps, num_stages=sizes.num_stages)
  return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                        out_shape=out_shape, compiler_params=params, interpret=interpret,
                        name=name)


def _seq_spec(block, H, head_map):
  return pl.BlockSpec((_SQUEEZED, block, _SQUEEZED, H), lambda b, h, i: (b, i, head_map(h), 0))


def _whole_spec(T, H, head_map):
  return pl.BlockSpec((_SQUEEZED, T, _SQUEEZED, H), lambda b, h, i: (b, 0, head_map(h), 0))


def _forward(q, k, v, seg, window, scale, sizes, interpret):
  """Padded operands in, (out [B,T,N,H], lse [B,N,T] base 2) out."""
  B, T, N, H = q.shape
  G, bs = N // k.shape[2], sizes.forward
  lo = jnp.broadcast_to(blocking.query_block_key_start(T, bs, window, seg), (B, T // bs))
  kv_head = lambda h: h // G
  in_specs = [pl.BlockSpec((_SQUEEZED, T // bs), lambda b, h, i: (b, 0)),
              _seq_spec(bs, H, lambda h: h), _whole_spec(T, H, kv_head),
              _whole_spec(T, H, kv_head)]
  args = [lo, q, k, v]
  if seg is not None:
    in_specs += [pl.BlockSpec((_SQUEEZED, bs), lambda b, h, i: (b, i)),
                 pl.BlockSpec((_SQUEEZED, T), lambda b, h, i: (b, 0))]
    args += [seg, seg]
  kernel = functools.partial(_forward_kernel, block=bs, window=window, scale=scale,
                             has_segments=seg is not None)
  out_specs = [_seq_spec(bs, H, lambda h: h),
               pl.BlockSpec((_SQUEEZED, _SQUEEZED, bs), lambda b, h, i: (b, h, i))]
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((B, N, T), jnp.float32)]
  return _call(kernel, (B, N, T // bs), in_specs, out_specs, out_shape, sizes, interpret,
               "swa_flash_fwd")(*args)


def _backward(q, k, v, seg, out, lse, do, window, scale, sizes, interpret):
  B, T, N, H = q.shape
  K = k.shape[2]
  G, bs = N // K, sizes.backward
  delta = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), -1).transpose(0, 2, 1)
  has_seg = seg is not None

  # dq: one program per (batch, query head, query block), walking the key blocks it reads.
  lo = jnp.broadcast_to(blocking.query_block_key_start(T, bs, window, seg), (B, T // bs))
  kv_head = lambda h: h // G
  row_spec = pl.BlockSpec((_SQUEEZED, _SQUEEZED, bs), lambda b, h, i: (b, h, i))
  in_specs = [pl.BlockSpec((_SQUEEZED, T // bs), lambda b, h, i: (b, 0)),
              _seq_spec(bs, H, lambda h: h), _whole_spec(T, H, kv_head),
              _whole_spec(T, H, kv_head), _seq_spec(bs, H, lambda h: h), row_spec, row_spec]
  args = [lo, q, k, v, do, lse, delta]
  if has_seg:
    in_specs += [pl.BlockSpec((_SQUEEZED, bs), lambda b, h, i: (b, i)),
                 pl.BlockSpec((_SQUEEZED, T), lambda b, h, i: (b, 0))]
    args += [seg, seg]
  kernel = functools.partial(_dq_kernel, block=bs, window=window, scale=scale,
                             has_segments=has_seg)
  dq = _call(kernel, (B, N, T // bs), in_specs, _seq_spec(bs, H, lambda h: h),
             jax.ShapeDtypeStruct(q.shape, q.dtype), sizes, interpret, "swa_flash_dq")(*args)

  # dk, dv: one program per (batch, kv head, key block), walking the query blocks (of all G
  # query heads of the group) that read it, so no two programs write the same rows.
  hi = jnp.broadcast_to(blocking.key_block_query_end(T, bs, window, seg), (B, T // bs))
  group_spec = pl.BlockSpec((_SQUEEZED, T, G, H), lambda b, h, j: (b, 0, h, 0))
  group_rows = pl.BlockSpec((_SQUEEZED, G, T), lambda b, h, j: (b, h, 0))
  in_specs = [pl.BlockSpec((_SQUEEZED, T // bs), lambda b, h, j: (b, 0)),
              group_spec, _seq_spec(bs, H, lambda h: h), _seq_spec(bs, H, lambda h: h),
              group_spec, group_rows, group_rows]
  args = [hi, q, k, v, do, lse, delta]
  if has_seg:
    in_specs += [pl.BlockSpec((_SQUEEZED, T), lambda b, h, j: (b, 0)),
                 pl.BlockSpec((_SQUEEZED, bs), lambda b, h, j: (b, j))]
    args += [seg, seg]
  kernel = functools.partial(_dkv_kernel, block=bs, window=window, scale=scale,
                             has_segments=has_seg, groups=G)
  dk, dv = _call(kernel, (B, K, T // bs), in_specs,
                 [_seq_spec(bs, H, lambda h: h)] * 2,
                 [jax.ShapeDtypeStruct(k.shape, k.dtype)] * 2, sizes, interpret,
                 "swa_flash_dkv")(*args)
  return dq, dk, dv


# `scale` (log2(e)/sqrt(H) of the unpadded head dim) and the rest are static.
@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _flash(q, k, v, seg, window, scale, sizes, interpret):
  return _forward(q, k, v, seg, window, scale, sizes, interpret)[0]


def _flash_fwd(q, k, v, seg, window, scale, sizes, interpret):
  out, lse = _forward(q, k, v, seg, window, scale, sizes, interpret)
  return out, (q, k, v, seg, out, lse)


def _flash_bwd(window, scale, sizes, interpret, residuals, do):
  q, k, v, seg, out, lse = residuals
  dq, dk, dv = _backward(q, k, v, seg, out, lse, do, window, scale, sizes, interpret)
  return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def attention(q_BTNH, k_BTKH, v_BTKH, *, window=None, segment_ids=None,
              block_sizes: BlockSizes | None = None, interpret: bool = False):
  """Causal (sliding-window, segment-masked, GQA) attention; arguments as kernels.attention."""
  if pl is None or (not interpret and plgpu is None):
    raise ValueError("impl='pallas' on GPU needs jax.experimental.pallas (and its triton "
                     "module), which this jax build lacks")
  sizes = block_sizes or BlockSizes()
  B, T, N, H = q_BTNH.shape
  window = blocking.effective_window(window, T)
  Tp = blocking.cdiv(T, max(sizes.forward, sizes.backward)) * max(sizes.forward, sizes.backward)
  Hp = max(16, pl.next_power_of_2(H))
  pad = lambda x: jnp.pad(x, ((0, 0), (0, Tp - T), (0, 0), (0, Hp - H)))
  seg = None if segment_ids is None else blocking.pad_segments(segment_ids, Tp)
  out = _flash(pad(q_BTNH), pad(k_BTKH), pad(v_BTKH), seg, window, LOG2E * H**-0.5, sizes,
               interpret)
  return out[:, :T, :, :H]
