"""Transformers' flash attention path run on a CPU, a stand-in for its kernel: the run half of `_supports_flash_attn`.

flash-attn needs a GPU. What a port must get right for flash is not the kernel but what transformers hands it: the
mask `masking_utils` builds for flash (a 2-D padding mask or None), its unpadding into packed sequences, the
`causal` flag read from `module.is_causal`, the keywords flash reads and those it drops. `flash_path()` runs all of
that as it is, and replaces only:

- the kernels `modeling_flash_attention_utils._lazy_imports` would import, by `FlashStandIn`'s (flash-attn's API,
  a float32 softmax underneath, `verify/flash_standin.py`), with transformers' own pad and unpad functions;
- the checks that refuse flash without the package or a GPU (`general_availability_check` of flash-attn 2, the
  device checks of `PreTrainedModel._flash_attn_can_dispatch`, which keeps refusing a class without the flag).

(`_use_top_left_mask`, read at import from the missing package, is left: it only turns `causal` off for a single
query, which sees every key either way.)

The model keeps float32 (transformers casts to the dtype of the model's first linear layer, float32 here), so the
comparison with eager takes the float32 tolerance. Every patch is undone on leaving, and the loaded kernels are
forgotten. A model that never reached the stand-in does not pass (`claims.flash_claim`). Imports torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from sdpa_port.verify.flash_standin import FlashStandIn

FLASH = "flash_attention_2"
STAND_IN = "a CPU stand-in for the flash-attn kernel (not flash-attn itself)"
# the kernels `lazy_import_flash_attention` keeps once loaded, forgotten on entering and on leaving
_LOADED = (
    "_loaded_implementation",
    "_flash_fn",
    "_flash_varlen_fn",
    "_flash_with_kvcache_fn",
    "_pad_fn",
    "_unpad_fn",
    "_process_flash_kwargs_fn",
    "_process_with_kvcache_kwargs_fn",
)


def why_no_flash(ported: ModuleType) -> str | None:
    """Why transformers' flash path cannot be run for this port, or None when it can."""
    if not hasattr(ported, "ALL_ATTENTION_FUNCTIONS"):
        return "the port does not dispatch through ALL_ATTENTION_FUNCTIONS"
    if FLASH not in ported.ALL_ATTENTION_FUNCTIONS:
        return "this transformers offers no flash_attention_2"
    try:
        from transformers import modeling_flash_attention_utils as utils
    except ImportError:
        return "this transformers has no modeling_flash_attention_utils"
    if not all(hasattr(utils, name) for name in ("_lazy_imports", "FLASH_ATTENTION_COMPATIBILITY_MATRIX", *_LOADED)):
        return "this transformers' flash integration is not the one the stand-in was written for (5.x)"
    return None


@contextlib.contextmanager
def flash_path() -> Iterator[FlashStandIn]:
    """Transformers' flash path on a CPU, its kernel the stand-in yielded (whose calls it counts)."""
    from transformers import PreTrainedModel
    from transformers import modeling_flash_attention_utils as utils

    stand_in = FlashStandIn()

    def lazy_imports(implementation: str | None, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return stand_in.func, stand_in.varlen, None, utils._pad_input, utils._unpad_input

    def can_dispatch(self: Any, flash_attn_version: int, is_init_check: bool = False) -> bool:
        if not self._supports_flash_attn:
            raise ValueError(f"{type(self).__name__} does not support Flash Attention {flash_attn_version}")
        return True

    entry = utils.FLASH_ATTENTION_COMPATIBILITY_MATRIX[2]
    saved = {name: getattr(utils, name) for name in _LOADED}
    patches: list[tuple[Any, str, Any]] = [
        (utils, "_lazy_imports", lazy_imports),
        (PreTrainedModel, "_flash_attn_can_dispatch", can_dispatch),
    ]
    before = [(owner, name, vars(owner).get(name)) for owner, name, _ in patches]
    available = entry["general_availability_check"]
    try:
        for name in _LOADED:
            setattr(utils, name, None)
        for owner, name, value in patches:
            setattr(owner, name, value)
        entry["general_availability_check"] = lambda *args, **kwargs: True
        yield stand_in
    finally:
        entry["general_availability_check"] = available
        for owner, name, value in before:
            setattr(owner, name, value)
        for name, value in saved.items():
            setattr(utils, name, value)


__all__ = ["FLASH", "STAND_IN", "flash_path", "why_no_flash"]
