"""The product that starts a chain: a query times a key with its last two dims swapped.

`q @ k.transpose(-1, -2)` or `q @ b` for any `b` of the product's rank, read and at least 3 (the key `b` swapped
back: `untranspose`), `torch.matmul`, `bmm` and `baddbmm` on flattened heads (baddbmm's alpha a scale, its
input an additive term), `einsum` (4-D operands in any dimension order, handed to SDPA permuted), a key transposed
or permuted earlier or returned laid out (..., dim, length) by a method, casts around either operand (an upcast is
noted), and a number multiplying or dividing the key (a scale of the product). A key scaled by anything else is
refused S102.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import SCORES, AddTerm, ChainVal, Op, Poison, Scale, Start, short
from sdpa_port.analyse.cstutil import binary, code, primary
from sdpa_port.analyse.forms.common import SEQUENCE_FIRST, Example, scored, sdpa, strip_casts
from sdpa_port.analyse.forms.keys import telling_query, untranspose
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def query_key_product(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    """A query-key product with the key transposed: a new chain starts.

    A matmul, `@`, bmm, baddbmm or einsum.
    """
    product = tracer.scope.product(node)
    if product is None:
        return None
    if tracer.reads.chain_refs(product.left) or tracer.reads.chain_refs(product.right):
        return None
    if product.initial is not None and tracer.reads.chain_refs(product.initial):
        return None
    if not tracer.may_start(node):
        return None
    key: cst.BaseExpression | None
    key_factor: tuple[cst.BaseExpression, bool] | None = None
    unproven: cst.BaseExpression | None = None  # a factor of the key not shown to be a number
    rank = product.rank
    orders: tuple[p.Order | None, p.Order | None] = (None, None)
    layout: p.Order | None = None
    if product.form is p.ProductForm.EINSUM:
        roles = p.einsum_roles(product.spec or "", p.EinsumRole.SCORES)
        if roles is None:
            return None
        key, rank, orders, layout = product.right, roles.rank, (roles.left, roles.right), roles.scores
        if roles.shared is not None:
            return shared_key(tracer, node, product, roles, line)
        untransposed = p.transposed_last_two(key, 4) if roles.right == (0, 1, 3, 2) else None
        if untransposed is not None:
            # `einsum("bhqd,bhdk->bhqk", q, k.transpose(-1, -2))`: the key itself is in SDPA's layout
            key, orders = untransposed, (roles.left, None)
    else:
        rank = product_rank(tracer, product)
        split = key_operand(tracer, product.right, rank)
        key_factor, unproven = split.number, split.unproven
        key = untranspose(tracer, split.operand, rank, telling_query(product))
        if key is None:
            return None
    query, query_upcast = strip_casts(product.left, tracer.scope)
    key, key_upcast = strip_casts(key, tracer.scope)
    if rank is None:
        rank = tracer.ranks.rank_of(query)
    start = Start(
        product,
        p.permuted(query, orders[0]),  # an einsum's operands laid out as SDPA takes them
        p.permuted(key, orders[1]),
        rank,
        query_upcast or key_upcast,
        query_scale(tracer, query),
        bound_to_float32(tracer, query) or bound_to_float32(tracer, key),
        orders,
        (query, key) if orders != (None, None) else None,
        layout=layout,
    )
    read = p.walk_names(start.query) | p.walk_names(start.key)
    cid = tracer.chains.new_chain(start, node, line, tuple((name, tracer.assignments.get(name, 0)) for name in sorted(read)))
    ops: list[Op] = [start]
    base = ChainVal(cid, SCORES, rank)
    if key_factor is not None:
        # `q @ (k^T / s)` is `(q @ k^T) / s`: the factor scales the product, before any term
        ops.append(Scale(tracer.reads.detach(key_factor[0], cid), key_factor[1]))
    if unproven is not None:
        raise Poison(
            Code.SCALE_NOT_A_NUMBER,
            f"the key is scaled by `{short(unproven)}`, which is not provably a number",
            {cid},
        )
    if product.form is p.ProductForm.BADDBMM:
        ops.extend(baddbmm_terms(tracer, product, base, line))
    return base, ops


def shared_key(
    tracer: TracerView, node: cst.BaseExpression, product: p.Product, roles: p.EinsumRoles, line: int
) -> Recognised | None:
    """`einsum("bhid,bjd->bhij", q, k)`: one key for every head (multi-query), handed to SDPA viewed with the heads
    axis added and expanded to the query's, `k.unsqueeze(1).expand(-1, q.size(1), -1, -1)`: each head reads it."""
    assert roles.shared is not None
    left, right = product.left, product.right
    if any(strip_casts(operand, tracer.scope)[0] is not operand for operand in (left, right)):
        return None  # cast operands: what the einsum computes in is not read here
    axis = roles.left[roles.shared] if roles.left is not None else roles.shared  # the heads axis of the operand
    heads = cst.Call(cst.Attribute(primary(left), cst.Name("size")), [cst.Arg(cst.Integer(str(axis)))])
    key = p.expanded(p.permuted(right, roles.right), roles.shared, heads, 4)
    upcast = bound_to_float32(tracer, left) or bound_to_float32(tracer, right)
    orders, scale = (roles.left, roles.right), query_scale(tracer, left)
    query = p.permuted(left, roles.left)
    start = Start(product, query, key, 4, False, scale, upcast, orders, (left, right), heads=heads)
    read = sorted(p.walk_names(left) | p.walk_names(right))
    cid = tracer.chains.new_chain(start, node, line, tuple((name, tracer.assignments.get(name, 0)) for name in read))
    return ChainVal(cid, SCORES, 4), [start]


def product_rank(tracer: TracerView, product: p.Product) -> int | None:
    """The rank of a product other than an einsum: its form's (`bmm`), or that of both operands of a `matmul`.

    Before: `torch.matmul(q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2))` of (s, b * h, d) operands (Megatron's
    seq-first layout, CodeGeeX). After: a 3-D product, whose key `transpose(1, 2)` swaps the last two dimensions, read
    as `bmm` reads it. Operands of different or unknown ranks (a matmul broadcasting) give None.
    """
    if product.rank is not None:
        return product.rank
    key = key_operand(tracer, product.right, None).operand
    ranks = {tracer.ranks.rank_of(strip_casts(operand, tracer.scope)[0]) for operand in (product.left, key)}
    return ranks.pop() if len(ranks) == 1 else None


@dataclass(frozen=True)
class KeyOperand:
    """The key side of a product split from a factor multiplying or dividing it.

    The operand, and the factor as a number (with whether it divides) or, where it is not shown to be one, the factor
    itself (refused S102).
    """

    operand: cst.BaseExpression
    number: tuple[cst.BaseExpression, bool] | None = None
    unproven: cst.BaseExpression | None = None


def key_operand(tracer: TracerView, node: cst.BaseExpression, rank: int | None) -> KeyOperand:
    """The key operand of a product split from the number that scales it.

    `key.transpose(-1, -2) / scale` (or `* scale`, either side): a number scales the product; a transposed key
    multiplied or divided by anything else is kept as unproven; any other operand is returned as it is.
    """
    if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, (cst.Multiply, cst.Divide)):
        return KeyOperand(node)
    divide = isinstance(node.operator, cst.Divide)
    sides = [(node.left, node.right)] if divide else [(node.left, node.right), (node.right, node.left)]
    for operand, factor in sides:
        number = p.scalar(factor, tracer.scope)
        if number is not None and not tracer.reads.chain_refs(factor):
            return KeyOperand(operand, number=(number.node, divide))
    for operand, factor in sides:
        if untranspose(tracer, operand, rank) is not None:
            return KeyOperand(operand, unproven=factor)
    return KeyOperand(node)


def bound_to_float32(tracer: TracerView, node: cst.BaseExpression) -> bool:
    if not isinstance(node, cst.Name):
        return False
    local = tracer.scope.local_value(node.value)
    if local is None:
        return False
    _, upcast = strip_casts(local, tracer.scope)
    return upcast


def query_scale(tracer: TracerView, query: cst.BaseExpression) -> tuple[cst.BaseExpression, bool] | None:
    """Follow the query back through reshapes to a multiplication by a number, for the report."""
    node: cst.BaseExpression | None = query
    for _ in range(6):
        if node is None:
            return None
        if isinstance(node, cst.Name):
            node = tracer.scope.local_value(node.value)
            continue
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Divide)):
            for factor in (node.right, node.left):
                if p.scalar(factor, tracer.scope) is not None:
                    return factor, isinstance(node.operator, cst.Divide)
            return None
        found = p.method_call(node, p.RESHAPE_METHODS | p.CAST_METHODS | {"transpose", "permute"})
        if found is not None:
            node = found[0]
            continue
        if isinstance(node, cst.Call) and len(node.args) >= 1:
            # a reshaping helper such as `tracer._shape(q, ...)` or `shape(q)`
            node = node.args[0].value
            continue
        return None
    return None


def baddbmm_terms(tracer: TracerView, product: p.Product, base: ChainVal, line: int) -> list[Op]:
    # beta * input + alpha * (batch1 @ batch2): alpha scales the product only, so it comes before the term
    ops: list[Op] = []
    if product.alpha is not None:
        factor = p.scalar(product.alpha, tracer.scope)
        if factor is None:
            raise Poison(
                Code.SCALE_NOT_A_NUMBER, f"baddbmm's alpha `{code(product.alpha)}` is not a number", {base.cid}
            )
        ops.append(Scale(factor.node, False))
    beta = product.beta
    beta_value = p.number(beta) if beta is not None else 1.0
    initial = product.initial
    assert initial is not None
    if beta_value != 0.0 and not is_zeros(tracer, initial):
        term = initial
        if beta is not None and beta_value != 1.0:
            if p.scalar(beta, tracer.scope) is None:
                raise Poison(Code.SCALE_NOT_A_NUMBER, f"baddbmm's beta `{code(beta)}` is not a number", {base.cid})
            term = binary(beta, cst.Multiply(), initial)
        ops.append(AddTerm(term, 3))
    return ops


def is_zeros(tracer: TracerView, node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Name):
        local = tracer.scope.local_value(node.value)
        return local is not None and is_zeros(tracer, local)
    return isinstance(node, cst.Call) and tracer.scope.qualify(node.func) in p.ZEROS_FUNCTIONS


# the key's heads split by a permute that leaves it laid out (batch, heads, dim, length), ready for `query @ key`
_PERMUTED_KEY = "b, h, s, d = key.shape\nkey = key.transpose(1, 2).reshape(b, s, h, d).permute(0, 2, 3, 1)\n"

_MATMUL_MODULE = """
class MatMul(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)
"""
_MODULES_INIT = "self.matmul_qk = MatMul()\nself.matmul_av = MatMul()"
_THROUGH_MODULES = (
    "scores = self.matmul_qk(query, key.transpose(-1, -2))\nprobs = scores.softmax(-1)\n"
    "return self.matmul_av(probs, value)"
)
# the look-alikes multiply by V in the open: the eager-site detector does not follow modules, and with both products
# in modules that are no products it would find no attention at all
_THROUGH_QK_MODULE = _THROUGH_MODULES.replace("self.matmul_av(probs, value)", "probs @ value")

# a channels-first map's query and key, its positions flattened (`forms/channels.py`): the key (b, c, h * w) is laid
# out (batch, dim, length)
_MAP = "b, c, h, w = query.shape\nq = query.reshape(b, c, h * w).permute(0, 2, 1)\nk = key.reshape(b, c, h * w)\n"
_MAP_BODY = "scores = torch.bmm(q, k)\nprobs = scores.softmax(-1)\nreturn torch.bmm(probs, value)"

# in a matmul, where only the key's own layout says it is channels-first
_MAP_MATMUL_BODY = _MAP_BODY.replace("torch.bmm(q, k)", "torch.matmul(q, k)")
# a non-local block: every operand channels-first (batch, dim, length), the query transposed inside the product
_NONLOCAL = (
    "scores = torch.bmm(query.permute(0, 2, 1).contiguous(), key)\nprobs = scores.softmax(-1)\n"
    "return torch.bmm(value, probs.transpose(1, 2))"
)

# the same with heads: a fused projection viewed (b, heads * 3, head_dim, positions), chunked along the heads
_HEADS_MAP = "b, c, h, w, n, d = *query.size(), 2, 4\nq, k, v = query.view(b, n * 3, d, h * w).chunk(3, dim=1)\n"
_HEADS_MAP_BODY = (
    "scores = torch.matmul(q.transpose(-1, -2), k)\nprobs = scores.softmax(-1)\n"
    "return torch.matmul(v, probs.transpose(-1, -2))"
)

# heads split by methods whose returns tell the rank: the sides of a conditional permute, a view of a tuple written out
_SPLIT = """
def split(self, x, is_key=False):
    x = x.reshape(x.size(0), x.size(1), 4, -1)
    x = x.permute(0, 2, 3, 1) if is_key else x.permute(0, 2, 1, 3)
    return x
"""
_SPLIT_BODY = "q = self.split(query)\nk = self.split(key, is_key=True)\n"
_VIEWED = """
def heads(self, x):
    shape = (x.size(0), 4, -1, x.size(-1))
    return x.view(*shape)
"""
_VIEWED_BODY = "q = self.heads(query).permute(0, 1, 3, 2)\nk = self.heads(key)\n"
_PLAIN_BODY = "scores = q @ k\nprobs = scores.softmax(-1)\nreturn probs @ value"
# a key's rank read through a concatenation (any part that tells it) and through the paths that bind it
_CAT = "q = query.view(2, 4, -1, 8)\nk = torch.cat((self.cache, key.view(2, 4, 8, -1)), dim=-1)\n"
_PATHS = (
    "q = query.view(2, 4, -1, 8)\nif attention_mask is None:\n    k = key.view(2, 4, 8, -1)\nelse:\n"
    "    k = key.reshape(2, 4, 8, -1)\n"
)

EXAMPLES = {
    "query_key_product": (
        Example(
            _SPLIT_BODY + _PLAIN_BODY,
            Start,
            methods=_SPLIT,
            becomes=_SPLIT_BODY + "return " + sdpa("scale=1.0", operands="q, k.transpose(-1, -2), value"),
        ),
        Example(
            _VIEWED_BODY + _PLAIN_BODY,
            Start,
            methods=_VIEWED,
            becomes=_VIEWED_BODY + "return " + sdpa("scale=1.0", operands="q, k.transpose(-1, -2), value"),
        ),
        Example(
            _CAT + _PLAIN_BODY,
            Start,
            init="self.cache = config.cache",
            becomes=_CAT + "return " + sdpa("scale=1.0", operands="q, k.transpose(-1, -2), value"),
        ),
        Example(
            _PATHS + _PLAIN_BODY,
            Start,
            becomes=_PATHS + "return " + sdpa("scale=1.0", operands="q, k.transpose(-1, -2), value"),
        ),
        # no part, or not every path, telling the rank
        Example(
            _CAT.replace("key.view(2, 4, 8, -1)", "key") + _PLAIN_BODY,
            refused=Code.UNKNOWN_PRODUCT,
            init="self.cache = config.cache",
        ),
        Example(_PATHS.replace("key.reshape(2, 4, 8, -1)", "key") + _PLAIN_BODY, refused=Code.UNKNOWN_PRODUCT),
        # sides of other ranks, a shape not written out: the key's rank, so the product's, cannot be read
        Example(
            _SPLIT_BODY + _PLAIN_BODY,
            refused=Code.UNKNOWN_PRODUCT,
            methods=_SPLIT.replace("x.permute(0, 2, 1, 3)", "x.flatten(2)"),
        ),
        Example(
            _VIEWED_BODY + _PLAIN_BODY,
            refused=Code.UNKNOWN_PRODUCT,
            methods=_VIEWED.replace("(x.size(0), 4, -1, x.size(-1))", "x.shape"),
        ),
        Example(
            _MAP + _MAP_BODY,
            Start,
            becomes=_MAP + "return " + sdpa("scale=1.0", operands="q, k.transpose(-1, -2), value"),
        ),
        Example(
            _HEADS_MAP + _HEADS_MAP_BODY,
            Start,
            becomes=_HEADS_MAP
            + "return "
            + sdpa("scale=1.0", operands="q.transpose(-1, -2), k.transpose(-1, -2), v.transpose(2, 3)")
            + ".transpose(2, 3)",
        ),
        # chunked along the features, the chunks' layout is not the map's: the key is `k` transposed all the same
        Example(
            _HEADS_MAP.replace("view(b, n * 3, d, h * w).chunk(3, dim=1)", "view(b, n, d * 3, h * w).chunk(3, dim=2)")
            + _HEADS_MAP_BODY,
            Start,
            becomes=_HEADS_MAP.replace(
                "view(b, n * 3, d, h * w).chunk(3, dim=1)", "view(b, n, d * 3, h * w).chunk(3, dim=2)"
            )
            + "return "
            + sdpa("scale=1.0", operands="q.transpose(-1, -2), k.transpose(-1, -2), v.transpose(2, 3)")
            + ".transpose(2, 3)",
        ),
        # any right operand of a product of known rank (3 here, both operands'), laid out as it may be: SDPA gets it
        # with its last two dims swapped
        Example(
            _MAP.replace("key.reshape(b, c, h * w)", "key.reshape(b, h * w, c)") + _MAP_MATMUL_BODY,
            Start,
            becomes=_MAP.replace("key.reshape(b, c, h * w)", "key.reshape(b, h * w, c)")
            + "return "
            + sdpa("scale=1.0", operands="q, k.transpose(-1, -2), value"),
        ),
        # a right operand of unknown rank (a parameter as passed), or of a rank other than the query's (a 2-D weight,
        # which matmul broadcasts): what the product is cannot be told
        Example(
            _MAP.replace("k = key.reshape(b, c, h * w)\n", "") + _MAP_MATMUL_BODY.replace("(q, k)", "(q, key)"),
            refused=Code.UNKNOWN_PRODUCT,
        ),
        Example(
            _MAP + _MAP_MATMUL_BODY.replace("(q, k)", "(q, self.weight)"),
            refused=Code.UNKNOWN_PRODUCT,
            init="self.weight = nn.Parameter(torch.zeros(8, 8))",
        ),
        # a non-local block's: the query transposed from channels-first inside the bmm, so the key, whatever made it,
        # is channels-first too (`forms/channels.py`); the value on the left of the transposed probabilities
        Example(
            _NONLOCAL,
            Start,
            becomes="return "
            + sdpa("scale=1.0", operands="query.permute(0, 2, 1), key.transpose(-1, -2), value.transpose(1, 2)")
            + ".transpose(1, 2)",
        ),
        # the transpose bound to a name first, as a statement of its own
        Example(
            "q = query.transpose(1, 2)\n" + _NONLOCAL.replace("query.permute(0, 2, 1).contiguous()", "q"),
            Start,
            becomes="q = query.transpose(1, 2)\nreturn "
            + sdpa("scale=1.0", operands="q, key.transpose(-1, -2), value.transpose(1, 2)")
            + ".transpose(1, 2)",
        ),
        # a permute of other axes: the key is the bmm's right operand transposed all the same
        Example(
            _NONLOCAL.replace("permute(0, 2, 1)", "permute(1, 0, 2)"),
            Start,
            becomes="return "
            + sdpa("scale=1.0", operands="query.permute(1, 0, 2), key.transpose(-1, -2), value.transpose(1, 2)")
            + ".transpose(1, 2)",
        ),
        # a matmul says nothing of the rank of a parameter (F601: the tool reads no chain, the eager sites see one)
        Example(_NONLOCAL.replace("torch.bmm(query", "torch.matmul(query"), refused=Code.UNRECOGNISED),
        Example(scored("probs = scores.softmax(-1)"), Start, becomes=sdpa("scale=1.0")),
        Example(
            "scores = torch.einsum('bhqd,bhkd->bhqk', query, key)\nprobs = scores.softmax(-1)\nreturn probs @ value",
            Start,
            becomes=sdpa("scale=1.0"),
        ),
        Example(
            "scores = query @ key.permute(0, 1, 3, 2)\nprobs = scores.softmax(-1)\nreturn probs @ value",
            Start,
            becomes=sdpa("scale=1.0"),
        ),
        # 4-D einsum operands in any dimension order: SDPA gets them laid out (batch, heads, length, dim)
        Example(
            "scores = torch.einsum('ibnd,jbnd->bnij', query, key)\nprobs = scores.softmax(-1)\n"
            "return torch.einsum('bnij,jbnd->ibnd', probs, value)",
            Start,
            becomes=SEQUENCE_FIRST,
        ),
        # scores laid out (batch, heads, key, query): a softmax over dimension 2 runs over the keys, the last one
        # over the queries
        Example(
            "scores = torch.einsum('bhqd,bhkd->bhkq', query, key)\nprobs = scores.softmax(2)\n"
            "return torch.einsum('bhkq,bhkd->bhqd', probs, value)",
            Start,
            becomes=sdpa("scale=1.0"),  # SDPA's own layout: the einsums only name the dimensions otherwise
        ),
        Example(
            "scores = torch.einsum('bhqd,bhkd->bhkq', query, key)\nprobs = scores.softmax(-1)\n"
            "return torch.einsum('bhkq,bhkd->bhqd', probs, value)",
            refused=Code.SOFTMAX_DIM,
        ),
        # a key and a value shared by every head (multi-query): each expanded to the query's heads
        Example(
            "k, v = key.mean(1), value.mean(1)\nscores = torch.einsum('bhqd,bkd->bhqk', query, k)\n"
            "probs = scores.softmax(-1)\nreturn torch.einsum('bhqk,bkd->bhqd', probs, v)",
            Start,
            becomes="sdpa_key = k.unsqueeze(1).expand(-1, query.size(1), -1, -1)\nreturn "
            + sdpa("scale=1.0", operands="query, sdpa_key, v.unsqueeze(1).expand(-1, query.size(1), -1, -1)"),
        ),
        # a shared key laid out (length, batch, dim), the scores (heads, batch, query, key)
        Example(
            "k = key.mean(1).transpose(0, 1)\nscores = torch.einsum('hbqd,kbd->hbqk', query, k)\n"
            "probs = scores.softmax(-1)\nreturn torch.einsum('hbqk,hbkd->hbqd', probs, value)",
            Start,
            becomes="sdpa_key = k.transpose(0, 1).unsqueeze(0).expand(query.size(0), -1, -1, -1)\nreturn "
            + sdpa("scale=1.0", operands="query, sdpa_key, value"),
        ),
        # the value shared, the key not: the tool reads both shared or neither
        Example(
            "v = value.mean(1)\nscores = torch.einsum('bhqd,bhkd->bhqk', query, key)\n"
            "probs = scores.softmax(-1)\nreturn torch.einsum('bhqk,bkd->bhqd', probs, v)",
            refused=Code.LAYOUT,
        ),
        # a key divided by a number scales the product
        Example(
            "scores = query @ (key.transpose(-1, -2) / 8.0)\nprobs = scores.softmax(-1)\nreturn probs @ value",
            Scale,
            becomes=sdpa("scale=1.0 / 8.0"),
        ),
        # a key scaled by a learned tensor (one value per key) is no scale SDPA can take
        Example(
            "scores = query @ (key.transpose(-1, -2) * self.temperature)\n"
            "probs = scores.softmax(-1)\nreturn probs @ value",
            refused=Code.SCALE_NOT_A_NUMBER,
        ),
        # the product as a method of the query
        Example(
            "scores = query.matmul(key.transpose(-1, -2))\nprobs = scores.softmax(-1)\nreturn probs.matmul(value)",
            Start,
            becomes=sdpa("scale=1.0"),
        ),
        # a key laid out (batch, heads, dim, length) by the permute that splits its heads: SDPA gets it transposed back
        Example(
            _PERMUTED_KEY + "scores = query @ key\nprobs = scores.softmax(-1)\nreturn probs @ value",
            Start,
            becomes=_PERMUTED_KEY + "return " + sdpa("scale=1.0", operands="query, key.transpose(-1, -2), value"),
        ),
        # products through modules of the file that only multiply (`analyse/product_modules.py`)
        Example(
            _THROUGH_MODULES, Start, init=_MODULES_INIT, module=_MATMUL_MODULE, becomes=sdpa("scale=1.0")
        ),
        Example(
            _PERMUTED_KEY + "scores = self.matmul_qk(query, key)\nprobs = scores.softmax(-1)\n"
            "return self.matmul_av(probs, value)",
            Start,
            init=_MODULES_INIT,
            module=_MATMUL_MODULE.replace("torch.matmul(a, b)", "a @ b"),
            becomes=_PERMUTED_KEY + "return " + sdpa("scale=1.0", operands="query, key.transpose(-1, -2), value"),
        ),
        # a module that scales what it multiplies, or casts it, is not a product
        Example(
            _THROUGH_QK_MODULE,
            refused=Code.UNKNOWN_PRODUCT,
            init=_MODULES_INIT,
            module=_MATMUL_MODULE.replace("torch.matmul(a, b)", "torch.matmul(a, b) / 8.0"),
        ),
        Example(
            _THROUGH_QK_MODULE,
            refused=Code.UNKNOWN_PRODUCT,
            init=_MODULES_INIT,
            module=_MATMUL_MODULE.replace("torch.matmul(a, b)", "torch.matmul(a.float(), b)"),
        ),
        # a module of a class from elsewhere may compute anything
        Example(
            _THROUGH_QK_MODULE, refused=Code.UNKNOWN_PRODUCT, init=_MODULES_INIT, module="from .quant import MatMul\n"
        ),
        # a key whose layout cannot be told: `key` may be (..., length, dim) as passed
        Example(
            _THROUGH_QK_MODULE.replace("key.transpose(-1, -2)", "key"),
            refused=Code.UNKNOWN_PRODUCT,
            init=_MODULES_INIT,
            module=_MATMUL_MODULE,
        ),
    ),
}
