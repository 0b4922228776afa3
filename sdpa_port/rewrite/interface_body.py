"""Interface style: split a traced forward into a dispatch through ALL_ATTENTION_FUNCTIONS and an eager function.

The chain statements (query-key product to the product with V) move, unchanged, into a module-level eager function;
the statements around them stay in forward and hand their values to it as keyword arguments. For the other
implementations the forward also passes `scaling`, `dropout` and, for additive terms other than the attention
mask, their sum as `position_bias` (which transformers' sdpa and flex implementations add to the mask from 5.17.0 on).
Where the release's sdpa reads no `position_bias` (`InterfaceOptions.fold_function`), the terms are folded into the
float mask handed over instead, and the eager function takes its own mask by keyword.
"""

from __future__ import annotations

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import code, if_chain, primary
from sdpa_port.analyse.patterns import cast_operand, inverse, permuted, then, walk_names
from sdpa_port.analyse.sdpa_path import SdpaPath
from sdpa_port.refusals import Code, Refuse
from sdpa_port.render import render_statements
from sdpa_port.rewrite.edit import replace_nodes
from sdpa_port.rewrite.interface_options import (
    HANDED_OVER,
    IN_PLACE,
    EagerMask,
    EagerPart,
    InterfaceOptions,
    parameter_name,
)
from sdpa_port.rewrite.sdpa_body import SdpaEmitter
from sdpa_port.rewrite.sdpa_builders import unflatten
from sdpa_port.rewrite.sdpa_state import EmitOptions, Side


class InterfaceEmitter(SdpaEmitter):
    def __init__(self, path: SdpaPath, options: InterfaceOptions) -> None:
        super().__init__(path, EmitOptions(options.names))
        self.interface = options
        self.other_streams = path.other_streams
        self.eager = EagerPart()
        self.dispatched = False
        self.handed: tuple[cst.BaseExpression, cst.BaseExpression, cst.BaseExpression] | None = None
        self.position_bias = False  # the dispatch hands additive terms over as `position_bias`
        self.folded = False  # the dispatch folds additive terms into the mask it hands over
        self.fold_called = False  # ... through the fold function (a mask or causality joins them)
        self.outputs: set[str] = set()  # the names the dispatches' outputs are given (`restored_layout` reads them)
        # branches that stay eager beside the dispatch and read the mask, each with the test of its `if`: they take
        # the mask in eager's form
        self.eager_mask_branches: list[tuple[cst.If | cst.Else, str]] = []
        self._eager_mask: EagerMask | None = None

    @property
    def eager_mask(self) -> EagerMask:
        if self._eager_mask is None:
            self._eager_mask = self.interface.eager_mask()
        return self._eager_mask

    @property
    def eager_mask_tests(self) -> list[str]:
        return list(dict.fromkeys(test for _, test in self.eager_mask_branches))

    # the attention mask goes to the implementation positionally; only the other terms fold into position_bias
    def add_to_mask(self, term: cst.BaseExpression) -> list[cst.BaseStatement]:
        if self.is_mask_parameter(term):
            return []
        return super().add_to_mask(term)

    def is_mask_parameter(self, term: cst.BaseExpression) -> bool:
        return self.interface.mask_param is not None and cast_operand(term) == self.interface.mask_param

    def is_handed_fill(self, op: t.Op) -> bool:
        return self.interface.handed_fill and isinstance(op, t.Fill) and self.is_mask_parameter(op.condition)

    def none_guarded_term(self, node: cst.If, touched: set[Side]) -> str | None:
        found = super().none_guarded_term(node, touched)
        return None if found == self.interface.mask_param else found

    def chain_kinds(self, node: cst.CSTNode) -> set[Side]:
        """As for SDPA, but adding the attention mask changes no side value: it goes to the interface as is."""
        plans = [p for p in self.plans_in(node) if isinstance(p, t.ChainStmt)]
        if plans and all(
            isinstance(op, (t.AddTerm,)) and self.is_mask_parameter(op.term)
            or self.is_handed_fill(op)
            or not isinstance(op, (t.AddTerm, t.Scale, t.Fill, t.Dropout))
            for plan in plans
            for op in plan.ops
        ):
            return set()
        kinds = super().chain_kinds(node)
        if Side.CAUSAL in kinds:
            # a causal fill joins the additive terms here (`apply`), so a branch that fills changes the mask
            kinds = (kinds - {Side.CAUSAL}) | {Side.MASK}
        return kinds

    def whole_chain_branch(self, node: cst.If) -> cst.If | cst.Else | None:
        """The branch holding the whole computation (`if self.training and fused: ... else: <the chain>`) dispatches;
        the others run as written. Transformers builds the attention mask for the implementation in use (None or
        boolean under sdpa): a test choosing between the branches must not read it, and a branch that does takes
        it converted to eager's form, where that form follows from sdpa's (`EagerMask`)."""
        branch = super().whole_chain_branch(node)
        mask = self.interface.mask_param
        if branch is None or mask is None:
            return branch
        beside = f"the attention is computed in one branch of an `if` and `{mask}` is read beside it"
        per_implementation = "transformers builds the mask for the implementation in use (None or boolean under sdpa)"
        for current in if_chain(node):
            if isinstance(current, cst.If) and mask in walk_names(current.test):
                raise Refuse(
                    Code.NOT_EXTRACTABLE,
                    f"{beside}, in the test choosing the branch; {per_implementation}, so the test could choose "
                    "another branch than under eager",
                    line=self.line_in(node),
                )
            if current is branch or mask not in walk_names(current.body):
                continue
            if self.eager_mask.dtype is None:
                raise Refuse(
                    Code.NOT_EXTRACTABLE,
                    f"{beside}; {per_implementation}, so that code would receive another mask than under eager, and "
                    f"eager's cannot be rebuilt from it: {self.eager_mask.why}",
                    line=self.line_in(node),
                )
            self.eager_mask_branches.append((current, code(node.test)))
        return branch

    def kept_branch(self, branch: cst.If | cst.Else, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        if not any(branch is b for b, _ in self.eager_mask_branches):
            return body
        mask, dtype = self.interface.mask_param, self.eager_mask.dtype
        return [*render_statements("interface_style/eager_mask.py.jinja", mask=mask, dtype=dtype), *body]

    def apply(self, op: t.Op) -> list[cst.BaseStatement]:
        if isinstance(op, t.Start) and op.layout is not None:
            # the eager function and every implementation take (batch, heads, query, key) scores and a mask so laid
            # out; moving a computation laid out otherwise there is not written yet
            raise Refuse(
                Code.LAYOUT,
                f"the scores are laid out {t.describe_layout(op.layout)}; the attention interface's functions take "
                "them as (batch, heads, query, key) (the class style permutes what is added to them)",
            )
        if self.is_handed_fill(op):
            return []
        if isinstance(op, t.Fill):
            return self.fill_mask(op)  # a causal buffer is an additive term like any other here
        if isinstance(op, t.ZeroRows):
            raise Refuse(
                Code.MASKED_ROWS,
                f"the probabilities are set to 0 where `{code(op.condition)}` masked the scores, so a row masked whole "
                "gives 0; the attention implementations do not, and the dispatch has no step after them that zeroes "
                "those rows (the class style has)",
            )
        if isinstance(op, t.Scale) and op.per_query:
            # the interface takes one number as `scaling`; a tensor factor would have to move onto the query that
            # every implementation (eager included) receives
            raise Refuse(
                Code.SCALE_NOT_A_NUMBER,
                f"the scores are scaled by the tensor `{code(op.factor)}`: the attention interface takes a number as "
                "`scaling` (the class style scales the query instead)",
            )
        return super().apply(op)

    def floor_mask(self, op: t.Guard) -> list[cst.BaseStatement]:
        """The attention mask goes to the implementation as transformers built it for that implementation, so a
        floor over its sum with other terms cannot move onto `position_bias`."""
        state = self.state
        if self.interface.mask_param is not None and (state.mask is not None or state.mask_var):
            raise Refuse(
                Code.MASKED_ROWS,
                "the scores are floored after adding both the attention mask and other terms; the implementations "
                "receive the mask separately, so the floor cannot follow it",
            )
        return super().floor_mask(op)

    def passed_along(self, small: cst.BaseSmallStatement, plan: t.OutputStmt) -> set[str]:
        """The probabilities' names the output statement reads beside the product with V."""
        value = getattr(small, "value", None)
        if not isinstance(value, cst.BaseExpression):
            return set()
        rest = replace_nodes(value, {plan.output.node: cst.Name("None")})
        return walk_names(rest) & self.probs_after_output

    def if_statement(self, node: cst.If) -> list[cst.BaseStatement]:
        if node in self.interface.moved:
            self.removed_reads |= walk_names(node)
            return []
        return super().if_statement(node)

    def line(self, statement: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
        kept = [small for small in statement.body if small not in self.interface.moved]
        if not kept:
            return []
        if len(kept) != len(statement.body):
            statement = statement.with_changes(body=kept)
        return super().line(statement)

    def output_statement(
        self, small: cst.BaseSmallStatement, plan: t.OutputStmt, line: cst.SimpleStatementLine
    ) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for op in plan.ops:
            out.extend(self.apply(op))
        if self.query is None or self.key is None or self.start is None:
            raise Refuse(Code.UNKNOWN_PRODUCT, "the product with V has no recognised scores")
        state = self.state
        if state.mask_var:
            bias = self.names.mask
        elif state.mask is not None:
            bias = code(state.mask)
        else:
            bias = ""
        layout = self.readable_layout()
        query, key, value = self.query, self.key, plan.output.value
        if layout.heads is not None:
            query, key = unflatten(query, layout.heads), unflatten(key, layout.heads)
            if layout.unflatten_value:
                value = unflatten(value, layout.heads)
        self.handed = None if self.dispatched else (query, key, value)  # read by `plan/eager_values.py`
        # the probabilities the dispatch must give: those read later, and those the statement itself passes along
        # (`return out @ v, weights`, or `out, weights = out @ v, weights` where a helper's return was inlined)
        weights = sorted((self.probs_after_output - self.assigned_by(small)) | self.passed_along(small, plan))
        if self.other_streams:
            # several products with V: each dispatch gives the weights its own probabilities stand for
            weights = [name for name in weights if name in plan.holders or not self.held_elsewhere(name)]
        output_name = _fresh("attention_output", self.taken())
        mask_variable = _fresh("dispatch_mask", self.taken())
        # the mask the implementations get as transformers built it (converted for eager where weights are asked for)
        handed = mask_variable if self.interface.weights_requested and self.handed_mask() != "None" else self.handed_mask()
        extra = [
            (parameter_name(name), handed if self.interface.mask_by_keyword and name == self.interface.mask_param else name)
            for name in self.eager.free
        ]
        if self.interface.position_ids and "position_ids" not in {keyword for keyword, _ in extra}:
            extra.append(("position_ids", "position_ids"))
        causal_variable = _fresh("dispatch_is_causal", self.taken())
        folded = self.folded_mask(bias, handed, causal_variable) if bias and self.interface.fold_function else ""
        dispatch = render_statements(
            "interface_style/dispatch.py.jinja",
            eager=self.interface.eager_name,
            again=self.dispatched,
            output=output_name,
            weights=weights[0] if weights else "_",
            query=code(query),
            key=code(key),
            value=code(value),
            mask=self.handed_mask(),
            dropout=code(self.dropout) if self.dropout is not None else "0.0",
            scaling=code(self.scale_expression()),
            is_causal=self.interface.causal_test or "",
            not_causal=self.interface.not_causal,
            causal_variable=causal_variable,
            position_bias="" if folded else bias,
            folded=folded,
            extra=extra,
            kwargs=self.interface.forward_kwargs or "",
            weights_requested=self.interface.weights_requested or "",
            mask_variable=mask_variable,
            **self.shape_sources(query, key),
            **self.operands_cast(value),
        )
        out.extend(dispatch)
        self.outputs.add(output_name)
        self.position_bias = bool(bias) and not folded
        self.folded = self.folded or bool(folded)
        for name in weights[1:]:
            out.append(cst.parse_statement(f"{name} = {weights[0]}"))
        # the dispatch returns (batch, query, heads, dim): back to SDPA's layout, then to the product's
        order = then(inverse(HANDED_OVER), plan.output.order or IN_PLACE)
        converted: cst.BaseExpression = permuted(cst.Name(output_name), order)
        rank = plan.output.rank
        if rank == 3:  # flat (batch * heads, query, dim), then the einsum's own order of those
            flat = cst.parse_expression(f"{output_name}.transpose(1, 2).flatten(0, 1)")
            converted = permuted(flat, plan.output.order)
        out.append(line.with_changes(body=[replace_nodes(small, {plan.output.node: converted})]))
        self.dispatched = True
        return out

    def folded_mask(self, terms: str, handed: str, causal_variable: str) -> str:
        """The mask handed over with the additive `terms` folded in, for a release whose sdpa reads no
        `position_bias`: the terms alone where no mask and no causality join them, else the fold function's call
        (given the causality sdpa would apply, as the dispatch decides it)."""
        if self.interface.not_causal:
            causal = "False"
        elif self.interface.causal_test:
            causal = causal_variable
        elif self.interface.forward_kwargs:
            causal = f'{self.interface.forward_kwargs}.get("is_causal", self.is_causal)'
        else:
            causal = "self.is_causal"
        if handed == "None" and causal == "False":
            return terms
        assert self.interface.fold_function is not None
        self.fold_called = True
        query, key = code(primary(self.query)) if self.query else "", code(primary(self.key)) if self.key else ""
        return f"{self.interface.fold_function}({terms}, {handed}, {causal}, {query}, {key})"

    def shape_sources(self, query: cst.BaseExpression, key: cst.BaseExpression) -> dict[str, str]:
        """What the dispatch reads sizes from: the query's and key's roots (for eager's causal mask), and the
        operands as handed (the batch size of eager's causal mask: eager code may check its mask is per example). Transformers' flex reads `position_bias[batch, head, query, key]` with no broadcasting, so
        the terms go to it expanded to the scores' shape (a view), under flex only: sdpa would copy the expansion."""
        assert self.query is not None and self.key is not None
        return {
            "query_root": code(primary(self.query)),
            "key_root": code(primary(self.key)),
            "bias_variable": _fresh("dispatch_bias", self.taken()),
            "flex_query": code(query),
            "flex_key": code(key),
            "query_batch": code(self.layout.heads[0]) if self.layout.heads else f"{code(primary(query))}.shape[0]",
        }

    def held_elsewhere(self, name: str) -> bool:
        """`name` holds the probabilities of some product with V (`OutputStmt.holders`)."""
        return any(isinstance(plan, t.OutputStmt) and name in plan.holders for plan in self.plans.values())

    def operands_cast(self, value: cst.BaseExpression) -> dict[str, object]:
        """Where eager upcasts query and key itself, the names the other implementations get them by, cast."""
        assert self.start is not None
        return {
            "operands_cast": self.start.upcast or self.start.operands_upcast,
            "query_variable": _fresh("dispatch_query", self.taken()),
            "key_variable": _fresh("dispatch_key", self.taken()),
            "value_root": code(primary(value)),
        }

    def taken(self) -> set[str]:
        return set(self.interface.module_names) | set(self.eager.free) | set(self.interface.taken)

    def handed_mask(self) -> str:
        mask, setting = self.interface.mask_param, self.interface.mask_setting
        if mask is None:
            return "None"
        return f"{mask} if {setting} else None" if setting is not None else mask


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name = "_" + name
    return name


__all__ = ["InterfaceEmitter"]
