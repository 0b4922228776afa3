"""Models built for one attention implementation, their weights sharpened, run one forward at a time."""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from typing import Any

import torch

from sdpa_port.verify.checks import Batch
from sdpa_port.verify.sized_configs import sub_configs


def sharpen(model: torch.nn.Module, gain: float = 2.0, seed: int = 0) -> None:
    """`checks.sharpen` with the fan-in of convolution kernels counted over channels and kernel positions.

    Matrices get std gain/sqrt(fan_in), embeddings std 1, biases std 0.5, norm scales U(0.5, 1.5): attention logits
    spread over several units, so a wrong scale or a dropped term shows far beyond the tolerance. (`checks.sharpen`
    takes the last dimension as the fan-in, which for a convolution is its kernel width: convolutional stacks
    then grow by orders of magnitude per layer.)
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, parameter in module.named_parameters(recurse=False):
                if parameter.dim() >= 2:
                    fan_in = parameter.shape[-1] if parameter.dim() == 2 else parameter[0].numel()
                    std = 1.0 if isinstance(module, torch.nn.Embedding) else gain / math.sqrt(max(fan_in, 1))
                    values = torch.randn(parameter.shape, generator=generator) * std
                elif "bias" in name:
                    values = torch.randn(parameter.shape, generator=generator) * 0.5
                else:
                    values = torch.rand(parameter.shape, generator=generator) + 0.5
                parameter.copy_(values.to(parameter.dtype))
        for module in model.modules():
            _settle_spectral_norm(module)


def _settle_spectral_norm(module: torch.nn.Module, iterations: int = 30) -> None:
    """Power iterations on the redrawn weight of a module under `torch.nn.utils.spectral_norm`.

    Its vectors `u` and `v` are buffers estimated for the weight it was built with, and are not updated in eval
    mode: over a redrawn weight they give a wrong norm, of any size and sign, and the weight divided by it
    saturates the softmax (one-hot probabilities that no scale changes). Settled, the norm is the weight's own."""
    from torch.nn.utils.spectral_norm import SpectralNorm

    for hook in list(module._forward_pre_hooks.values()):
        if not isinstance(hook, SpectralNorm):
            continue
        weight = getattr(module, hook.name + "_orig")
        u, v = getattr(module, hook.name + "_u"), getattr(module, hook.name + "_v")
        matrix = hook.reshape_weight_to_matrix(weight)
        for _ in range(iterations):
            v.copy_(torch.nn.functional.normalize(torch.mv(matrix.t(), u), dim=0, eps=hook.eps))
            u.copy_(torch.nn.functional.normalize(torch.mv(matrix, v), dim=0, eps=hook.eps))


def build_sdpa(model_class: type, config: Any, propagate: bool = False) -> tuple[Any, str]:
    """The model built for SDPA, and a note when that needed transformers' default choice.

    transformers 5 hands an explicit `attn_implementation="sdpa"` down to every sub-model and refuses the build when
    one of them (from a file not ported, e.g. BLIP's text model) lacks SDPA; its default (None) picks SDPA wherever
    supported and eager elsewhere, as a user loading the ported model gets it.
    """
    try:
        return build(model_class, config, "sdpa", propagate), ""
    except ValueError as error:
        if "scaled_dot_product_attention" not in str(error):
            raise
        model = build(model_class, config, None, propagate, expect="sdpa")
        refused = str(error).split(" does not support", 1)[0]
        return model, f"built with the default implementation (SDPA where supported): {refused} has no SDPA"


def build(model_class: type, config: Any, implementation: str | None, propagate: bool = False, expect: str | None = None) -> Any:
    """A model built with `implementation`.

    `propagate` sets it on every sub-config too.
    """
    import transformers

    config = copy.deepcopy(config)
    if propagate:
        for _, sub in sub_configs(config):
            with contextlib.suppress(Exception):
                sub._attn_implementation = implementation
    dtype_argument = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    # the same random initialisation in every build: weights a model keeps outside its state dict (Mask2Former
    # 4.40 holds its input projections in a plain list) are then alike in the original and the port
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_class._from_config(config, attn_implementation=implementation, **{dtype_argument: torch.float32})
    model.eval()
    built = getattr(model.config, "_attn_implementation", None)
    if built != (expect or implementation):
        raise RuntimeError(f"{model_class.__name__} built with {built!r}, not {expect or implementation!r}")
    return model


def forward(model: Any, batch: Batch, seed: int = 0) -> Any:
    """One forward pass with the global generator reset, so that random masking draws alike in every model."""
    torch.manual_seed(seed)
    with torch.no_grad():
        return model(**batch.inputs)


def parameter_count(model_class: type, config: Any) -> int | None:
    """Parameters of the model built on the meta device, or None where that cannot be done."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_class._from_config(copy.deepcopy(config), attn_implementation="eager")
    except Exception:
        return None
    return sum(p.numel() for p in model.parameters())
