"""Scales and head masks: the scores scaled by a number or a per-query factor, the probabilities by a head mask.

The number is a literal, `math.sqrt(d)`, a config value, an attribute or buffer that holds one (every binding of it a
number, read in its method: `patterns.scalars.MethodScope`), a function of the file returning one; the factor a
tensor the same for every key (a learnt number among them: SDPA's `scale=` takes no tensor that needs a gradient);
the head mask applied under its `... is not None` guard. A scale undone right after (`(x / a - shift) * a`) cancels.
Scaling by anything else is refused S102; the probabilities rescaled otherwise, S106; the scores multiplied by
themselves or dividing something, S103.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import PROBS, SCORES, Cast, ChainVal, HeadMask, Op, Poison, Scale, Shift, View, short
from sdpa_port.analyse.forms.common import GAP, Example, scored, sdpa
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def scaled(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, (cst.Multiply, cst.Divide)):
        return None
    left_refs, right_refs = tracer.chain_or_start(node.left), tracer.chain_or_start(node.right)
    if not left_refs and not right_refs:
        return None
    if left_refs and right_refs:
        if any(tracer.reads.stage_of(cid) != SCORES for cid in left_refs | right_refs if cid >= 0):
            raise Poison(
                Code.PROBABILITIES_CHANGED,
                f"the probabilities are rescaled by themselves in `{short(node)}`",
                left_refs | right_refs,
            )
        raise Poison(Code.SCORES_COMBINED, "the scores are multiplied by themselves", left_refs | right_refs)
    divide = isinstance(node.operator, cst.Divide)
    if right_refs and divide:
        raise Poison(Code.SCORES_COMBINED, "the scores are a divisor", right_refs)
    chain_side, other = (node.left, node.right) if left_refs else (node.right, node.left)
    base, ops = tracer.decompose(chain_side, line)
    current = tracer.chains.advance(base, ops)
    return base, cancelled(ops, scale_or_head_mask(tracer, current, other, divide, line))


def scale_or_head_mask(tracer: TracerView, current: ChainVal, factor: cst.BaseExpression, divide: bool, line: int) -> Op:
    if current.stage == SCORES:
        scalar = p.scalar(factor, tracer.scope)
        if scalar is None:
            if not tracer.reads.chain_value_refs(factor) and p.constant_along_last(factor, tracer.scope):
                return Scale(tracer.reads.detach(factor, current.cid), divide, per_query=True)
            raise Poison(
                Code.SCALE_NOT_A_NUMBER,
                f"the scores are scaled by `{short(factor)}`, which is not provably a number nor a tensor the same "
                "for every key",
                {current.cid},
            )
        return Scale(tracer.reads.detach(scalar.node, current.cid), divide)
    if current.stage == PROBS and not divide:
        root = _root_param(factor, tracer.params)
        guarded = root is not None and any(_tests_not_none(test, root) for test in tracer.tests)
        if not guarded:
            raise Poison(
                Code.PROBABILITIES_CHANGED,
                f"the probabilities are multiplied by `{short(factor)}` outside a `... is not None` head-mask guard",
                {current.cid},
            )
        return HeadMask(factor, root)
    raise Poison(Code.PROBABILITIES_CHANGED, "the probabilities are rescaled after the softmax", {current.cid})


def _root_param(node: cst.BaseExpression, params: tuple[str, ...]) -> str | None:
    names = [n for n in p.walk_names(node) if n in params]
    return names[0] if len(names) == 1 else None


def _tests_not_none(test: cst.BaseExpression, name: str) -> bool:
    """`name is not None`, possibly inside an `and`."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _tests_not_none(test.left, name) or _tests_not_none(test.right, name)
    return m.matches(
        test,
        m.Comparison(
            left=m.Name(name), comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))]
        ),
    )


def cancelled(ops: list[Op], op: Op) -> list[Op]:
    """The operations `ops` then `op`, where a scale undoing the last one removes both.

    `(x / a - shift) * a`, CogView's PB-Relax: views, casts and shifts between them commute with scaling.
    """
    if isinstance(op, Scale) and not op.per_query:
        for index in range(len(ops) - 1, -1, -1):
            earlier = ops[index]
            if isinstance(earlier, (Shift, Cast, View)):
                continue
            if (
                isinstance(earlier, Scale)
                and not earlier.per_query
                and earlier.divide != op.divide
                and earlier.factor.deep_equals(op.factor)
            ):
                return [*ops[:index], *ops[index + 1 :]]
            break
    return [*ops, op]


SCALED_BY_ATTRIBUTE = scored("scores = scores * self.scale\nprobs = scores.softmax(-1)")

EXAMPLES = {
    "scaled": (
        Example(
            scored("scores = scores / math.sqrt(query.size(-1))\nprobs = scores.softmax(-1)"),
            Scale,
            becomes=sdpa("scale=1.0 / math.sqrt(query.size(-1))"),
        ),
        Example(
            scored("scores = scores * self.scaling\nprobs = scores.softmax(-1)"), Scale, becomes=sdpa("scale=self.scaling")
        ),
        Example(
            scored(
                "probs = self.dropout(scores.softmax(-1))\nif head_mask is not None:\n    probs = probs * head_mask"
            ),
            HeadMask,
            # a head mask given: the eager computation
            becomes=f"if output_attentions or head_mask is not None:{GAP}"
            + sdpa("dropout_p=self.dropout.p if self.training else 0.0", "scale=1.0"),
        ),
        # numbers `__init__` builds from the constructor's parameters: `dim`, given to a layer as a size, is an integer;
        # `qk_scale`, defaulting to None, is a number or None, behind `or` a number
        Example(
            SCALED_BY_ATTRIBUTE,
            Scale,
            becomes=sdpa("scale=self.scale"),
            init="head_dim = dim // num_heads\nself.scale = qk_scale or head_dim ** -0.5\nself.qkv = nn.Linear(dim, dim * 3)",
            init_params="dim, num_heads=8, qk_scale=None",
        ),
        Example(
            SCALED_BY_ATTRIBUTE,
            Scale,
            becomes=sdpa("scale=self.scale"),
            init="self.head_dim = dim // num_heads\nself.scale = self.head_dim ** -0.5",
            init_params="dim: int, num_heads: int = 8",
        ),
        # every binding in `__init__` a number, whichever runs
        Example(
            SCALED_BY_ATTRIBUTE,
            Scale,
            becomes=sdpa("scale=self.scale"),
            init="if config.qk_norm:\n    self.scale = 1.0\nelse:\n    self.scale = config.head_dim ** -0.5",
        ),
        Example(
            scored("scores = scores / self.norm_factor\nprobs = scores.softmax(-1)"),
            Scale,
            becomes=sdpa("scale=1.0 / self.norm_factor"),
            init="self.norm_factor = math.sqrt(config.head_dim)",
        ),
        # a buffer of one number: SDPA's `scale=` takes a 0-d tensor that needs no gradient as the float it holds
        Example(
            SCALED_BY_ATTRIBUTE,
            Scale,
            becomes=sdpa("scale=self.scale"),
            init='self.register_buffer("scale", torch.tensor(config.head_dim ** -0.5), persistent=False)',
        ),
        # a learnt number, or a tensor per head, is no `scale=`: it scales the query, as it scales every key alike
        Example(
            SCALED_BY_ATTRIBUTE,
            Scale,
            becomes="sdpa_query = query * self.scale" + GAP + sdpa("scale=1.0", operands="sdpa_query, key, value"),
            init="self.scale = nn.Parameter(torch.tensor(config.head_dim ** -0.5))",
        ),
        Example(
            SCALED_BY_ATTRIBUTE,
            Scale,
            becomes="sdpa_query = query * self.scale" + GAP + sdpa("scale=1.0", operands="sdpa_query, key, value"),
            init="per_head = torch.ones(config.num_heads, 1, 1)\nself.scale = per_head",
        ),
        Example(
            scored("scores = scores * self.temperature\nprobs = scores.softmax(-1)"), refused=Code.SCALE_NOT_A_NUMBER
        ),
        # bound again outside `__init__`, to what a caller passes
        Example(
            SCALED_BY_ATTRIBUTE,
            refused=Code.SCALE_NOT_A_NUMBER,
            init="self.scale = config.head_dim ** -0.5",
            methods="def set_scale(self, scale):\n    self.scale = scale",
        ),
        Example(
            SCALED_BY_ATTRIBUTE,
            refused=Code.SCALE_NOT_A_NUMBER,
            init="self.scale = config.head_dim ** -0.5",
            methods="def sharpen(self, factor):\n    self.scale *= factor",
        ),
        # a parameter nothing declares a number: `scale ** -0.5` of a tensor is a tensor
        Example(
            SCALED_BY_ATTRIBUTE, refused=Code.SCALE_NOT_A_NUMBER, init="self.scale = scale ** -0.5", init_params="scale"
        ),
        Example(
            SCALED_BY_ATTRIBUTE,
            refused=Code.SCALE_NOT_A_NUMBER,
            init="self.scale = qk_scale or config.head_dim ** -0.5",
            init_params="qk_scale: torch.Tensor | None = None",
        ),
        # a tensor of a shape not known to be 1 along the keys
        Example(
            SCALED_BY_ATTRIBUTE,
            refused=Code.SCALE_NOT_A_NUMBER,
            init="self.scale = nn.Parameter(torch.randn(size))",
            init_params="size=8",
        ),
        # a factor each call passes
        Example(
            "return self.attend(query, key, value, scale=0.5)",
            refused=Code.SCALE_NOT_A_NUMBER,
            methods=(
                "def attend(self, query, key, value, **kwargs):\n"
                "    scores = torch.matmul(query, key.transpose(-1, -2)) * kwargs.get('scale')\n"
                "    return torch.matmul(scores.softmax(-1), value)"
            ),
        ),

        Example(scored("probs = scores.softmax(-1) * head_mask"), refused=Code.PROBABILITIES_CHANGED),  # no guard
        Example(scored("probs = (scores * scores).softmax(-1)"), refused=Code.SCORES_COMBINED),
    ),
}
