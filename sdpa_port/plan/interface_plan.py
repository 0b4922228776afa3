"""What the interface style decides for one file: the classes it moves, those only flagged, and the file's edits.

`plan/interface_style.py` fills an `InterfacePlan`; `rewrite/interface_apply.py` makes its edits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from sdpa_port.analyse.module_sites import Construction
from sdpa_port.plan.causal_sites import CausalSites, KeptMasks
from sdpa_port.plan.mask_readers import EagerMasks, MaskRead
from sdpa_port.rewrite.alibi_masks import AlibiFacts
from sdpa_port.rewrite.thread_kwargs import Threading


@dataclass(frozen=True)
class ModulePlan:
    """One attention class moved onto the interface."""

    class_name: str
    forward: cst.FunctionDef
    eager: cst.FunctionDef
    store_config: bool  # `self.config = config` is missing
    add_config_parameter: bool  # __init__ has no `config` parameter: add one and pass it at constructions
    is_causal: str | None  # expression to assign in __init__, None when the class already sets it
    position_bias: bool = False  # the dispatch passes additive terms (ALiBi, relative positions) as position_bias
    # the dispatch folds the additive terms into the float mask it hands over (the release's sdpa reads no
    # position_bias), through the file's fold function where a mask or causality joins them (`fold_called`)
    folded: bool = False
    fold_called: bool = False
    # cache updates in forward given the forward's kwargs (`update(..., kwargs=kwargs)`), as the release's models do
    updates_with_kwargs: int = 0
    causal_sites: CausalSites | None = None  # __init__ takes `is_causal`, these sites pass True
    replaces_pinned: bool = False  # the class's own `self.is_causal = <literal>` in __init__ gives way to the above
    # lines of `create_*_mask(...).to(torch.bool)` handing this module its mask: the conversion is dropped and the
    # eager function adds the builder's mask where it filled (`bool_masks.py`)
    unconverted: frozenset[int] = frozenset()
    # methods of the class forward called for the attention, inlined into the eager function
    inlined: tuple[str, ...] = ()
    # tests of the `if`s whose branches beside the dispatch stay eager and take the mask in eager's form
    # (`EagerMask`): its form under the other implementations (2-D under flash, a BlockMask under flex, a kernel's
    # own) has none
    eager_mask_tests: tuple[str, ...] = ()
    # a mask parameter the code staying in forward reads itself (T5 adds it to its position bias): every mask the
    # file builds then takes eager's form (`plan/mask_readers.py`)
    reads_mask: MaskRead | None = None
    # the forward parameter handed over as the mask, and the key-only parameters of a module serving cross-attention
    mask_param: str | None = None
    cross: tuple[str, ...] = ()


@dataclass
class InterfacePlan:
    """The interface port of one file: the classes moved, those already on the interface, and the file's edits."""

    modules: list[ModulePlan] = field(default_factory=list)
    flag_only: list[str] = field(default_factory=list)  # classes already on the interface, given is_causal
    causal_for_flag_only: dict[str, str] = field(default_factory=dict)
    flag_only_sites: dict[str, CausalSites] = field(default_factory=dict)
    unpinned: list[Construction] = field(default_factory=list)  # `is_causal=True` that becomes False
    kept: list[KeptMasks] = field(default_factory=list)  # classes whose causality the always-built masks carry
    dicts: dict[str, str] = field(default_factory=dict)  # dict name -> eager class, for `.get(..., eager)` lookups
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # classes dispatching to an eager function imported from another model's file -> that module
    dispatching_elsewhere: dict[str, str] = field(default_factory=dict)
    threading: Threading | None = None  # how the models' **kwargs reach the moved modules
    # (class, line) of `torch.arange(past, n + past)` position ranges, rewritten so that a static cache exports
    shifted_ranges: list[tuple[str, int]] = field(default_factory=list)
    alibi: AlibiFacts | None = None  # ALiBi builders reading 2-D masks
    fold_function: str | None = None  # the module-level function folding additive terms into the mask, if any
    eager_masks: EagerMasks | None = None  # every mask the file builds takes eager's form, for modules reading it
    # why `_supports_flash_attn` may not be claimed (`plan/flash_proof.py`): "" where the proof holds, and a run of
    # the port through transformers' flash path is then to decide it (`verify/flash_claim.py`)
    no_flash: str = ""

    @property
    def attention_backend(self) -> bool:
        """`_supports_attention_backend`: every layer hands its callers' kwargs and position_ids to the
        implementation, and nothing the implementation may ignore (position_bias) carries the model's own terms."""
        return (
            self.threading is not None
            and self.threading.complete
            and not any(module.position_bias or module.folded for module in self.modules)
            and not (self.alibi is not None and self.alibi.unknown)
            and not self.kept
            and not any(module.eager_mask_tests for module in self.modules)
            and self.eager_masks is None
        )

    @property
    def edits(self) -> bool:
        """Whether the port changes the file at all."""
        return bool(self.modules or self.flag_only)


__all__ = ["InterfacePlan", "ModulePlan"]
