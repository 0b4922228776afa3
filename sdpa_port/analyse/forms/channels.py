"""A key laid out (batch, dim, length) as a channels-first feature map with its positions flattened.

Convolutional attention blocks (Stable Diffusion's VAE `AttnBlock`) unpack a map's whole shape, `b, c, h, w =
q.shape`, and flatten the positions of each projection: `k.reshape(b, c, h * w)` holds the channels, the features,
second to last, so `torch.bmm(q, k)` is `q @ k^T` for the key `k.transpose(-1, -2)`. Multi-head blocks split the
channels between the batch and the positions (`qkv.view(b, n * 3, d, h * w)`, then `chunk(3, dim=1)`). The batch
and the positions must be sizes of one unpacking of a whole shape (`b, c, h, w = x.shape`, or `*x.size()` with
more after it), the batch first, the positions last, height times width: `k.reshape(b, h * w, c)`, or sizes of two
unpackings, say nothing of where the channels are.

Non-local blocks (SAGAN, BigGAN) keep every projection channels-first, `(batch, dim, length)`, and transpose the
query inside the product: in `torch.bmm(f.permute(0, 2, 1), g)` the left operand is a channels-first map transposed
to `(batch, length, dim)`, so the right one, whose dimension 1 the product pairs with its channels, is channels-first
too: a key laid out `(batch, dim, length)`, handed to SDPA as `g.transpose(-1, -2)`. The transpose is read where it
is written, in the product or by a name bound to one on every path, as a statement of its own is. Only `bmm` says
the rank (3, both operands); a permute of other axes (`f.permute(1, 0, 2)`) says nothing of the channels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import ScalarVal
from sdpa_port.analyse.forms.common import strip_casts

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


def transposed_query(tracer: TracerView, node: cst.BaseExpression, depth: int = 0) -> bool:
    """`node`, a 3-D operand, is a channels-first map with its last two dimensions swapped.

    `f.permute(0, 2, 1)`, `f.transpose(1, 2)`, `f.transpose(-1, -2)`, with casts around it (`.contiguous()`), or a
    name that holds one on every path."""
    if depth > 6:
        return False
    node, _ = strip_casts(node, tracer.scope)
    if p.transposed_last_two(node, 3) is not None:
        return True
    if isinstance(node, cst.Name):
        values = tracer.scope.local_values(node.value)
        return bool(values) and all(transposed_query(tracer, v, depth + 1) for v in values)
    return False
