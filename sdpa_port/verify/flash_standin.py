"""A CPU stand-in for flash-attn's kernels, with flash-attn's API, for running transformers' flash path without a GPU.

Not flash-attn: a softmax written out in float32, over the layouts and conventions flash-attn's functions take, so
that transformers' own flash integration (mask unpadding, `cu_seqlens`, the `causal` flag, head groups) runs on a
CPU and can be compared with eager:

- `func(q, k, v, ...)`: (batch, seq, heads, dim), as `flash_attn_func`;
- `varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)`: sequences packed along the first
  axis, (total, heads, dim), as `flash_attn_varlen_func`;
- `causal` aligned bottom-right, as flash-attn 2.1 and later: query `i` of `q_len` sees key `j` of `k_len` when
  `j <= i + k_len - q_len`; a query that sees no key gives zeros;
- `window_size=(left, right)` counted from that diagonal, -1 unbounded; `softcap` as `softcap * tanh(s / softcap)`;
- grouped-query attention: query head `h` reads key head `h // (q_heads // k_heads)`.

Dropout and ALiBi slopes are not modelled: the stand-in raises on them rather than compute something else. Each call
is counted, so a check can tell that the kernel was reached. Imports torch.
"""

from __future__ import annotations

import torch

UNBOUNDED = (-1, -1)


class FlashStandIn:
    """The two kernels transformers' flash path calls, counting their calls."""

    def __init__(self) -> None:
        self.calls = 0

    def func(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = UNBOUNDED,
        softcap: float = 0.0,
        alibi_slopes: torch.Tensor | None = None,
        deterministic: bool = False,
        return_attn_probs: bool = False,
    ) -> torch.Tensor:
        """flash_attn_func: (batch, seq, heads, dim) in, (batch, q_len, heads, v_dim) out."""
        self.calls += 1
        _unmodelled(dropout_p, alibi_slopes)
        return attend(q, k, v, softmax_scale, causal, window_size, softcap)

    def varlen(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = UNBOUNDED,
        softcap: float = 0.0,
        alibi_slopes: torch.Tensor | None = None,
        deterministic: bool = False,
        return_attn_probs: bool = False,
        block_table: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """flash_attn_varlen_func: sequences packed as (total, heads, dim), bounded by the cumulative lengths."""
        self.calls += 1
        _unmodelled(dropout_p, alibi_slopes)
        if block_table is not None:
            raise NotImplementedError("the flash stand-in reads no paged cache (block_table)")
        starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        if len(starts_q) != len(starts_k):
            raise ValueError("cu_seqlens_q and cu_seqlens_k count different sequences")
        outputs = []
        for index in range(len(starts_q) - 1):
            q_one = q[starts_q[index] : starts_q[index + 1]]
            k_one = k[starts_k[index] : starts_k[index + 1]]
            v_one = v[starts_k[index] : starts_k[index + 1]]
            if q_one.shape[0] > max_seqlen_q or k_one.shape[0] > max_seqlen_k:
                raise ValueError("a sequence is longer than max_seqlen_q or max_seqlen_k")
            one = attend(q_one[None], k_one[None], v_one[None], softmax_scale, causal, window_size, softcap)
            outputs.append(one[0])
        return torch.cat(outputs, dim=0)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
) -> torch.Tensor:
    """Attention over (batch, seq, heads, dim), in float32, returned in the query's dtype."""
    q_heads, k_heads = q.shape[2], k.shape[2]
    if q_heads % k_heads:
        raise ValueError(f"{q_heads} query heads do not group over {k_heads} key heads")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    query = q.transpose(1, 2).float()
    key = k.transpose(1, 2).float().repeat_interleave(q_heads // k_heads, dim=1)
    value = v.transpose(1, 2).float().repeat_interleave(q_heads // k_heads, dim=1)
    scores = query @ key.transpose(-1, -2) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    allowed = visible(q.shape[1], k.shape[1], causal, window_size, q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query seeing no key: zeros, as flash-attn gives
    return (probs @ value).transpose(1, 2).to(q.dtype)


def visible(q_len: int, k_len: int, causal: bool, window_size: tuple[int, int], device: torch.device) -> torch.Tensor:
    """(q_len, k_len) booleans: the keys each query sees, the diagonal aligned bottom-right."""
    diagonal = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    keys = torch.arange(k_len, device=device)[None, :]
    left, right = window_size
    if causal:
        right = 0  # flash-attn's causal window ends on the diagonal
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if right >= 0:
        allowed &= keys <= diagonal + right
    if left >= 0:
        allowed &= keys >= diagonal - left
    return allowed


def _unmodelled(dropout_p: float, alibi_slopes: torch.Tensor | None) -> None:
    if dropout_p:
        raise NotImplementedError("the flash stand-in runs no dropout (dropout_p > 0)")
    if alibi_slopes is not None:
        raise NotImplementedError("the flash stand-in applies no ALiBi slopes")


__all__ = ["FlashStandIn", "attend", "visible"]
