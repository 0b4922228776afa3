"""Whether a class-style SDPA class may read a None mask as causal where `self.is_causal` holds (read-only).

With the `_for_sdpa` helpers a layer gets None both for a causal mask that masks nothing else (the causal helper) and
for no mask at all (the plain helper, the inherited `get_extended_attention_mask`, a None the file passes itself).
The SDPA class tells them apart by `self.is_causal`, a fact of the module, so the two must agree at every module
the file builds: where `self.is_causal` is True, every mask reaching it on the SDPA side (in self-attention calls)
is the causal helper's; where it is False, none is (nor any mask of unknown origin). Causality the caller chooses
per call (a model picking its helper by an `is_decoder` argument, as BLIP's and LAVIS's text models do) fails
both, since one module receives both kinds of mask: the causal helper keeps its full masks there.
"""

from __future__ import annotations

import ast
from typing import Sequence

import libcst as cst

from sdpa_port.analyse.mask_flow import MaskFlow
from sdpa_port.analyse.mask_helpers import MaskHelpers
from sdpa_port.analyse.mask_values import Kind
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.module_sites import Construction, module_sites, parameter_default

NOT_CAUSAL_SAFE = frozenset({Kind.BIDIRECTIONAL, Kind.NONE})  # kinds a module not marked causal may receive


def marks_follow_masks(
    facts: ModuleFacts, helpers: MaskHelpers, class_name: str, mask_param: str, key_only: Sequence[str]
) -> bool:
    """Every module built from `class_name` is marked causal exactly where the masks `mask_param` receives are the
    causal helper's."""
    flow = MaskFlow(facts, helpers=helpers)
    constructions = [c for c in flow.modules.constructions() if c.class_name == class_name]
    if not constructions or any(c.site is None for c in constructions):
        return False
    marks: dict[tuple[str, str], set[bool | None]] = {}
    for construction in constructions:
        assert construction.site is not None
        marks.setdefault(construction.site.key, set()).add(_marked(facts, class_name, construction))
    for site in flow.modules.sites_of({class_name}):
        found = marks.get(site.key, {None})
        if len(found) != 1 or None in found:
            return False
        masks = flow.site_masks(site, class_name, mask_param, key_only)
        cross_only = masks.cross_calls and not masks.calls and not masks.origins  # the contract asks for no keys
        if found == {True} and masks.causal is not True and not cross_only:
            return False
        if found == {False} and not masks.kinds <= NOT_CAUSAL_SAFE:
            return False
    return True


def _marked(facts: ModuleFacts, class_name: str, construction: Construction) -> bool | None:
    """`self.is_causal` of the module built there: a literal the class always assigns, or the `is_causal` argument
    of `__init__` it stores (passed as a literal keyword, or left at a literal default); None otherwise."""
    values = facts.find_attribute_values(class_name, "is_causal")
    literals = {_literal(v) for v in values}
    if len(literals) == 1 and None not in literals:
        return literals.pop()
    if not values or not all(isinstance(v, cst.Name) and v.value == "is_causal" for v in values):
        return None
    if construction.is_causal is not None:
        return {"True": True, "False": False}.get(construction.is_causal)
    call = construction.call
    init = module_sites(facts).method(class_name, "__init__")
    if call is None or init is None:
        return None
    params = [a.arg for a in [*init[1].args.posonlyargs, *init[1].args.args]][1:]
    spread = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
    if spread or ("is_causal" in params and len(call.args) > params.index("is_causal")):
        return None  # passed positionally, or maybe through `*args`/`**kwargs`
    default = parameter_default(init[1], "is_causal")
    if isinstance(default, ast.Constant) and isinstance(default.value, bool):
        return default.value
    return None


def _literal(value: cst.BaseExpression) -> bool | None:
    if isinstance(value, cst.Name) and value.value in ("True", "False"):
        return value.value == "True"
    return None


__all__ = ["marks_follow_masks"]
