"""What the interface-style rewrite is told and hands on: its options, the eager mask, the eager function's part."""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Callable

import libcst as cst

from sdpa_port.rewrite.sdpa_state import SideNames

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
    # (`plan/causality.causality_in_chain`)
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
    # of `free`, those the eager function reads from its `**kwargs` (a flag with a default), not its signature
    from_kwargs: list[str] = field(default_factory=list)


HANDED_OVER = (0, 2, 1, 3)  # the attention interface's output: SDPA's (batch, heads, query, dim) as (b, q, h, d)
IN_PLACE = (0, 1, 2, 3)


def parameter_name(name: str) -> str:
    """Free values whose names the interface reserves get a trailing underscore inside the eager function."""
    return name + "_" if name in RESERVED else name
