"""Where a file builds its modules and where it calls them (read-only).

A *site* is a `self.<attribute> = ...` assignment building in-file modules: `self.self_attn = BartAttention(...)`,
`self.layers = nn.ModuleList([Layer(...) for ...])`, `self.self = attention_class(...)` with `attention_class = A if
cross else B`, `self.attn = ATTENTION_CLASSES[key](...)`. A *call* of a site runs its modules: `self.self_attn(...)`,
`for layer in self.layers: layer(...)`, `self.layers[i](...)`, chains through other modules
(`self.text_model.encoder.layer[i](...)`), `layer.forward(...)` and gradient checkpoints (`checkpoint(layer,
...)`). Any other use of a site's modules (returned, handed to a function) is an *escape*: what happens to them
there is not followed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

from sdpa_port.analyse.module_facts import ModuleFacts

CONTAINERS = ("ModuleList", "Sequential", "ModuleDict")
# `torch.utils.checkpoint.checkpoint(module, *args)`, `self._gradient_checkpointing_func(module.__call__, *args)`
CHECKPOINTS = ("checkpoint", "_gradient_checkpointing_func")
CHECKPOINT_OPTIONS = ("use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug")


@dataclass(frozen=True)
class Site:
    """A `self.<attribute> = ...` assignment building in-file modules."""

    owner: str  # the class whose method assigns the attribute
    attribute: str
    classes: tuple[str, ...]  # the in-file classes built there
    line: int  # the first construction
    container: bool  # a ModuleList (or like) of them
    direct: bool  # every construction calls the class by its name (a keyword can be added there)

    @property
    def name(self) -> str:
        return f"{self.owner}.{self.attribute}"

    @property
    def key(self) -> tuple[str, str]:
        return (self.owner, self.attribute)


@dataclass(frozen=True)
class Construction:
    """One call building an in-file class, with the site it is assigned to (None: not followed)."""

    class_name: str
    line: int
    site: Site | None
    is_causal: str | None  # the `is_causal=` argument it passes, as written; None when it passes none
    call: ast.Call | None = field(default=None, compare=False)  # the call itself

    @property
    def pinned(self) -> bool:
        return self.is_causal == "True"


@dataclass(frozen=True)
class ModuleCall:
    """A call running modules built at a site (or a method of the class), as written in some method."""

    site: tuple[str, str]
    classes: frozenset[str]
    call: ast.Call
    args: tuple[ast.expr, ...]
    keywords: tuple[ast.keyword, ...]
    context: tuple[str, str]  # (class defining the method, method)
    # the calling method's `**kwargs` when annotated as transformers' typed kwargs, which hold no mask
    typed_kwargs: str | None = None


MASKLESS_KWARGS = frozenset({"TransformersKwargs", "FlashAttentionKwargs"})  # TypedDicts without a mask among their keys


def typed_kwargs(function: ast.FunctionDef) -> str | None:
    """`kwargs` for `**kwargs: Unpack[TransformersKwargs]` (or FlashAttentionKwargs): keys known, none a mask."""
    kwarg = function.args.kwarg
    annotation = kwarg.annotation if kwarg is not None else None
    if not isinstance(annotation, ast.Subscript):
        return None
    if _last_name(annotation.value) != "Unpack" or _last_name(annotation.slice) not in MASKLESS_KWARGS:
        return None
    assert kwarg is not None
    for node in ast.walk(function):  # keys the method adds or a new binding would void the annotation
        if isinstance(node, ast.Name) and node.id == kwarg.arg and not isinstance(node.ctx, ast.Load):
            return None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == kwarg.arg:
            if not isinstance(node.ctx, ast.Load):
                return None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == kwarg.arg:
            if node.attr in ("update", "setdefault", "__setitem__"):
                return None
    return kwarg.arg


@dataclass(frozen=True)
class _Ref:
    """What an expression of a method holds: `self` or a module built at a site (element) or their container."""

    site: tuple[str, str] | None
    classes: frozenset[str]
    element: bool


def module_sites(facts: ModuleFacts) -> ModuleSites:
    """The file's module sites and calls, found once per file and shared by every pass that asks."""
    found = facts.derived.get("module_sites")
    if not isinstance(found, ModuleSites):
        found = ModuleSites(facts)
        facts.derived["module_sites"] = found
    return found


class ModuleSites:
    """The sites and calls of one file's modules, found on first use and kept."""

    def __init__(self, facts: ModuleFacts) -> None:
        self.facts = facts
        self.tree = facts.tree if facts.tree is not None else ast.Module(body=[], type_ignores=[])
        self.classes: dict[str, ast.ClassDef] = {}
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
        self._mro: dict[str, tuple[str, ...]] = {}
        self._sites: dict[tuple[str, str], Site] | None = None
        self._constructions: list[Construction] = []
        self._uses: list[ModuleCall] | None = None
        self._escapes: dict[tuple[str, str], list[int]] = {}

    def mro(self, name: str) -> tuple[str, ...]:
        if name not in self._mro:
            self._mro[name] = tuple(info.name for info in self.facts.mro(name))
        return self._mro[name]

    def method(self, class_name: str, name: str) -> tuple[str, ast.FunctionDef] | None:
        """The class defining `name` for instances of `class_name`, and its definition."""
        for owner in self.mro(class_name):
            node = self.classes.get(owner)
            if node is None:
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return owner, item
        return None

    def subclasses(self, name: str) -> set[str]:
        return {other for other in self.classes if name in self.mro(other)}

    def methods(self, class_name: str) -> Iterator[ast.FunctionDef]:
        for item in self.classes[class_name].body:
            if isinstance(item, ast.FunctionDef):
                yield item

    def is_pretrained(self, class_name: str) -> bool:
        return self.facts.is_subclass(class_name, "PreTrainedModel")

    # ------------------------------------------------------------------ sites

    @property
    def sites(self) -> dict[tuple[str, str], Site]:
        if self._sites is None:
            self._sites = {}
            self._scan_sites()
        return self._sites

    def sites_of(self, class_names: Iterable[str]) -> tuple[Site, ...]:
        wanted = set(class_names)
        return tuple(site for site in self.sites.values() if wanted & set(site.classes))

    def constructions(self) -> tuple[Construction, ...]:
        self.sites  # noqa: B018 (scanned with the sites)
        return tuple(self._constructions)

    def contained(self, class_name: str) -> frozenset[str]:
        """Classes whose modules are built, directly or further down, inside a module of `class_name`."""
        seen: set[str] = set()
        stack = [class_name]
        while stack:
            current = stack.pop()
            for site in self.sites.values():
                if site.owner in self.mro(current) or site.owner == current:
                    for built in site.classes:
                        if built not in seen:
                            seen.add(built)
                            stack.append(built)
        return frozenset(seen)

    def _scan_sites(self) -> None:
        assert self._sites is not None
        attributed: set[ast.Call] = set()
        for class_name in self.classes:
            for function in self.methods(class_name):
                aliases = _class_aliases(function, self.classes)
                stored = self._stored_locals(function, aliases)
                for node in ast.walk(function):
                    target_value = _self_assignment(node)
                    if target_value is None:
                        continue
                    attribute, value = target_value
                    built = stored.get(value.id) if isinstance(value, ast.Name) else self._built(value, aliases)
                    if built is None:
                        continue
                    classes, container, direct, calls = built
                    attributed.update(call for call, _ in calls)
                    key = (class_name, attribute)
                    line = min(call.lineno for call, _ in calls)
                    previous = self._sites.get(key)
                    if previous is not None:
                        classes = classes | frozenset(previous.classes)
                        container = container or previous.container
                        direct = direct and previous.direct
                        line = min(line, previous.line)
                    site = Site(class_name, attribute, tuple(sorted(classes)), line, container, direct)
                    self._sites[key] = site
                    for call, names in calls:
                        for name in names:
                            causal = _causal_argument(call)
                            self._constructions.append(Construction(name, call.lineno, site, causal, call))
        # re-point constructions at the final (merged) site of their attribute
        self._constructions = [
            Construction(c.class_name, c.line, self._sites[c.site.key] if c.site else None, c.is_causal, c.call)
            for c in self._constructions
        ]
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and node not in attributed:
                names = self._constructed_by(node.func, {})
                for name in names:
                    self._constructions.append(Construction(name, node.lineno, None, _causal_argument(node), node))

    def _stored_locals(
        self, function: ast.FunctionDef, aliases: Mapping[str, frozenset[str]]
    ) -> dict[str, _Built]:
        """Local names a method binds only to modules it builds and reads only to store them on `self` (or to set
        their attributes): `attention = Cls(...)` (in each branch), `attention.query = ...`, `self.x = attention`.
        Such a module is built at the site `self.x`."""
        assigned: dict[str, list[ast.expr]] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.For, ast.With, ast.comprehension)):
                for inner in ast.walk(node.target if not isinstance(node, ast.With) else node):
                    if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                        assigned.setdefault(inner.id, []).append(inner)  # bound otherwise: not followed
        allowed: set[int] = set()
        for node in ast.walk(function):
            stored_value = _self_assignment(node)
            if stored_value is not None and isinstance(stored_value[1], ast.Name):
                allowed.add(id(stored_value[1]))
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name):
                allowed.add(id(node.value))
        out: dict[str, _Built] = {}
        for name, values in assigned.items():
            parts = [self._built(v, aliases) if isinstance(v, ast.expr) and not isinstance(v, ast.Name) else None
                     for v in values]
            if any(p is None or p[1] for p in parts):
                continue
            reads = [
                n for n in ast.walk(function)
                if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
            ]
            if not reads or any(id(n) not in allowed for n in reads):
                continue
            out[name] = _union([p for p in parts if p is not None])
        return out

    def _constructed_by(self, func: ast.expr, aliases: Mapping[str, frozenset[str]]) -> frozenset[str]:
        """The in-file classes a call of `func` builds: `Cls`, an alias of classes, or `DICT[key]` of classes."""
        if isinstance(func, ast.Name):
            if func.id in self.classes:
                return frozenset({func.id})
            return aliases.get(func.id, frozenset())
        if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in self.facts.dicts:
            return frozenset(_dict_classes(self.tree, func.value.id, self.classes))
        return frozenset()

    def _built(
        self, value: ast.expr, aliases: Mapping[str, frozenset[str]]
    ) -> _Built | None:
        """(classes, container, direct, the construction calls) of a value assigned to `self.x`; None: builds none."""
        if isinstance(value, ast.IfExp):
            arms = [b for b in (self._built(value.body, aliases), self._built(value.orelse, aliases)) if b is not None]
            return _union(arms) if arms else None
        if isinstance(value, ast.Call):
            names = self._constructed_by(value.func, aliases)
            if names:
                return (
                    names,
                    False,
                    isinstance(value.func, ast.Name) and value.func.id in self.classes,
                    [(value, names)],
                )
            func_name = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
            if func_name in CONTAINERS and len(value.args) == 1 and not value.keywords:
                inner = self._elements(value.args[0], aliases)
                if inner is not None:
                    return inner[0], True, inner[1], inner[2]
        if isinstance(value, (ast.List, ast.ListComp, ast.GeneratorExp)):
            inner = self._elements(value, aliases)
            if inner is not None:
                return inner[0], True, inner[1], inner[2]
        return None

    def _elements(
        self, value: ast.expr, aliases: Mapping[str, frozenset[str]]
    ) -> tuple[frozenset[str], bool, list[tuple[ast.Call, frozenset[str]]]] | None:
        if isinstance(value, (ast.ListComp, ast.GeneratorExp)):
            built = self._built(value.elt, aliases)
            return None if built is None or built[1] else (built[0], built[2], built[3])
        if isinstance(value, ast.List):
            parts = [self._built(element, aliases) for element in value.elts]
            found = [p for p in parts if p is not None and not p[1]]
            if not found or len(found) != len(parts):
                return None
            return (
                frozenset().union(*(p[0] for p in found)),
                all(p[2] for p in found),
                [c for p in found for c in p[3]],
            )
        return None

    # ------------------------------------------------------------------ calls made through sites

    @property
    def uses(self) -> list[ModuleCall]:
        if self._uses is None:
            found: list[ModuleCall] = []
            for class_name in self.classes:
                for function in self.methods(class_name):
                    found.extend(self._scan_uses(class_name, function))
            self._uses = found
        return self._uses

    def holder(self, class_name: str, attribute: str) -> Site | None:
        """The site building `class_name`'s attribute, in its class or a base."""
        for owner in self.mro(class_name):
            site = self.sites.get((owner, attribute))
            if site is not None:
                return site
        return None

    def _resolve(self, node: ast.expr, class_name: str, names: Mapping[str, frozenset[_Ref]]) -> frozenset[_Ref]:
        if isinstance(node, ast.Name):
            if node.id == "self":
                return frozenset({_Ref(None, frozenset({class_name}), True)})
            return names.get(node.id, frozenset())
        if isinstance(node, ast.Attribute):
            out: set[_Ref] = set()
            for ref in self._resolve(node.value, class_name, names):
                if not ref.element:
                    continue
                for held in ref.classes:
                    site = self.holder(held, node.attr)
                    if site is not None:
                        out.add(_Ref(site.key, frozenset(site.classes), not site.container))
            return frozenset(out)
        if isinstance(node, ast.Subscript):
            refs = self._resolve(node.value, class_name, names)
            sliced = isinstance(node.slice, ast.Slice)
            return frozenset(_Ref(r.site, r.classes, not sliced) for r in refs if not r.element)
        return frozenset()

    def _scan_uses(self, class_name: str, function: ast.FunctionDef) -> list[ModuleCall]:
        found: list[ModuleCall] = []
        names: dict[str, frozenset[_Ref]] = {}
        for _ in range(3):  # aliases of aliases
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    refs = self._resolve(node.value, class_name, names)
                    if refs:
                        names[node.targets[0].id] = names.get(node.targets[0].id, frozenset()) | refs
                elif isinstance(node, (ast.For, ast.comprehension)):
                    for target, iterable in _loop_bindings(node):
                        refs = frozenset(
                            _Ref(r.site, r.classes, True)
                            for r in self._resolve(iterable, class_name, names)
                            if not r.element
                        )
                        if refs and isinstance(target, ast.Name):
                            names[target.id] = names.get(target.id, frozenset()) | refs
        parents = _parents(function)
        context = (class_name, function.name)
        for node in ast.walk(function):
            if not isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
                continue
            held = [r for r in self._resolve(node, class_name, names) if r.site is not None]
            if not held:
                continue
            parent = parents.get(node)
            call = self._call_of(node, parent, parents)
            if call is not None:
                func_call, args, keywords = call
                for ref in held:
                    if ref.element and ref.site is not None:
                        found.append(
                            ModuleCall(ref.site, ref.classes, func_call, args, keywords, context, typed_kwargs(function))
                        )
                continue
            if _harmless(node, parent, parents):
                continue
            for ref in held:
                if ref.site is not None:
                    self._escapes.setdefault(ref.site, []).append(getattr(node, "lineno", 0))
        return found

    def _call_of(
        self, node: ast.expr, parent: ast.AST | None, parents: Mapping[ast.AST, ast.AST]
    ) -> tuple[ast.Call, tuple[ast.expr, ...], tuple[ast.keyword, ...]] | None:
        """The call running `node`'s module: `node(...)`, `node.forward(...)`, or a gradient checkpoint of it."""
        if isinstance(parent, ast.Call) and parent.func is node:
            return parent, tuple(parent.args), tuple(parent.keywords)
        if isinstance(parent, ast.Attribute) and parent.attr in ("forward", "__call__"):
            grand = parents.get(parent)
            if isinstance(grand, ast.Call) and grand.func is parent:
                return grand, tuple(grand.args), tuple(grand.keywords)
            node, parent = parent, grand
        if isinstance(parent, ast.Call) and parent.args and parent.args[0] is node and _is_checkpoint(parent.func):
            keywords = tuple(k for k in parent.keywords if k.arg not in CHECKPOINT_OPTIONS)
            return parent, tuple(parent.args[1:]), keywords
        return None

    def escapes(self, site: tuple[str, str]) -> list[int]:
        """The lines where modules of the site are used in a way not followed."""
        self.uses  # noqa: B018 (found with the calls)
        return self._escapes.get(site, [])


def parameter_default(function: ast.FunctionDef, param: str) -> ast.expr | None:
    """The default of a function's parameter, None when it has none (or no such parameter)."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    offset = len(positional) - len(args.defaults)
    for index, arg in enumerate(positional):
        if arg.arg == param:
            return args.defaults[index - offset] if index >= offset else None
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        if arg.arg == param:
            return default
    return None


def _last_name(node: ast.expr) -> str:
    """`x` for `x` and for `a.b.x`; "" for anything else."""
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _is_checkpoint(func: ast.expr) -> bool:
    return _last_name(func) in CHECKPOINTS


# what a value assigned to `self.x` builds: (classes, container, direct, the construction calls with their classes)
_Built = tuple[frozenset[str], bool, bool, list[tuple[ast.Call, frozenset[str]]]]


def _union(parts: list[_Built]) -> _Built:
    """What one of several values builds (the arms of `a if c else b`, a local bound in each branch)."""
    return (
        frozenset().union(*(p[0] for p in parts)),
        any(p[1] for p in parts),
        all(p[2] for p in parts),
        [c for p in parts for c in p[3]],
    )


def _self_assignment(node: ast.AST) -> tuple[str, ast.expr] | None:
    """`self.<attribute> = <value>` (or annotated): the attribute and the value."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return target.attr, value
    return None


def _class_aliases(function: ast.FunctionDef, classes: Mapping[str, ast.ClassDef]) -> dict[str, frozenset[str]]:
    """Local names bound to in-file classes (`attention_class = A if cross else B`)."""
    out: dict[str, frozenset[str]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            names = _class_names(node.value, classes)
            if names:
                out[node.targets[0].id] = out.get(node.targets[0].id, frozenset()) | names
    return out


def _class_names(node: ast.expr, classes: Mapping[str, ast.ClassDef]) -> frozenset[str]:
    if isinstance(node, ast.Name) and node.id in classes:
        return frozenset({node.id})
    if isinstance(node, ast.IfExp):
        body, orelse = _class_names(node.body, classes), _class_names(node.orelse, classes)
        return body | orelse if body and orelse else frozenset()
    return frozenset()


def _dict_classes(tree: ast.Module, name: str, classes: Mapping[str, ast.ClassDef]) -> set[str]:
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Dict):
                out |= {v.id for v in node.value.values if isinstance(v, ast.Name) and v.id in classes}
    return out


def _causal_argument(call: ast.Call) -> str | None:
    for keyword in call.keywords:
        if keyword.arg == "is_causal":
            return ast.unparse(keyword.value)
    return None


def _loop_bindings(loop: ast.For | ast.comprehension) -> list[tuple[ast.expr, ast.expr]]:
    """(loop variable, what it runs over) for a loop over modules: `for x in m`, `for x in reversed(m)`, `for i, x in
    enumerate(m)`, and each variable of `for x, y in zip(m, n)`."""
    iterable, target = loop.iter, loop.target
    if not (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and not iterable.keywords):
        return [(target, iterable)]
    name, args = iterable.func.id, iterable.args
    if name == "reversed" and len(args) == 1:
        return [(target, args[0])]
    if name == "enumerate" and len(args) == 1:
        return [(target.elts[1], args[0])] if isinstance(target, ast.Tuple) and len(target.elts) == 2 else []
    if name == "zip" and _zipped(loop):
        assert isinstance(target, ast.Tuple)
        return list(zip(target.elts, args))
    return [(target, iterable)]


def _zipped(loop: ast.AST) -> bool:
    """`for x, y in zip(m, n)`: one plain variable per zipped iterable."""
    if not isinstance(loop, (ast.For, ast.comprehension)):
        return False
    iterable, target = loop.iter, loop.target
    return (
        isinstance(iterable, ast.Call)
        and isinstance(iterable.func, ast.Name)
        and iterable.func.id == "zip"
        and not iterable.keywords
        and not any(isinstance(a, ast.Starred) for a in iterable.args)
        and isinstance(target, ast.Tuple)
        and len(target.elts) == len(iterable.args)
        and all(isinstance(e, ast.Name) for e in target.elts)
    )


def _parents(function: ast.AST) -> dict[ast.AST, ast.AST]:
    out: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(function):
        for child in ast.iter_child_nodes(node):
            out[child] = node
    return out


def _harmless(node: ast.expr, parent: ast.AST | None, parents: Mapping[ast.AST, ast.AST]) -> bool:
    """A reference to modules of a site that neither calls them nor hands them away: an attribute read, an index,
    a loop over them, an alias, a test, `len`, or the assignment building them."""
    if isinstance(parent, (ast.Attribute, ast.Subscript)) and parent.value is node:
        return True
    if isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is node:
        return True
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and node in parent.args:
        if parent.func.id in ("len", "isinstance", "hasattr", "id", "type"):
            return True
        grand = parents.get(parent)
        if (
            parent.func.id in ("enumerate", "reversed")
            and isinstance(grand, (ast.For, ast.comprehension))
            and grand.iter is parent
        ):
            return True
        if parent.func.id == "zip" and grand is not None and _zipped(grand) and getattr(grand, "iter", None) is parent:
            return True
    if isinstance(parent, ast.Assign) and node in parent.targets:
        return True
    if isinstance(parent, ast.Assign) and parent.value is node:
        return all(isinstance(target, ast.Name) for target in parent.targets)  # an alias, followed
    if isinstance(parent, (ast.AnnAssign, ast.AugAssign)) and parent.target is node:
        return True
    if isinstance(parent, (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.If, ast.IfExp, ast.While, ast.Assert)):
        return not (isinstance(parent, ast.IfExp) and parent.test is not node)
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return True
    return False


__all__ = ["Construction", "ModuleCall", "ModuleSites", "Site"]
