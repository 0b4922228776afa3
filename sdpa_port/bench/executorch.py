"""ExecuTorch latency of a decoder: its SDPA model exported with a static cache, lowered to XNNPACK, run from the .pte.

Prefill is one program taking the L prompt tokens at once; decode is the one-token program at cache positions L,
L+1, ... (per token). The static cache holds L + the decode tokens; with it, attention covers the whole cache under
a mask, so the cost of a step does not depend on what the cache holds. Wall time, minimum of the runs, on as many
threads as torch was given.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from sdpa_port.bench.spec import Phase, Settings


class ExecutorchUnavailable(Exception):
    """ExecuTorch cannot time this model here, and why.

    Not installed, batch > 1, a failed export.
    """


def executorch_latencies(model: Any, length: int, settings: Settings) -> dict[Phase, float]:
    """Seconds per prefill of `length` tokens and per decode token after them."""
    from sdpa_port.verify import serving

    missing = serving.executorch_missing()
    if missing is not None:
        raise ExecutorchUnavailable(missing)
    if settings.batch != 1 or settings.padding != "none":
        raise ExecutorchUnavailable("the static-cache export takes one unpadded sequence (--batch 1 --padding none)")
    _threads(settings.threads)
    cache = length + settings.decode_tokens
    try:
        prefill = serving.load_pte(serving.lower_to_xnnpack(serving.export_static(model, cache, length=length)))
        decode = serving.load_pte(serving.lower_to_xnnpack(serving.export_static(model, cache)))
    except Exception as error:  # an export or lowering failure is reported, not raised through the benchmark
        raise ExecutorchUnavailable(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from error
    generator = torch.Generator().manual_seed(settings.seed)
    vocab = int(getattr(model.config, "vocab_size", 100))
    prompt = torch.randint(3, vocab, (1, length), generator=generator)
    token = prompt[:, -1:]

    def prefill_step() -> None:
        prefill(prompt, torch.arange(length))

    def decode_steps() -> None:
        for step in range(settings.decode_tokens):
            decode(token, torch.tensor([length + step]))

    return {
        Phase.PREFILL: _minimum(prefill_step, settings),
        Phase.DECODE: _minimum(decode_steps, settings) / settings.decode_tokens,
    }


def _threads(count: int) -> None:
    """Give ExecuTorch's threadpool as many threads as torch has.

    XNNPACK runs on that threadpool, so the comparison is like for like; its size is process-wide.
    """
    from executorch.extension.pybindings import portable_lib

    if portable_lib._threadpool_get_thread_count() != count:
        portable_lib._unsafe_reset_threadpool(count)


def _minimum(run: Callable[[], None], settings: Settings) -> float:
    for _ in range(max(settings.warmup, 1)):
        run()
    times = []
    for _ in range(settings.runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)
