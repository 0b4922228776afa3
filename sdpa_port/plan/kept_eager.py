"""Which refused attention classes can stay eager while the file's other attention classes are ported (read-only).

A file may hold an attention no exact SDPA call can express (BigBird's block-sparse attention, Longformer's sliding
window) beside ones it can (BigBird's full attention). Porting the others is exact for the refused class too, as
long as the port cannot change what that class computes:

- nothing built per implementation reaches it: every parameter of its forward holds, in every call the file makes,
  values computed only from the model's inputs, its own modules and constants, never from a mask builder, a 4.x
  mask helper (a class-style port swaps those for their SDPA variants) or anything reading `_attn_implementation`
  (`MaskFlow(derive=True)`); its `**kwargs`, if any, are typed and carry no mask;
- it reads no implementation itself, is no entry of a dict of attention classes, and shares no inheritance with a
  ported class (whose `__init__` and `forward` the port changes);
- it is built in this file (a class built elsewhere receives masks this file cannot see).

Otherwise its refusal stands for the whole file, with the reason it cannot stay eager added.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdpa_port.analyse.known import holds_where
from sdpa_port.analyse.mask_flow import MaskFlow
from sdpa_port.analyse.mask_values import Kind, reads_implementation
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.module_sites import typed_kwargs
from sdpa_port.analyse.recognise import ClassAnalysis
from sdpa_port.analyse.selection import attention_dicts
from sdpa_port.refusals import Refusal

SAFE = frozenset({Kind.NONE, Kind.INPUT})

# the warning of a class whose test of its settings keeps a side eager names that side's attention itself
SDPA_ONLY_WHERE = " computes its attention with SDPA only where "


@dataclass(frozen=True)
class Split:
    """The analyses to port, the refused classes left eager (with their refusal), and the refusals that stand."""

    ported: list[ClassAnalysis]
    kept: list[tuple[str, Refusal]]  # class, its refusal
    standing: list[Refusal]

    def warnings(self) -> list[str]:
        kept = [
            f"{name} stays eager, the other attention classes are ported: {refusal} (nothing built per "
            "implementation reaches it)"
            for name, refusal in self.kept
        ]
        # a port whose SDPA side of a test of the module's settings is the rare one (`if self.is_cross_attention:`)
        # is exact, and does little for the other side: said, with why that side is not ported
        sides = [
            f"{a.class_name}{SDPA_ONLY_WHERE}"
            f"{holds_where(a.alternatives)}; otherwise it runs the eager "
            f"computation: {a.eager_side}"
            for a in self.ported
            if a.alternatives and a.eager_side is not None
        ]
        return kept + sides


def split_refused(facts: ModuleFacts, analyses: list[ClassAnalysis]) -> Split:
    ported = [a for a in analyses if a.refusal is None]
    refused = [a for a in analyses if a.refusal is not None]
    if not refused:
        return Split(ported, [], [])
    if not any(a.sites for a in ported):
        return Split(ported, [], [a.refusal for a in refused if a.refusal is not None])
    flow = MaskFlow(facts, derive=True)
    kept: list[tuple[str, Refusal]] = []
    standing: list[Refusal] = []
    for analysis in refused:
        assert analysis.refusal is not None
        blocker = _blocker(facts, flow, analysis.class_name, [a.class_name for a in ported])
        if blocker is None:
            kept.append((analysis.class_name, analysis.refusal))
        else:
            refusal = analysis.refusal
            standing.append(
                Refusal(
                    refusal.code,
                    refusal.where,
                    refusal.line,
                    f"{refusal.detail}; it cannot stay eager: {blocker}",
                    beside=True,
                )
            )
    if standing:
        return Split([], [], standing)
    return Split(ported, kept, [])


def _blocker(facts: ModuleFacts, flow: MaskFlow, class_name: str, ported: list[str]) -> str | None:
    """Why `class_name` cannot stay eager beside the ported classes, or None when it can."""
    lineage = {info.name for info in facts.mro(class_name)}
    for other in ported:
        if other in lineage or class_name in {info.name for info in facts.mro(other)}:
            return f"it shares its inheritance with `{other}`, which the port changes"
    for dict_name, entries in attention_dicts(facts).items():
        if class_name in entries.values():
            return f"`{dict_name}` selects it by implementation"
    for owner in lineage:
        node = flow.modules.classes.get(owner)
        if node is not None and reads_implementation(node):
            return f"`{owner}` reads the attention implementation"
    if not flow.modules.sites_of({class_name}):
        return "it is not built in this file, so the masks it receives cannot be followed"
    found = flow.modules.method(class_name, "forward")
    if found is None:
        return "it has no forward to follow"
    owner, function = found
    args = function.args
    if args.vararg is not None:
        return f"its forward takes `*{args.vararg.arg}`, which cannot be followed"
    if args.kwarg is not None and typed_kwargs(function) is None:
        return f"its forward takes untyped `**{args.kwarg.arg}`, which may carry a mask"
    for param in [*args.posonlyargs, *args.args, *args.kwonlyargs][1:]:
        origins = flow.param_origins(owner, "forward", param.arg)
        unsafe = sorted((o for o in origins if o.kind not in SAFE), key=lambda o: (o.line, o.detail))
        if unsafe:
            return f"its `{param.arg}` may hold {unsafe[0].describe()}"
    return None


__all__ = ["Split", "split_refused"]
