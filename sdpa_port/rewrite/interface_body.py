"""Interface style: split a traced forward into a dispatch through ALL_ATTENTION_FUNCTIONS and an eager function.

The chain statements (query-key product to the product with V) move, unchanged, into a module-level eager function;
the statements around them stay in forward and hand their values to it as keyword arguments. For the other
implementations the forward also passes `scaling`, `dropout` and, for additive terms other than the attention
mask, their sum as `position_bias` (which transformers' sdpa and flex implementations add to the mask from 5.17.0 on).
Where the release's sdpa reads no `position_bias` (`InterfaceOptions.fold_function`), the terms are folded into the
float mask handed over instead, and the eager function takes its own mask by keyword.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Callable, Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import assigned_names, assignment, block_body, code, if_chain
from sdpa_port.rewrite.edit import replace_names, replace_nodes
from sdpa_port.analyse.patterns import cast_operand, inverse, permuted, then, walk_names
from sdpa_port.analyse.sdpa_path import SdpaPath
from sdpa_port.render import render_statements
from sdpa_port.refusals import Code, Refuse
from sdpa_port.analyse.cstutil import primary
from sdpa_port.rewrite.sdpa_body import SdpaEmitter, whole_chain_branch
from sdpa_port.rewrite.sdpa_builders import unflatten
from sdpa_port.rewrite.sdpa_state import EmitOptions, Side, SideNames
from sdpa_port.rewrite.walk import StatementWalker

# names the eager function's signature and the dispatch's keywords already use
RESERVED = frozenset(
    {"module", "query", "key", "value", "attention_mask", "scaling", "dropout", "kwargs", "position_bias", "is_causal"}
)
BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class EagerMask:
    """How code that stays eager beside the dispatch takes the attention mask: converted from the boolean mask
    of the implementation in use to eager's additive one, in the dtype `dtype` names; or why it cannot (`why`)."""

    dtype: str | None
    why: str
    # the `create_causal_mask` calls to build under every implementation for that (`allow_is_causal_skip=False`),
    # where the port does not already: sdpa's mask is then never None, always the booleans eager's form follows from
    build_always: frozenset[int] = frozenset()


def no_eager_mask() -> EagerMask:
    return EagerMask(None, "no code is kept beside the dispatch")


@dataclass(frozen=True)
class InterfaceOptions:
    names: SideNames
    eager_name: str
    mask_param: str | None  # the forward name holding the attention mask passed positionally
    # code true for self-attention calls (`key_value_states is None`), when the module serves cross-attention too:
    # the dispatch then passes an explicit is_causal= (taken out of the caller's kwargs)
    causal_test: str | None
    forward_kwargs: str | None  # forward's **kwargs name, passed on to the implementation
    moved: frozenset[cst.CSTNode] = frozenset()  # statements that belong to the eager computation (operand upcasts)
    module_names: frozenset[str] = frozenset()  # top-level names of the file (visible inside the eager function)
    taken: frozenset[str] = frozenset()  # names of the forward being rewritten
    weights_requested: str | None = None  # code that is true when the caller asks for attention weights
    # forward names `position_ids`: hand them on, as kernels that locate the cache position need them
    position_ids: bool = False
    # the mask parameter is applied by a fill the eager function turns into its addition (`plan/bool_masks.py`):
    # like an added mask, it goes to the implementations as built and changes nothing on the SDPA side
    handed_fill: bool = False
    # asked only when code kept eager beside the dispatch reads the mask (it follows the masks through the file)
    eager_mask: Callable[[], EagerMask] = no_eager_mask
    # no causal mask reaches the module, so its causality is the computation's own (a causal buffer, handed over
    # in position_bias) or none: the dispatch passes is_causal=False whatever `self.is_causal` says
    # (`plan/interface_style._causality_in_chain`)
    not_causal: bool = False
    # the mask is added only where this test of the module's settings holds: the implementations get None otherwise
    mask_setting: str | None = None
    # the release's sdpa reads no `position_bias`: additive terms are folded into the mask handed over, by the
    # module-level function of this name (`fold_terms.py.jinja`) where a mask or causality joins them
    fold_function: str | None = None
    # the eager function takes the mask by keyword (its own, as built for the implementation in use), the folded one
    # going positionally to the others
    mask_by_keyword: bool = False


@dataclass
class EagerPart:
    """What forward's dispatch needs to know of the eager function: the name of its output, and the values it reads
    from forward (passed as keywords)."""

    output_name: str = "attn_output"
    free: list[str] = field(default_factory=list)


class InterfaceEmitter(SdpaEmitter):
    def __init__(self, path: SdpaPath, options: InterfaceOptions) -> None:
        super().__init__(path, EmitOptions(options.names))
        self.interface = options
        self.other_streams = path.other_streams
        self.eager = EagerPart()
        self.dispatched = False
        self.position_bias = False  # the dispatch hands additive terms over as `position_bias`
        self.folded = False  # the dispatch folds additive terms into the mask it hands over
        self.fold_called = False  # ... through the fold function (a mask or causality joins them)
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
        layout = self.layout
        query, key, value = self.query, self.key, plan.output.value
        if layout.heads is not None:
            query, key = unflatten(query, layout.heads), unflatten(key, layout.heads)
            if layout.unflatten_value:
                value = unflatten(value, layout.heads)
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
            query_root=code(primary(self.query)),
            key_root=code(primary(self.key)),
        )
        out.extend(dispatch)
        self.position_bias = bool(bias) and not folded
        self.folded = self.folded or bool(folded)
        for name in weights[1:]:
            out.append(cst.parse_statement(f"{name} = {weights[0]}"))
        # the dispatch returns (batch, query, heads, dim): back to SDPA's layout, then to the product's
        order = then(inverse(_HANDED_OVER), plan.output.order or _IN_PLACE)
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

    def held_elsewhere(self, name: str) -> bool:
        """`name` holds the probabilities of some product with V (`OutputStmt.holders`)."""
        return any(isinstance(plan, t.OutputStmt) and name in plan.holders for plan in self.plans.values())

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


def parameter_name(name: str) -> str:
    """Free values whose names the interface reserves get a trailing underscore inside the eager function."""
    return name + "_" if name in RESERVED else name


# ------------------------------------------------------------------ the eager function's body


class _Filter(StatementWalker):
    """Keep the chain statements (and the statements moved with them) in their control-flow skeleton."""

    def __init__(self, path: SdpaPath, moved: frozenset[cst.CSTNode]) -> None:
        self.plans = path.plans
        self.dropped_ifs = path.dropped_ifs
        self.moved = moved
        self.others = path.other_streams  # the eager function computes the first stream alone
        self.output: t.OutputStmt | None = None
        self.output_small: cst.BaseSmallStatement | None = None

    def line(self, statement: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
        kept: list[cst.BaseSmallStatement] = []
        for small in statement.body:
            plan = self.plans.get(small)
            if small in self.others:
                continue
            if isinstance(plan, t.ChainStmt) or small in self.moved:
                kept.append(small)
            elif isinstance(plan, t.OutputStmt):
                self.output, self.output_small = plan, small
                kept.append(small)
        return [statement.with_changes(body=kept)] if kept else []

    def if_statement(self, node: cst.If) -> list[cst.BaseStatement]:
        if node in self.moved:
            return [node]
        if node in self.dropped_ifs:
            return []
        branch = whole_chain_branch(node, self.plans)
        if branch is not None:
            return self.block(block_body(branch.body))  # the branch that computes the attention, alone
        return super().if_statement(node)

    def compound(self, statement: cst.With | cst.For | cst.While) -> list[cst.BaseStatement]:
        # the chain never runs in a loop (the tracer refuses that): only a `with` can hold chain statements
        return super().compound(statement) if isinstance(statement, cst.With) else []

    def other(self, statement: cst.BaseStatement) -> list[cst.BaseStatement]:
        return []


def _handed_operands(path: SdpaPath) -> dict[cst.CSTNode, cst.CSTNode]:
    """Where each branch computes its own product (`Tracer.alternatives`), the dispatch in a branch hands over that
    branch's operands: a product reading plain names reads the `query` and `key` handed over instead (the names
    themselves may differ in the other branches). A product of operands built (joined blocks) or permuted reads its
    names as written, passed on from forward."""
    mapping: dict[cst.CSTNode, cst.CSTNode] = {}
    for op in path.chain_ops:
        if isinstance(op, t.Start) and not op.joined and op.orders == (None, None) and op.operands is None:
            if isinstance(op.query, cst.Name) and isinstance(op.key, cst.Name):
                mapping[op.query] = cst.Name("__sdpa_port_query__")  # restored once the free names are read
                mapping[op.key] = cst.Name("__sdpa_port_key__")
    return mapping


def eager_body(path: SdpaPath, options: InterfaceOptions) -> tuple[list[cst.BaseStatement], EagerPart]:
    """The eager function's statements: operand adapters, the chain as written (self -> module), the return."""
    function = path.function
    fil = _Filter(path, options.moved)
    statements = fil.block(block_body(function.body))
    if fil.output is None or fil.output_small is None:
        raise Refuse(Code.NOT_EXTRACTABLE, "the product with V was not found on the eager path")
    start = path.start
    assert start is not None
    output = fil.output.output
    part = EagerPart()
    # the output statement keeps only the product: `attn_output = <probs @ value>`
    part.output_name = "attn_output"
    # the output statement, with any statements moved after it (a check of the output's size) kept in order
    index = next(
        (i for i, s in enumerate(statements) if isinstance(s, cst.SimpleStatementLine) and fil.output_small in s.body),
        len(statements) - 1,
    )
    replaced = _replace_output(statements[index], fil.output_small, output.node, part.output_name)
    statements = statements[:index] + replaced + statements[index + 1 :]
    # adapters: the interface hands over 4-D query, key, value and the attention mask
    flatten = {"query": start.rank == 3, "key": start.rank == 3, "value": output.rank == 3}
    adapters: list[cst.BaseStatement] = []
    provided: set[str] = {"module"}
    written = (*(start.operands or (start.query, start.key)), output.product.right)
    orders = (*start.orders, output.value_order)
    operands = (start.query, start.key, output.value)
    restore: dict[str, cst.BaseExpression] = {}  # placeholders of operands written as expressions
    alternatives = path.branched
    if alternatives:
        statements = [replace_nodes(s, _handed_operands(path)) for s in statements]
        for parameter in ("query", "key"):
            restore[f"__sdpa_port_{parameter}__"] = cst.Name(parameter)
            provided.add(f"__sdpa_port_{parameter}__")
    for operand, source, order, parameter in zip(operands, written, orders, ("query", "key", "value")):
        if alternatives and parameter != "value":
            continue  # each branch's product reads its own operands (`_handed_operands`)
        if order is not None:
            # an einsum's operand, handed over laid out for SDPA: put back in the einsum's own order (flattened
            # first where the einsum reads (batch * heads, length, dim) in some order)
            given: cst.BaseExpression = cst.Name(parameter)
            if flatten[parameter]:
                given = cst.parse_expression(f"{parameter}.flatten(0, 1)")
            restored = permuted(given, inverse(order))
            if not isinstance(source, cst.Name):
                placeholder = f"__sdpa_port_{parameter}__"
                statements = [replace_nodes(s, {source: cst.Name(placeholder)}) for s in statements]
                restore[placeholder] = restored
                provided.add(placeholder)
                continue
            adapters.append(assignment(source.value, restored))
            provided.add(source.value)
        elif isinstance(operand, cst.Name):
            if operand.value != parameter or flatten[parameter]:
                flat = f"{parameter}.flatten(0, 1)" if flatten[parameter] else parameter
                adapters.append(assignment(operand.value, cst.parse_expression(flat)))
            provided.add(operand.value)
    if options.mask_param and not options.mask_by_keyword:
        if options.mask_param != "attention_mask":
            adapters.append(cst.parse_statement(f"{options.mask_param} = attention_mask"))
        provided.add(options.mask_param)
    body = [replace_names(s, {"self": cst.Name("module")}) for s in statements]
    # every other value the chain reads comes from forward, renamed where the signature already uses the name
    part.free = [n for n in free_names(body, options.module_names, reserved=frozenset()) if n not in provided]
    renames = {name: cst.Name(parameter_name(name)) for name in part.free if name in RESERVED}
    if renames:
        body = [replace_names(s, renames) for s in body]
    body = [*adapters, *(replace_names(s, restore) for s in body)]
    weights = sorted(path.probs_after_output)
    returned = weights[0] if weights else "None"
    if weights and path.other_streams:
        # the weights forward returns may belong to another stream: the eager function returns its own stream's,
        # the probabilities its product takes (each stream's are made the same way), where forward returns those
        products = [plan for plan in path.plans.values() if isinstance(plan, t.OutputStmt)]
        probabilities = output.product.left
        if not isinstance(probabilities, cst.Name) or any(
            not any(name in plan.holders for plan in products) for name in weights
        ):
            raise Refuse(
                Code.NOT_EXTRACTABLE,
                "the weights returned are not the probabilities a product with V takes, and with several products "
                "the eager function cannot say which stream's to return",
            )
        returned = probabilities.value
    if output.rank == 3:
        heads = _heads_in_eager(path)
        if heads is None:
            raise Refuse(Code.LAYOUT, "the flat (batch * heads) layout cannot be split back into heads")
        # an einsum's flat layout (`...->qbd`) to (batch * heads, query, dim), split into heads, handed back
        unordered = permuted(cst.Name(part.output_name), inverse(output.order) if output.order else None)
        split = cst.parse_expression(f"{code(primary(unordered))}.unflatten(0, ({heads}))")
        result_node = permuted(split, _HANDED_OVER)
    else:
        # the product's layout (SDPA's, or an einsum's `...->bind`) to the (batch, query, heads, dim) handed back
        handed = then(inverse(output.order or _IN_PLACE), _HANDED_OVER)
        result_node = permuted(cst.Name(part.output_name), handed)
    body.append(cst.parse_statement(f"return {code(primary(result_node))}.contiguous(), {returned}"))
    return body, part


_HANDED_OVER = (0, 2, 1, 3)  # the attention interface's output: SDPA's (batch, heads, query, dim) as (b, q, h, d)
_IN_PLACE = (0, 1, 2, 3)



def _heads_in_eager(path: SdpaPath) -> str | None:
    for op in path.chain_ops:
        if isinstance(op, t.View) and op.heads is not None:
            module = {"self": cst.Name("module")}
            return f"{code(replace_names(op.heads[0], module))}, {code(replace_names(op.heads[1], module))}"
    return None


def _replace_output(
    statement: cst.BaseStatement, small: cst.BaseSmallStatement, product: cst.BaseExpression, name: str
) -> list[cst.BaseStatement]:
    assign = cst.parse_statement(f"{name} = __product__")
    assert isinstance(assign, cst.SimpleStatementLine)
    new_small = assign.body[0].with_changes(value=product)
    if isinstance(statement, cst.SimpleStatementLine):
        return [statement.with_changes(body=[new_small if s is small else s for s in statement.body])]
    raise Refuse(Code.NOT_EXTRACTABLE, "the product with V sits inside a compound statement")


def free_names(
    statements: Sequence[cst.BaseStatement], module_names: frozenset[str], reserved: frozenset[str] = RESERVED
) -> list[str]:
    """Names read before being assigned, in order of first use; module-level names and builtins excluded."""
    assigned: set[str] = set()
    free: list[str] = []
    for statement in statements:
        reads_then_writes = _reads_and_writes(statement)
        for name, is_write in reads_then_writes:
            if is_write:
                assigned.add(name)
            elif name not in assigned and name not in free and name not in module_names and name not in BUILTINS:
                if name not in reserved:
                    free.append(name)
    return free


def _reads_and_writes(statement: cst.CSTNode) -> list[tuple[str, bool]]:
    """Names in evaluation order for simple statements: the value's reads come before the targets' writes."""
    out: list[tuple[str, bool]] = []
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, cst.Assign):
                out.extend((n, False) for n in sorted(walk_names(small.value)))
                for target in small.targets:
                    out.extend((n, True) for n in assigned_names(target.target))
                    out.extend((n, False) for n in sorted(walk_names(target.target) - set(assigned_names(target.target))))
            elif isinstance(small, cst.AugAssign):
                out.extend((n, False) for n in sorted(walk_names(small.value) | walk_names(small.target)))
                out.extend((n, True) for n in assigned_names(small.target))
            else:
                out.extend((n, False) for n in sorted(walk_names(small)))
        return out
    if isinstance(statement, cst.If):
        out.extend((n, False) for n in sorted(walk_names(statement.test)))
        for inner in block_body(statement.body):
            out.extend(_reads_and_writes(inner))
        orelse = statement.orelse
        if isinstance(orelse, cst.If):
            out.extend(_reads_and_writes(orelse))
        elif isinstance(orelse, cst.Else):
            for inner in block_body(orelse.body):
                out.extend(_reads_and_writes(inner))
        return out
    if isinstance(statement, cst.With):
        for item in statement.items:
            out.extend((n, False) for n in sorted(walk_names(item.item)))
        for inner in block_body(statement.body):
            out.extend(_reads_and_writes(inner))
        return out
    return [(n, False) for n in sorted(walk_names(statement))]


__all__ = ["InterfaceEmitter", "InterfaceOptions", "eager_body", "free_names"]
