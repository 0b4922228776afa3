"""The values of the tests of branches, certain or on the default path (`live.py` says which tests are which).

`Evaluator.truth` reads a test: True, False, or None where it cannot tell. Certain (`default=False`): literals, module
constants and constant attributes. On the default path (`default=True`), at one torch version: also `hasattr(F,
"scaled_dot_product_attention")`, torch version checks, requests for the weights, parameters' literal defaults and what
the constructor leaves on `self` with them.
"""

from __future__ import annotations

import ast
import collections
import re
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from sdpa_port.discover.bindings import SDPA, Bindings, dotted, self_attr, walk_list

# the parameters by which a call asks an attention module for its weights, in the order they are looked for:
# transformers' `output_attentions`, and `need_weights` of fairseq's and torch's multi-head attention (on by default
# there: the SDPA class falls back for it, and a port whose every call leaves it on is refused, W406); remote code
# names it otherwise: `return_attention` (OSTrack), `need_attn`, `output_attention`
WEIGHT_REQUESTS = (
    "output_attentions",
    "need_weights",
    "return_attention",
    "return_attentions",
    "return_attn",
    "output_attention",
    "need_attn",
    "return_attention_weights",
)
# names of caches, which feed only the keys (`analyse/cross.py`)
CACHE_WORDS = ("past", "cache", "layer_state")


def optional_input(name: str) -> bool:
    """A parameter a call passes only to ask for something extra (a head mask, a graph re-weighting the
    probabilities), not one every call passes: masks, caches, key/value states. Left at None, it is off on the default
    path; the SDPA class falls back to eager where it is given (`analyse/optional_facts.py`)."""
    masks = is_mask_parameter(name) and "head_mask" not in name
    return not masks and not is_cache_parameter(name) and "states" not in name


def is_cache_parameter(name: str) -> bool:
    return any(word in name for word in CACHE_WORDS)


def is_mask_parameter(name: str) -> bool:
    return "mask" in name


# the torch releases a version check is read at: the first with SDPA, and the one this project tests against
TORCH_VERSIONS = ("2.0.0", "2.13.0")
_VERSION_PARSERS = frozenset({"parse", "Version", "LooseVersion", "StrictVersion", "parse_version"})
# attributes the frameworks set on modules from outside, by name: torch's `train()`, Transformers'
# `gradient_checkpointing_enable()`; never constant, whatever the file assigns them
SET_FROM_OUTSIDE = frozenset({"training", "gradient_checkpointing"})
_TORCH_FLAG = re.compile(r"is_torch_greater_or_equal_than_(\d+)_(\d+)$")


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()
NOWHERE = object()  # `_local`: the function binds the name nowhere (None is a value: a parameter's default)
Truth = bool | None


@dataclass
class Scope:
    """Where an expression is read: the top-level class whose `self` it may read, and the function."""

    owner: str | None = None
    function: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    # while `__init__` is read for the defaults it leaves: what it has set on `self` so far
    init_env: dict[str, object] | None = None


class Evaluator:
    """Reads tests: certain (`default=False`: literals, module constants, constant attributes) or on the default
    path, at one torch version."""

    def __init__(self, bindings: Bindings, default: bool = False, torch_version: str = TORCH_VERSIONS[0]) -> None:
        self.bindings = bindings
        self.default = default
        self.torch_version = torch_version
        self._init_defaults: dict[str, dict[str, object]] = {}
        self._local_bindings: dict[int, collections.Counter[str]] = {}
        self._reading: set[int] = set()  # expressions being read (a name defined from itself)

    # -------------------------------------------------------------- truth

    def truth(self, node: ast.expr, scope: Scope) -> Truth:
        if isinstance(node, ast.BoolOp):
            truths = [self.truth(value, scope) for value in node.values]
            if isinstance(node.op, ast.And):
                return False if False in truths else True if all(t is True for t in truths) else None
            return True if True in truths else False if all(t is False for t in truths) else None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.truth(node.operand, scope)
            return None if inner is None else not inner
        value = self.value(node, scope)
        if value is UNKNOWN:
            return None
        try:
            return bool(value)
        except Exception:  # noqa: BLE001 - a value without a truth is unknown
            return None

    # -------------------------------------------------------------- values

    def value(self, node: ast.expr, scope: Scope) -> object:
        if id(node) in self._reading:
            return UNKNOWN
        self._reading.add(id(node))
        try:
            return self._value(node, scope)
        finally:
            self._reading.discard(id(node))

    def _value(self, node: ast.expr, scope: Scope) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self._name(node.id, scope)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return self._attribute(node.attr, scope)
            if not self.default:
                return UNKNOWN
            if node.attr == "__version__" and dotted(node.value, self.bindings.imports) == "torch":
                return self.torch_version
            inner = self.value(node.value, scope)
            return _version_attribute(inner, node.attr)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            truth = self.truth(node, scope)
            return UNKNOWN if truth is None else truth
        if isinstance(node, ast.BoolOp):
            values = [self.value(value, scope) for value in node.values]
            if UNKNOWN in values:
                return UNKNOWN
            pick = next((v for v in values[:-1] if bool(v) is isinstance(node.op, ast.Or)), values[-1])
            return pick
        if isinstance(node, ast.Compare):
            return self._compare(node, scope)
        if not self.default:
            return UNKNOWN
        if isinstance(node, ast.Call):
            return self._call(node, scope)
        if isinstance(node, ast.Subscript):
            return _subscript(self.value(node.value, scope), node.slice, lambda n: self.value(n, scope))
        if isinstance(node, ast.Tuple):
            items = [self.value(item, scope) for item in node.elts]
            return UNKNOWN if UNKNOWN in items else tuple(items)
        return UNKNOWN

    def _compare(self, node: ast.Compare, scope: Scope) -> object:
        left = self.value(node.left, scope)
        if left is UNKNOWN:
            return UNKNOWN
        for op, comparator in zip(node.ops, node.comparators):
            right = self.value(comparator, scope)
            if right is UNKNOWN:
                return UNKNOWN
            outcome = _compared(op, left, right)
            if outcome is not True:
                return outcome
            left = right
        return True

    def _call(self, node: ast.Call, scope: Scope) -> object:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        args = node.args
        if name == "hasattr" and len(args) == 2 and isinstance(func, ast.Name) and not self.bindings.names[name]:
            if self.bindings.is_functional(args[0]) and isinstance(args[1], ast.Constant) and args[1].value == SDPA:
                return True
            return UNKNOWN
        if node.keywords or len(args) > 1 or any(isinstance(a, ast.Starred) for a in args):
            return UNKNOWN
        argument = self.value(args[0], scope) if args else UNKNOWN
        if isinstance(func, ast.Attribute) and name == "split":
            receiver = self.value(func.value, scope)
            if not isinstance(receiver, str):
                return UNKNOWN
            if not args:
                return receiver.split()
            return receiver.split(argument) if isinstance(argument, str) and argument else UNKNOWN
        if isinstance(func, ast.Name) and name in ("int", "float", "str") and self.bindings.names[name] == 0:
            try:
                return {"int": int, "float": float, "str": str}[name](argument)
            except (TypeError, ValueError):
                return UNKNOWN
        if name in _VERSION_PARSERS and isinstance(argument, str):
            return _release(argument)
        return UNKNOWN

    def _name(self, name: str, scope: Scope) -> object:
        bindings = self.bindings
        if self.default and scope.function is not None:
            local = self._local(name, scope)
            if local is not NOWHERE:
                return local
        if bindings.names[name] != 1:
            return UNKNOWN
        match = _TORCH_FLAG.search(name)
        if self.default and match and name in bindings.imports:
            floor = (int(match.group(1)), int(match.group(2)))
            return _release(self.torch_version)[:2] >= floor
        assigned = _module_assignment(bindings, name)
        if assigned is None:
            return UNKNOWN
        if isinstance(assigned, ast.Constant) or self.default:
            return self.value(assigned, Scope())
        return UNKNOWN

    def _local(self, name: str, scope: Scope) -> object:
        """A name bound in the function being read: its value on the default path, UNKNOWN, or NOWHERE where the
        function binds it nowhere (a module-level name)."""
        function = scope.function
        assert function is not None
        counts = self._local_bindings.get(id(function))
        if counts is None:
            counts = collections.Counter()
            for node in walk_list(function):
                if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                    counts[node.id] += 1
                elif isinstance(node, ast.arg):
                    counts[node.arg] += 1
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not function:
                    counts[node.name] += 1
            self._local_bindings[id(function)] = counts
        if not counts[name]:
            return NOWHERE
        arguments = function.args
        positional = [*arguments.posonlyargs, *arguments.args]
        defaults: dict[str, ast.expr | None] = dict.fromkeys((a.arg for a in positional), None)
        defaults.update(zip((a.arg for a in positional[len(positional) - len(arguments.defaults):]), arguments.defaults))
        defaults.update((a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults))
        if name in defaults:
            if counts[name] > 1:
                return UNKNOWN  # a parameter bound again
            if name in WEIGHT_REQUESTS:
                return False  # the default path asks for no weights
            default = defaults[name]
            if isinstance(default, ast.Constant) and default.value is None and not optional_input(name):
                return UNKNOWN  # an input every call passes (a mask): None only where no caller gives one
            return default.value if isinstance(default, ast.Constant) else UNKNOWN
        if counts[name] > 1:
            return UNKNOWN
        for node in walk_list(function):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == name
            ):
                return self.value(node.value, scope)
        return UNKNOWN

    def _attribute(self, attr: str, scope: Scope) -> object:
        if scope.init_env is not None:
            return scope.init_env.get(attr, UNKNOWN)
        if scope.owner is None or self.bindings.dynamic or attr in SET_FROM_OUTSIDE:
            return UNKNOWN
        constant = _constant_attribute(self.bindings, scope.owner, attr)
        if constant is not UNKNOWN or not self.default:
            return constant
        classes = self.bindings.definitions.mro(scope.owner)
        built = next((node for node in classes if init_of(node) is not None), None)
        if built is None:
            return UNKNOWN
        init = init_of(built)
        assert init is not None
        if self.bindings.attributes[attr] != sum(1 for _ in _self_stores(init, attr)):
            return UNKNOWN  # set outside the constructor that runs too
        env = self._init_defaults.get(built.name)
        if env is None:
            env = self._init_defaults[built.name] = {}
            self._run_init(init.body, env, Scope(built.name, init, env))
        return env.get(attr, UNKNOWN)

    def _run_init(self, statements: Sequence[ast.stmt], env: dict[str, object], scope: Scope) -> bool:
        """What `__init__` leaves on `self` on the default path, into `env`; False where the statements return."""
        for statement in statements:
            if isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                single = len(targets) == 1 and self_attr(targets[0]) is not None
                for target in targets:
                    for node in walk_list(target):
                        attr = self_attr(node)
                        if attr is not None:
                            env[attr] = UNKNOWN
                if single and statement.value is not None:
                    env[self_attr(targets[0]) or ""] = self.value(statement.value, scope)
            elif isinstance(statement, ast.If):
                truth = self.truth(statement.test, scope)
                if truth is not None:
                    if not self._run_init(statement.body if truth else statement.orelse, env, scope):
                        return False
                    continue
                sides = []
                for side in (statement.body, statement.orelse):
                    copied = dict(env)
                    sides.append((copied, self._run_init(side, copied, Scope(scope.owner, scope.function, copied))))
                going = [copied for copied, goes_on in sides if goes_on]
                if not going:
                    return False
                for key in set().union(*going):
                    values = [copied.get(key, UNKNOWN) for copied in going]
                    env[key] = values[0] if all(_same(v, values[0]) for v in values) else UNKNOWN
            elif isinstance(statement, (ast.Return, ast.Raise)):
                return False
            elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            else:  # loops, `with`, `try`: what they set is unknown
                for node in walk_list(statement):
                    attr = self_attr(node)
                    if attr is not None and isinstance(getattr(node, "ctx", None), ast.Store):
                        env[attr] = UNKNOWN
        return True


def _same(a: object, b: object) -> bool:
    return a is not UNKNOWN and b is not UNKNOWN and type(a) is type(b) and a == b


def _compared(op: ast.cmpop, left: object, right: object) -> object:
    try:
        if isinstance(op, (ast.Is, ast.IsNot)):
            if not any(v is None or isinstance(v, bool) for v in (left, right)):
                return UNKNOWN
            return (left is right) is isinstance(op, ast.Is)
        operators: dict[type, Callable[[object, object], object]] = {
            ast.Eq: lambda a, b: a == b,
            ast.NotEq: lambda a, b: a != b,
            ast.Lt: lambda a, b: a < b,  # type: ignore[operator]
            ast.LtE: lambda a, b: a <= b,  # type: ignore[operator]
            ast.Gt: lambda a, b: a > b,  # type: ignore[operator]
            ast.GtE: lambda a, b: a >= b,  # type: ignore[operator]
        }
        compare = operators.get(type(op))
        return UNKNOWN if compare is None else bool(compare(left, right))
    except TypeError:
        return UNKNOWN


def _release(version: str) -> tuple[int, ...]:
    """A version's release numbers: `2.13.0+cpu` gives (2, 13, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("a")[0].split("rc")[0])[:3])


def _version_attribute(value: object, attr: str) -> object:
    if isinstance(value, tuple):
        if attr == "release":
            return value
        if attr in ("major", "minor", "micro"):
            index = ("major", "minor", "micro").index(attr)
            return value[index] if len(value) > index else 0
    return UNKNOWN


def _subscript(value: object, index: ast.expr, read: Callable[[ast.expr], object]) -> object:
    if not isinstance(value, (str, list, tuple)):
        return UNKNOWN
    if isinstance(index, ast.Slice):
        bounds = [None if part is None else read(part) for part in (index.lower, index.upper, index.step)]
        numbers = [b for b in bounds if b is None or isinstance(b, int)]
        if len(numbers) != len(bounds):
            return UNKNOWN
        return value[slice(*numbers)]
    position = read(index)
    if not isinstance(position, int) or isinstance(position, bool):
        return UNKNOWN
    try:
        return value[position]
    except IndexError:
        return UNKNOWN


def init_of(node: ast.ClassDef) -> ast.FunctionDef | None:
    return next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)


def _self_stores(function: ast.FunctionDef, attr: str) -> Iterator[ast.Attribute]:
    for node in walk_list(function):
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load) and self_attr(node) == attr:
            yield node


def _module_assignment(bindings: Bindings, name: str) -> ast.expr | None:
    """The value of the one module-level `name = value`, where that is how the name is bound."""
    for statement in bindings.definitions.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Name) and target.id == name:
                return statement.value
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if statement.target.id == name and statement.value is not None:
                return statement.value
    return None


def _constant_attribute(bindings: Bindings, owner: str, attr: str) -> object:
    """The literal `self.<attr>` holds in instances of `owner`: assigned once in the file, to a literal, in the
    `__init__` of the class or of an in-file base; UNKNOWN otherwise."""
    if bindings.attributes[attr] != 1 or bindings.dynamic or attr in SET_FROM_OUTSIDE:
        return UNKNOWN
    for node in bindings.definitions.mro(owner):
        init = init_of(node)
        if init is None:
            continue
        for statement in walk_list(init):
            if isinstance(statement, (ast.Assign, ast.AnnAssign)) and isinstance(statement.value, ast.Constant):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                if len(targets) == 1 and self_attr(targets[0]) == attr:
                    return statement.value.value
    return UNKNOWN
