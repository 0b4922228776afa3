"""Products computed by a module of the file that only multiplies: `self.matmul_qk(query, key)` (read-only).

Remote code built for quantisation often routes its products through modules (`self.matmul_qk = MatMul()` in
`__init__`, `class MatMul(nn.Module)` whose forward is `return torch.matmul(a, b)`). A call of such a module is the
product it returns, its operands the call's arguments, when:

- every value the class ever assigns to the attribute is a call of one class of the file, with no argument unpacked;
- that class, and each class of the file it derives from, derives only from `nn.Module` or from such classes, and
  none of them defines `__call__` (the module runs its forward, and only that);
- its forward takes exactly two parameters besides `self`, without defaults or unpacking, and its body (after a
  docstring) is one `return` of their product in that order: `torch.matmul(a, b)`, `a @ b`, `a.matmul(b)`,
  `torch.bmm(a, b)` or `a.bmm(b)`.

A module doing anything more (a scale, a cast, a transpose, a read of `self`) is not one: its call is no product, and
the scores it returns are refused as any other unknown source of them (S107).
"""

from __future__ import annotations

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.cstutil import is_docstring
from sdpa_port.analyse.module_facts import Binding, ModuleFacts

_MODULE = "torch.nn.Module"


def module_product(
    node: cst.BaseExpression, facts: ModuleFacts, class_name: str | None, scope: p.Scope
) -> p.Product | None:
    """The product `self.<attribute>(a, b)` computes, when the attribute holds a module of the file that only
    multiplies its two arguments; None otherwise."""
    if class_name is None or not isinstance(node, cst.Call):
        return None
    attribute = p.self_attribute_name(node.func)
    if attribute is None or len(node.args) != 2 or any(a.keyword is not None or a.star for a in node.args):
        return None
    values = facts.find_attribute_values(class_name, attribute)
    if not values:
        return None
    forms = {_multiplying_class(value, facts) for value in values}
    if len(forms) != 1:
        return None
    (form,) = forms
    if form is None:
        return None
    left, right = (a.value for a in node.args)
    return p.Product(form, left, right, 3 if form is p.ProductForm.BMM else None)


def _multiplying_class(value: cst.BaseExpression, facts: ModuleFacts) -> p.ProductForm | None:
    """How the module a constructor call builds multiplies its two arguments, or None when it does anything else."""
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name) or p.has_star_args(value):
        return None
    name = value.func.value
    if name not in facts.classes or not _plain_module(name, facts, frozenset()):
        return None
    found = facts.find_method(name, "forward")
    if found is None or facts.find_method(name, "__call__") is not None:
        return None
    return _returned_product(found[1], facts)


def _plain_module(name: str, facts: ModuleFacts, seen: frozenset[str]) -> bool:
    """The class derives from `nn.Module` only, directly or through classes of the file that do."""
    info = facts.classes.get(name)
    if info is None or name in seen or not info.bases:
        return False
    for base in info.bases:
        if base in facts.classes:
            if not _plain_module(base, facts, seen | {name}):
                return False
        elif facts.imports.qualify(cst.parse_expression(base)) != _MODULE:
            return False
    return True


def _returned_product(forward: cst.FunctionDef, facts: ModuleFacts) -> p.ProductForm | None:
    params = forward.params
    if (
        params.posonly_params
        or params.kwonly_params
        or params.star_arg is not cst.MaybeSentinel.DEFAULT
        or params.star_kwarg is not None
        or forward.decorators
        or len(params.params) != 3
        or any(param.default is not None for param in params.params)
    ):
        return None
    first, second = (param.name.value for param in params.params[1:])
    body = [s for s in forward.body.body if not is_docstring(s)] if isinstance(forward.body, cst.IndentedBlock) else []
    if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1:
        return None
    returned = body[0].body[0]
    if not isinstance(returned, cst.Return) or returned.value is None:
        return None
    product = p.product(returned.value, _Imports(facts))
    if product is None or product.form not in (p.ProductForm.MATMUL, p.ProductForm.BMM, p.ProductForm.OPERATOR):
        return None
    operands = (product.left, product.right)
    if not all(isinstance(o, cst.Name) for o in operands):
        return None
    if tuple(o.value for o in operands if isinstance(o, cst.Name)) != (first, second):
        return None
    return product.form


class _Imports:
    """The file's imports, and nothing else: a forward's names are its own parameters."""

    def __init__(self, facts: ModuleFacts) -> None:
        self.facts = facts

    def qualify(self, node: cst.CSTNode) -> str | None:
        return self.facts.imports.qualify(node)

    def self_attribute(self, name: str) -> cst.BaseExpression | None:
        return None

    def local_value(self, name: str) -> cst.BaseExpression | None:
        return None

    def local_is_scalar(self, name: str) -> bool:
        return False

    def local_is_optional_scalar(self, name: str) -> bool:
        return False

    def self_attribute_values(self, name: str) -> tuple[cst.BaseExpression, ...]:
        return ()

    def self_attribute_bindings(self, name: str) -> tuple[Binding, ...]:
        return ()

    def module_function(self, name: str) -> cst.FunctionDef | None:
        return None

    def class_init(self, name: str) -> cst.FunctionDef | None:
        return None

    def class_methods(self) -> tuple[cst.FunctionDef, ...]:
        return ()
