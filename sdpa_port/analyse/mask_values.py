"""The values the mask flow follows: where a mask comes from, the state of a method's names, and pure helpers.

`mask_flow.MaskFlow` answers which masks reach a module; `mask_reading` reads one method over these values. A value
is an `Origin` (a builder called, no mask, unknown), a `Param` (resolved at the callers) or a `Builder` not yet
called; a `State` maps each name to the values it may hold.
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from sdpa_port.analyse.module_sites import ModuleCall, Site, parameter_default

CAUSAL_BUILDER = "create_causal_mask"
BIDIRECTIONAL_BUILDER = "create_bidirectional_mask"


class Kind(enum.Enum):
    CAUSAL = "create_causal_mask"
    BIDIRECTIONAL = "create_bidirectional_mask"
    CONDITIONAL = "a mask builder chosen by a condition"
    NONE = "no mask"
    UNKNOWN = "a mask of unknown origin"
    # followed for derivation only (`MaskFlow(derive=True)`): anything computed from a mask built per implementation
    PER_IMPLEMENTATION = "a value computed from a mask built per implementation"
    INPUT = "the model's own inputs"


@dataclass(frozen=True)
class Origin:
    """Where a mask reaching a module comes from."""

    kind: Kind
    line: int
    detail: str = ""  # the condition of a conditional builder, or why the origin is unknown
    # the builder's mask converted to booleans before it is handed on (`create_causal_mask(...).to(torch.bool)`):
    # under eager, True where the float mask masks; under the other implementations their own mask, converted
    to_bool: bool = False

    def describe(self) -> str:
        if self.to_bool:
            return f"`{self.kind.value}` converted to booleans (line {self.line})"
        if self.kind in (Kind.CAUSAL, Kind.BIDIRECTIONAL):
            return f"`{self.kind.value}` (line {self.line})"
        if self.kind is Kind.CONDITIONAL:
            return f"a builder chosen by `{self.detail}` (line {self.line})"
        if self.kind is Kind.NONE:
            return f"no mask (line {self.line})"
        if self.kind is Kind.PER_IMPLEMENTATION:
            return f"`{self.detail}` (line {self.line}), built per implementation"
        return f"{self.detail} (line {self.line})" if self.line else self.detail


@dataclass(frozen=True)
class Param:
    """The value of a parameter of the function being read, resolved at its callers."""

    name: str


@dataclass(frozen=True)
class Builder:
    """A mask builder itself (`build = create_causal_mask if c else create_bidirectional_mask`), not yet called."""

    kind: Kind
    line: int
    condition: str = ""


Value = Origin | Param | Builder
Values = frozenset[Value]


@dataclass(frozen=True)
class SiteMasks:
    """The masks reaching the modules built at one site, over every call made through it."""

    site: Site
    origins: frozenset[Origin]
    calls: int  # self-attention calls followed
    cross_calls: int  # calls shown to hand the module encoder states (never causal)

    @property
    def kinds(self) -> frozenset[Kind]:
        return frozenset(o.kind for o in self.origins)

    @property
    def causal(self) -> bool | None:
        """True when every mask is causal, False when none is (bidirectional or absent), None when undecided."""
        kinds = self.kinds
        if Kind.UNKNOWN in kinds or Kind.CONDITIONAL in kinds:
            return None
        if not self.calls and not self.cross_calls:
            return None
        if kinds == {Kind.CAUSAL}:
            return True
        if Kind.CAUSAL in kinds:
            return None
        return False

    def why(self) -> str:
        """What the masks reaching the site are, or what keeps them from being known."""
        if not self.origins:
            return "it is only called for cross-attention" if self.cross_calls else "it is never called in this file"
        unknown = sorted((o for o in self.origins if o.kind is Kind.UNKNOWN), key=_order)
        known = sorted((o for o in self.origins if o.kind is not Kind.UNKNOWN), key=_order)
        if Kind.CAUSAL in self.kinds and len({o.kind for o in known}) > 1:
            return "it receives masks from " + _listed(known)
        conditional = [o for o in known if o.kind is Kind.CONDITIONAL]
        if conditional:
            return "its masks come from " + _listed(conditional)
        if unknown:
            return "its mask cannot be followed past " + _listed(unknown)
        return "its masks come from " + _listed(known)

    def not_causal(self) -> str | None:
        """The masks reaching the site that are not causal (bidirectional, absent, conditional), if any."""
        found = sorted((o for o in self.origins if o.kind not in (Kind.CAUSAL, Kind.UNKNOWN)), key=_order)
        return _listed(found) if found else None


def _order(origin: Origin) -> tuple[int, str, str]:
    return (origin.line, origin.kind.name, origin.detail)


def _listed(origins: Sequence[Origin], most: int = 4) -> str:
    parts = list(dict.fromkeys(o.describe() for o in origins))
    if len(parts) > most:
        parts = [*parts[: most - 1], f"{len(parts) - most + 1} more"]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


@dataclass
class State:
    """The values each name of a method may hold at one point of it."""

    env: dict[str, Values]
    nonnull: frozenset[str]  # names an enclosing test showed are not None


@dataclass
class MethodFlow:
    """One method read once: the values of its names before each call, and what it returns."""

    at_call: dict[ast.Call, State] = field(default_factory=dict)
    returns: list[tuple[ast.expr, State]] = field(default_factory=list)


Restriction = tuple[str, tuple[str, str]]  # (class, site): its forward is reached only through that site


# what builds masks per implementation, called by name: transformers' 5.x builders, the 4.x helpers (swapped for
# their `_for_sdpa` variants by a class-style port) and the models' own builders reading `_attn_implementation`
PER_IMPLEMENTATION_HELPERS = frozenset(
    {
        "create_causal_mask",
        "create_bidirectional_mask",
        "create_sliding_window_causal_mask",
        "create_chunked_causal_mask",
        "create_masks_for_generate",
        "_prepare_4d_causal_attention_mask",
        "_prepare_4d_attention_mask",
        "_prepare_4d_causal_attention_mask_for_sdpa",
        "_prepare_4d_attention_mask_for_sdpa",
        "get_extended_attention_mask",
        "_update_causal_mask",
        "_update_full_mask",
        "_update_cross_attn_mask",
    }
)
MASK_MODULES = ("masking_utils", "modeling_attn_mask_utils")


SDPA = "sdpa"


def implementation_test(test: ast.expr, flag: Callable[[str], list[ast.expr] | None]) -> bool | None:
    """The value of `test` where the implementation is "sdpa": a comparison of `<x>._attn_implementation` with
    string literals (`==`, `!=`, `in`, `not in`), `self.<flag>` where every value `flag` gives the attribute is
    such a comparison deciding alike, and `not`, `and`, `or` of them; None when the test does not follow."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = implementation_test(test.operand, flag)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        parts = [implementation_test(v, flag) for v in test.values]
        decisive = isinstance(test.op, ast.Or)  # `or`: one True decides; `and`: one False
        if decisive in parts:
            return decisive
        return None if None in parts else not decisive
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if not (isinstance(left, ast.Attribute) and left.attr == "_attn_implementation"):
            return None
        if isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(right, ast.Constant) and isinstance(right.value, str):
            return (right.value == SDPA) == isinstance(op, ast.Eq)
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in right.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(names) != len(right.elts):
                return None
            return (SDPA in names) == isinstance(op, ast.In)
        return None
    attribute = self_attribute(test)
    values = flag(attribute) if attribute is not None else None
    if not values:
        return None
    decisions = {implementation_test(v, lambda _: None) for v in values}
    return decisions.pop() if len(decisions) == 1 and None not in decisions else None


def reads_implementation(function: ast.AST) -> bool:
    """Whether `function` reads the attention implementation or names what builds masks per implementation."""
    return any(
        isinstance(n, ast.Attribute) and n.attr in ("_attn_implementation", "attn_implementation")
        or isinstance(n, ast.Name) and n.id in PER_IMPLEMENTATION_HELPERS
        for n in ast.walk(function)
    )


def unknown_origin(node: ast.AST, why: str) -> Values:
    """An unknown origin at `node`'s line, saying why."""
    return frozenset({Origin(Kind.UNKNOWN, getattr(node, "lineno", 0), why)})


def shortened(node: ast.AST) -> str:
    """The source of `node`, cut to 40 characters."""
    text = ast.unparse(node)
    return text if len(text) <= 40 else text[:37] + "..."


def bind(state: State, names: Iterable[str], values: Values) -> State:
    """The state after `names` are assigned `values` (no longer known not None)."""
    names = set(names)
    if not names:
        return state
    env = dict(state.env)
    for name in names:
        env[name] = values
    return State(env, state.nonnull - names)


def join(left: State | None, right: State | None) -> State | None:
    """The state where control arrives from either side (None: a side that does not arrive)."""
    if left is None:
        return right
    if right is None:
        return left
    env = dict(left.env)
    for name, values in right.env.items():
        env[name] = env.get(name, frozenset()) | values
    return State(env, left.nonnull & right.nonnull)


def merged(left: State, right: State) -> State:
    """The join of two states that both arrive."""
    joined = join(left, right)
    assert joined is not None
    return joined


def refine(test: ast.expr, state: State) -> tuple[State, State]:
    """The states where `test` is true and where it is false: `x is not None` (in an `and` chain), `x is None`."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        yes, no = refine(test.operand, state)
        return no, yes
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        yes = state
        for value in test.values:
            yes = refine(value, yes)[0]
        return yes, state
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        no = state
        for value in test.values:
            no = refine(value, no)[1]
        return state, no
    compared = none_comparison(test)
    if compared is not None:
        name, is_not = compared
        present = state.env.get(name, frozenset())
        not_none = State(
            {**state.env, name: frozenset(v for v in present if not (isinstance(v, Origin) and v.kind is Kind.NONE))},
            state.nonnull | {name},
        )
        none = State({**state.env, name: frozenset({Origin(Kind.NONE, test.lineno)})}, state.nonnull - {name})
        return (not_none, none) if is_not else (none, not_none)
    return state, state


def none_comparison(test: ast.expr) -> tuple[str, bool] | None:
    """`name is None` -> (name, False), `name is not None` -> (name, True); None for any other test."""
    if (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Is, ast.IsNot))
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        return test.left.id, isinstance(test.ops[0], ast.IsNot)
    return None



def bound_argument(use: ModuleCall, function: ast.FunctionDef, param: str, derive: bool = False) -> ast.expr | Origin:
    """The argument a call binds to `param` of `function` (a method: `self` is not passed), or the origin of the
    value it gets otherwise (its None default, any constant default when deriving, or unknown)."""
    line = use.call.lineno
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    positional = arg_names(function)[0 if static else 1 :]
    for keyword in use.keywords:
        if keyword.arg == param:
            return keyword.value
    starred = next((i for i, a in enumerate(use.args) if isinstance(a, ast.Starred)), None)
    if param in positional:
        index = positional.index(param)
        if starred is not None and starred <= index:
            return Origin(Kind.UNKNOWN, line, f"`*{shortened(use.args[starred])}`, which may hold `{param}`")
        if index < len(use.args):
            return use.args[index]
    spread = [k.value for k in use.keywords if k.arg is None]
    typed = all(isinstance(v, ast.Name) and v.id == use.typed_kwargs for v in spread)
    if spread and typed and derive:
        # the caller's own typed keywords, never written to: what the model's callers passed
        return Origin(Kind.INPUT, line, f"`**{use.typed_kwargs}`")
    if spread and not (typed and "mask" in param):
        return Origin(Kind.UNKNOWN, line, f"`**` keywords, which may hold `{param}`")
    default = parameter_default(function, param)
    if isinstance(default, ast.Constant) and (default.value is None or derive):
        return Origin(Kind.NONE, line)
    return Origin(Kind.UNKNOWN, line, f"`{param}`, not passed")


def arg_names(function: ast.FunctionDef) -> list[str]:
    """The names of the positional parameters of `function`, `self` included."""
    return [a.arg for a in [*function.args.posonlyargs, *function.args.args]]


def self_attribute(node: ast.AST) -> str | None:
    """`self.<name>`: the name."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None
