"""What an always-built causal mask costs sdpa against its `is_causal` shortcut, per sequence length.

Ports whose causality the masks carry (`create_causal_mask(..., allow_is_causal_skip=False)`, README "Causality")
hand sdpa a boolean lower-triangular mask where the builder could have skipped it. This times the two calls on the
same random inputs (best of `--runs`, after one warm-up), checks that they agree, and prints the ratio.

    python scripts/causal_mask_cost.py --lengths 512,1024,2048 --threads 1
"""

from __future__ import annotations

import argparse
import time
from typing import Callable


def best_ms(call: Callable[[], object], runs: int) -> float:
    call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="512,1024,2048")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.heads} heads of {args.head_dim}, batch 1")
    for length in (int(n) for n in args.lengths.split(",")):
        query, key, value = (torch.randn(1, args.heads, length, args.head_dim) for _ in range(3))
        mask = torch.ones(length, length, dtype=torch.bool).tril()[None, None]
        flagged = best_ms(lambda: sdpa(query, key, value, is_causal=True), args.runs)
        built = best_ms(lambda: sdpa(query, key, value, attn_mask=mask), args.runs)
        difference = (sdpa(query, key, value, is_causal=True) - sdpa(query, key, value, attn_mask=mask)).abs().max()
        print(
            f"{length:>6} tokens: is_causal {flagged:8.1f} ms, built mask {built:8.1f} ms, "
            f"ratio {built / flagged:4.2f}, max|diff| {difference.item():.1e}"
        )


if __name__ == "__main__":
    main()
