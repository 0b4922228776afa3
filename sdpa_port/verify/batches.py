"""The tensors of an input plan: ids, features, boxes, patches and categories, padded as asked."""

from __future__ import annotations

import math
from typing import Any

import torch

from sdpa_port.verify.checks import Batch
from sdpa_port.verify.inputs import Plan, TensorSpec

PAD = {"input_ids": 3}  # padded positions of the last example; other sequences lose a quarter


def materialise(plan: Plan, config: Any, padding: str = "none", seed: int = 1) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    inputs = {spec.name: _tensor(spec, generator) for spec in plan.tensors}
    keep = torch.ones(plan.tensors[0].shape[0], 0, dtype=torch.long)
    if plan.mask and plan.sequence:
        mask = inputs[plan.mask]
        length = mask.shape[1]
        pad = PAD.get(plan.sequence, max(length // 4, 1))
        if padding == "left":
            mask[-1, :pad] = 0
        elif padding == "right":
            mask[-1, length - pad :] = 0
        if plan.sequence == "input_ids":
            pad_id = _pad_id(config)
            inputs["input_ids"] = inputs["input_ids"].masked_fill(mask == 0, pad_id)
            keep = mask
        elif padding != "none":
            sequence = inputs[plan.sequence]
            shape = [mask.shape[0], length] + [1] * (sequence.dim() - 2)
            inputs[plan.sequence] = sequence * mask.view(shape).to(sequence.dtype)
    return Batch(inputs, keep)


def _pad_id(config: Any) -> int:
    for holder in (config, getattr(config, "text_config", None)):
        value = getattr(holder, "pad_token_id", None) if holder is not None else None
        if isinstance(value, int):
            return value
    return 0


def _tensor(spec: TensorSpec, generator: torch.Generator) -> torch.Tensor:
    shape = spec.shape
    if spec.fill == "ids":
        low = min(spec.low, max(spec.high - 1, 0))
        ids = torch.randint(low, max(spec.high, low + 1), shape, generator=generator)
        if spec.placeholders:
            ids[:, 1 : 1 + spec.placeholders] = spec.placeholder
        return ids
    if spec.fill == "normal":
        return torch.randn(shape, generator=generator)
    if spec.fill == "uniform":
        return torch.rand(shape, generator=generator)
    if spec.fill == "ones":
        dtype = {"long": torch.long, "bool": torch.bool}.get(spec.dtype, torch.float32)
        return torch.ones(shape, dtype=dtype)
    if spec.fill == "boxes":
        corner = torch.rand(shape[:-1] + (2,), generator=generator) * 0.5
        size = torch.rand(shape[:-1] + (2,), generator=generator) * 0.5
        boxes = torch.cat([corner, corner + size], dim=-1) * spec.high
        return boxes.round().long() if spec.dtype == "long" else boxes
    if spec.fill == "patches":
        batch, count, width = shape
        side = max(int(math.ceil(math.sqrt(count))), 1)
        rows = (torch.arange(count) // side + 1).float()
        columns = (torch.arange(count) % side + 1).float()
        values = torch.randn((batch, count, width - 2), generator=generator)
        index = torch.stack([rows, columns], dim=-1).expand(batch, count, 2)
        return torch.cat([index, values], dim=-1)
    if spec.fill == "categorical":
        columns = [torch.randint(0, max(c, 1), (shape[0], 1), generator=generator) for c in spec.cardinality]
        return torch.cat(columns, dim=1) if columns else torch.zeros(shape, dtype=torch.long)
    raise ValueError(f"unknown fill {spec.fill!r}")
