"""A key laid out (batch, dim, length) as a channels-first feature map with its positions flattened.

Convolutional attention blocks (Stable Diffusion's VAE `AttnBlock`) unpack a map's whole shape, `b, c, h, w =
q.shape`, and flatten the positions of each projection: `k.reshape(b, c, h * w)` holds the channels, the features,
second to last, so `torch.bmm(q, k)` is `q @ k^T` for the key `k.transpose(-1, -2)`. Multi-head blocks split the
channels between the batch and the positions (`qkv.view(b, n * 3, d, h * w)`, then `chunk(3, dim=1)`). The batch
and the positions must be sizes of one unpacking of a whole shape (`b, c, h, w = x.shape`, or `*x.size()` with
more after it), the batch first, the positions last, height times width: `k.reshape(b, h * w, c)`, or sizes of two
unpackings, say nothing of where the channels are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import libcst as cst

from sdpa_port.analyse.chain import ScalarVal

if TYPE_CHECKING:
    from sdpa_port.analyse.tracing import TracerView


def channels_flattened(tracer: TracerView, args: Sequence[cst.Arg]) -> bool:
    """The arguments of a reshape are `(b, ..., h * w)`: the batch and the positions of one `b, c, h, w = x.shape`,
    the channels between them, in one size (`(b, c, h * w)`) or split in several (`(b, n * 3, d, h * w)`, heads)."""
    if len(args) < 3 or any(a.star or a.keyword is not None for a in args):
        return False
    last = args[-1].value
    if not isinstance(last, cst.BinaryOperation) or not isinstance(last.operator, cst.Multiply):
        return False
    sizes = [_size_of(tracer, node) for node in (args[0].value, last.left, last.right)]
    if any(size is None for size in sizes):
        return False
    shapes = {id(size[0]) for size in sizes if size is not None}
    positions = [(size[1], size[2]) for size in sizes if size is not None]
    return len(shapes) == 1 and positions == [(0, 4), (2, 4), (3, 4)]


def _size_of(tracer: TracerView, node: cst.BaseExpression) -> tuple[cst.CSTNode, int, int] | None:
    if not isinstance(node, cst.Name):
        return None
    value = tracer.env.get(node.value)
    return value.size_of if isinstance(value, ScalarVal) else None
