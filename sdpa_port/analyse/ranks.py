"""How many dimensions a tensor of the traced function has, where its text tells.

`Ranks` reads the rank of an expression from what made it: a reshape or a permute with its sizes written out, an
index, a scale by a number, a tensor `__init__` creates, a method's returns, or the rank a caller passes a helper's
parameter. The tracer holds one (`tracer.ranks`) and the recognisers of `forms/` ask it.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.cstutil import assigned_values, nodes_of_type
from sdpa_port.analyse.scope import FunctionScope


class Ranks:
    """The ranks of the tensors of one function, read from its text and what its caller passes."""

    def __init__(
        self,
        scope: FunctionScope,
        function: cst.FunctionDef,
        param_ranks: tuple[tuple[str, int], ...],
        assignments: dict[str, int],
    ) -> None:
        self.scope = scope
        # the rank of what the caller passes to a parameter (a helper's `query`, 4-D where forward built it so); a
        # parameter also bound otherwise than by `name = value`, by a `for` or tuple unpacking, has none
        rebound = (
            {name for name, values in assigned_values([function.body]).items() if None in values} if param_ranks else set()
        )
        self.param_ranks = {name: rank for name, rank in param_ranks if name not in rebound}
        self.assignments = assignments  # the tracer's count of each name's assignments so far, shared with it
        self._ranking: set[str] = set()  # names whose rank is being read (`x = x * s` reads the x before)
        # per method read by `rank_in_method`: the method, and the values assigned to each name in it
        self._assigned: dict[int, tuple[cst.FunctionDef, dict[str, list[cst.BaseExpression | None]]]] = {}

    def view_rank(self, args: Sequence[cst.Arg]) -> int | None:
        if len(args) == 1:  # `view(shape)` or `view(*shape)`
            return self.tuple_length(args[0].value)
        if any(a.star for a in args):
            return None
        return len(args)

    def view_shape(self, args: Sequence[cst.Arg]) -> tuple[cst.BaseExpression, ...] | None:
        """The sizes of `view(a, b, ...)` or `view((a, b, ...))`.

        None when starred or not written out.
        """
        if any(a.star or a.keyword is not None for a in args):
            return None
        if len(args) == 1:
            node = args[0].value
            if isinstance(node, cst.Name):
                node = self.scope.local_value(node.value) or node
            if isinstance(node, (cst.Tuple, cst.List)) and not any(isinstance(e, cst.StarredElement) for e in node.elements):
                return tuple(e.value for e in node.elements)
            return None
        return tuple(a.value for a in args)

    def tuple_length(self, node: cst.BaseExpression) -> int | None:
        if isinstance(node, (cst.Tuple, cst.List)):
            if any(isinstance(e, cst.StarredElement) for e in node.elements):
                return None
            return len(node.elements)
        if isinstance(node, cst.Name):
            local = self.scope.local_value(node.value)
            if local is not None:
                return self.tuple_length(local)
        return None

    def tuple_heads(self, args: Sequence[cst.Arg]) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        if len(args) != 1:
            return None
        node = args[0].value
        if isinstance(node, cst.Name):
            node = self.scope.local_value(node.value) or node
        if isinstance(node, (cst.Tuple, cst.List)) and len(node.elements) == 4:
            return node.elements[0].value, node.elements[1].value
        return None

    def rank_of(self, node: cst.BaseExpression, depth: int = 0) -> int | None:
        if depth > 6:
            return None
        if isinstance(node, cst.Name):
            name = node.value
            values = self.scope.local_values(name)  # its one value, or each its paths assign (`if`/`else`)
            if name in self._ranking or not values:
                return self.parameter_rank(name, self_read=name in self._ranking)
            self._ranking.add(name)
            try:
                ranks = {self.rank_of(value, depth + 1) for value in values}
            finally:
                self._ranking.discard(name)
            return ranks.pop() if len(ranks) == 1 else None
        reshaped = p.reshape_args(node)
        if reshaped is not None:
            return self.view_rank(reshaped[1])
        found = p.method_call(node, p.CAST_METHODS | {"transpose", "contiguous"})
        if found is not None:
            return self.rank_of(found[0], depth + 1)
        found = p.method_call(node, {"permute"})
        if found is not None:
            assert isinstance(node, cst.Call)
            return len(node.args) if all(not a.star for a in node.args) else None
        chunked = p.method_call(node.value, {"chunk"}) if isinstance(node, cst.Subscript) else None
        if chunked is not None:
            # `x.chunk(3, dim=1)[0]`: an item of the tuple of chunks, of `x`'s rank
            return self.rank_of(chunked[0], depth + 1)
        if isinstance(node, cst.Subscript) and all(_basic_index(element.slice) is not None for element in node.slice):
            # `x[0]` drops the first dimension, `x[:, :, :n]` keeps every one
            inner = self.rank_of(node.value, depth + 1)
            if inner is None or len(node.slice) > inner:
                return None
            return inner - sum(_basic_index(element.slice) == "integer" for element in node.slice)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Divide)):
            # a tensor scaled by a number keeps its rank
            for tensor, other in ((node.left, node.right), (node.right, node.left)):
                if p.scalar(other, self.scope) is not None:
                    return self.rank_of(tensor, depth + 1)
            return None
        if isinstance(node, cst.Call) and self.scope.qualify(node.func) == "torch.arange":
            return 1
        if isinstance(node, cst.Call) and self.scope.qualify(node.func) in p.CAT_FUNCTIONS:
            # `torch.cat((past, key), dim=-1)`: its parts share one rank, read from any of them
            parts = p.arg(node, 0, "tensors")
            if not isinstance(parts, (cst.Tuple, cst.List)):
                return None
            ranks = {self.rank_of(e.value, depth + 1) for e in parts.elements if isinstance(e, cst.Element)} - {None}
            return ranks.pop() if len(ranks) == 1 else None
        if m.matches(node, m.Attribute(value=m.Name("self"))) and self.scope.class_name is not None:
            assert isinstance(node, cst.Attribute)
            values = self.scope.facts.find_attribute_values(self.scope.class_name, node.attr.value)
            ranks = {self.created_rank(value) for value in values}
            return ranks.pop() if len(ranks) == 1 else None
        if isinstance(node, cst.Call) and self.scope.qualify(node.func) in p.EINSUM_FUNCTIONS:
            spec = p.einsum_spec(node)  # `einsum("ibnd,jnd->ijbn", ...)`: one dimension per output label
            return len(spec.split("->")[1]) if spec is not None and "->" in spec and "." not in spec else None
        if isinstance(node, cst.Call) and self.scope.qualify(node.func) in p.SHAPE_KEEPING_FUNCTIONS:
            operand = p.arg(node, 0, "input")  # `normalize(q, dim=-1)` (cosine attention) keeps q's shape
            return None if operand is None else self.rank_of(operand, depth + 1)
        return self.rank_returned(node, depth)

    def created_rank(self, node: cst.BaseExpression) -> int | None:
        """The rank of a tensor `__init__` creates with its sizes written out.

        `nn.Parameter(torch.randn(1, heads))`, `torch.zeros(n, d)`, `torch.FloatTensor(n, d)`, `torch.ones((n, d))`,
        `torch.zeros(8)`; None for anything else (one argument other than a literal may hold a shape:
        `torch.zeros(config.shape)`).
        """
        if isinstance(node, cst.Call) and self.scope.qualify(node.func) == "torch.nn.Parameter" and node.args:
            return self.created_rank(node.args[0].value)
        if not isinstance(node, cst.Call) or self.scope.qualify(node.func) not in p.SIZED_FACTORIES:
            return None
        sizes = [a for a in node.args if a.keyword is None]
        if any(a.star for a in sizes) or not sizes:
            return None
        if len(sizes) == 1 and isinstance(sizes[0].value, (cst.Tuple, cst.List)):
            elements = sizes[0].value.elements
            return None if any(isinstance(e, cst.StarredElement) for e in elements) else len(elements)
        if len(sizes) == 1 and not isinstance(sizes[0].value, cst.Integer):
            return None  # `torch.zeros(shape)`, `torch.Tensor(data)`: one argument may be a shape (or data)
        if len(sizes) > 1 and any(isinstance(a.value, (cst.Tuple, cst.List)) for a in sizes):
            return None
        return len(sizes)

    def parameter_rank(self, name: str, self_read: bool) -> int | None:
        """The rank the caller passes to parameter `name`, where it still holds that value.

        It does when never assigned so far, or when read (`self_read`) inside its one assignment so far, `x = x * s`,
        whose rank the caller's decides.
        """
        return self.param_ranks.get(name) if self.assignments.get(name, 0) == (1 if self_read else 0) else None

    def rank_returned(self, node: cst.BaseExpression, depth: int) -> int | None:
        """The rank every `return` of the method a call `self.split(x)` calls gives.

        Read from its last reshape or permute (`transpose_for_scores`); None when the returns disagree or one cannot be
        read.
        """
        if not (
            isinstance(node, cst.Call)
            and m.matches(node.func, m.Attribute(value=m.Name("self")))
            and self.scope.class_name is not None
        ):
            return None
        assert isinstance(node.func, cst.Attribute)
        found = self.scope.facts.find_method(self.scope.class_name, node.func.attr.value)
        if found is None:
            return None
        values = [r.value for r in nodes_of_type(found[1].body, cst.Return)]
        ranks = {self.rank_in_method(value, found[1], depth + 1) if value is not None else None for value in values}
        return ranks.pop() if len(ranks) == 1 else None

    def rank_in_method(self, node: cst.BaseExpression, method: cst.FunctionDef, depth: int) -> int | None:
        if depth > 6:
            return None
        reshaped = p.reshape_args(node)
        if reshaped is not None:  # sizes written out only: the names of this function are not the method's
            sizes = reshaped[1]
            if len(sizes) == 1:  # `x.view(*shape)` of a tuple the method writes out
                return self.tuple_in_method(sizes[0].value, method)
            return len(sizes) if len(sizes) > 1 and not any(a.star for a in sizes) else None
        found = p.method_call(node, {"permute"})
        if found is not None:
            assert isinstance(node, cst.Call)
            return len(node.args) if all(not a.star for a in node.args) else None
        found = p.method_call(node, p.CAST_METHODS | {"transpose", "contiguous"})
        if found is not None:
            return self.rank_in_method(found[0], method, depth + 1)
        if isinstance(node, cst.IfExp):  # `x.permute(0, 2, 3, 1) if is_key else x.permute(0, 2, 1, 3)`: both sides'
            ranks = {self.rank_in_method(side, method, depth + 1) for side in (node.body, node.orelse)}
            return ranks.pop() if len(ranks) == 1 else None
        if isinstance(node, cst.Name):
            # `key = torch.cat((past, key), dim=-1)` keeps the rank of the key before it: a binding of its own
            assigned = [v for v in self.assigned_in(method).get(node.value, []) if not self.extends(v, node.value)]
            ranks = {None if value is None else self.rank_in_method(value, method, depth + 1) for value in assigned}
            return ranks.pop() if len(ranks) == 1 else None
        return None

    def extends(self, node: cst.BaseExpression | None, name: str) -> bool:
        """`torch.cat((..., name, ...), dim)`: a concatenation with `name` among its parts, of `name`'s rank."""
        if not isinstance(node, cst.Call) or self.scope.qualify(node.func) not in p.CAT_FUNCTIONS:
            return False
        parts = p.arg(node, 0, "tensors")
        return isinstance(parts, (cst.Tuple, cst.List)) and any(
            isinstance(e, cst.Element) and m.matches(e.value, m.Name(name)) for e in parts.elements
        )

    def tuple_in_method(self, node: cst.BaseExpression, method: cst.FunctionDef) -> int | None:
        """The length of a tuple or list written out, or of the one a name of `method` is bound to once."""
        if isinstance(node, cst.Name):
            assigned = self.assigned_in(method).get(node.value, [])
            if len(assigned) != 1 or assigned[0] is None:
                return None
            node = assigned[0]
        if not isinstance(node, (cst.Tuple, cst.List)):
            return None
        return None if any(isinstance(e, cst.StarredElement) for e in node.elements) else len(node.elements)

    def assigned_in(self, method: cst.FunctionDef) -> dict[str, list[cst.BaseExpression | None]]:
        """The value of each binding of each name in `method`, one walk per method.

        None for a binding that is no plain `name = value`.
        """
        found = self._assigned.get(id(method))
        if found is None or found[0] is not method:
            found = (method, assigned_values([method.body]))
            self._assigned[id(method)] = found
        return found[1]


def _basic_index(index: cst.BaseSlice) -> str | None:
    """How an index of one dimension is read: "integer", "slice", or None.

    "integer" for `x[2]` or `x[-1]` (the dimension dropped), "slice" for `x[a:b]` (kept), else None (`x[None]`,
    `x[...]`, a tensor index: not read).
    """
    if isinstance(index, cst.Slice):
        return "slice"
    value = index.value if isinstance(index, cst.Index) else None
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        value = value.expression
    return "integer" if isinstance(value, cst.Integer) else None
