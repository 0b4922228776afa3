"""Shared steps of the acceptance tests: read a real modeling file, port it, load it, sabotage it."""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst

from sdpa_port import Status, port_source
from sdpa_port.discover.release import target_release

SDPA_CALL = "torch.nn.functional.scaled_dot_product_attention"
FOLD = "fold_additive_terms"  # the function a port folds additive terms into the mask with


@dataclass(frozen=True)
class Case:
    base: str
    lm: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


def modeling_path(model: str) -> Path:
    import transformers

    return Path(transformers.__file__).parent / "models" / model / f"modeling_{_stem(model)}.py"


def _stem(model: str) -> str:
    """`deprecated/open_llama` -> `open_llama` (models moved under deprecated/ keep their file names)."""
    return model.rsplit("/", 1)[-1]


def _package(model: str) -> str:
    return "transformers.models." + model.replace("/", ".")


def port_file(model: str) -> str:
    """The port of an installed model's file, for the installed release (what `sdpa-port <model>` writes)."""
    path = modeling_path(model)
    result = port_source(path.read_text(encoding="utf-8"), filename=f"modeling_{_stem(model)}.py", release=target_release(path))
    assert result.status is Status.PORTED, (result.status, result.detail, result.reasons)
    return result.source


def load(model: str, source: str, directory: Path, tag: str = "port"):  # type: ignore[no-untyped-def]
    from sdpa_port.verify.loader import load_source_in_package

    return load_source_in_package(source, _package(model), directory, f"modeling_{_stem(model)}_{tag}")


def original(model: str):  # type: ignore[no-untyped-def]
    return importlib.import_module(f"{_package(model)}.modeling_{_stem(model)}")


def record(report: str, key: str, value: Any) -> None:
    """Append a figure to $SDPA_PORT_REPORT_DIR/<report>.jsonl (for closing notes); no-op when unset."""
    directory = os.environ.get("SDPA_PORT_REPORT_DIR")
    if not directory:
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    with open(Path(directory) / f"{report}.jsonl", "a", encoding="utf-8") as stream:
        stream.write(json.dumps({"key": key, "value": value}) + "\n")


class _Sabotage(cst.CSTTransformer):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.count = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        from libcst.helpers import get_full_name_for_node

        if get_full_name_for_node(updated.func) != SDPA_CALL:
            return updated
        self.count += 1
        if self.kind == "mask":
            return updated.with_changes(args=[a for a in updated.args if not (a.keyword and a.keyword.value == "attn_mask")])
        if self.kind in ("scale", "slight"):
            factor = "0.5" if self.kind == "scale" else "0.999"
            args = []
            for a in updated.args:
                if a.keyword and a.keyword.value == "scale":
                    code = cst.Module([]).code_for_node(a.value)
                    a = a.with_changes(value=cst.parse_expression(f"({code}) * {factor}"))
                args.append(a)
            return updated.with_changes(args=args)
        if self.kind == "output":
            return cst.BinaryOperation(left=updated, operator=cst.Add(), right=cst.Float("1e-2"))
        raise ValueError(self.kind)


def sabotage(source: str, kind: str) -> str:
    """The port with every SDPA call broken: `mask` drops attn_mask, `scale` halves it, `slight` takes 0.1 % off
    it, `output` adds 1e-2."""
    transformer = _Sabotage(kind)
    result = cst.parse_module(source).visit(transformer)
    assert transformer.count > 0, "no SDPA call to sabotage"
    return result.code


class _SabotageDispatch(cst.CSTTransformer):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.count = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not (isinstance(updated.func, cst.Name) and updated.func.value == "attention_interface"):
            return updated
        self.count += 1
        if self.kind == "mask":
            # the additive terms withheld, however handed over: as position_bias, or folded into the mask
            args = [a for a in updated.args if not (a.keyword and a.keyword.value == "position_bias")]
            folded = args[4].value
            if isinstance(folded, cst.Call) and isinstance(folded.func, cst.Name) and folded.func.value.endswith(FOLD):
                args[4] = args[4].with_changes(value=folded.args[1].value)
            return updated.with_changes(args=args)
        if self.kind == "scale":
            args = []
            for a in updated.args:
                if a.keyword and a.keyword.value == "scaling":
                    a = a.with_changes(value=cst.parse_expression(f"({cst.Module([]).code_for_node(a.value)}) * 0.5"))
                args.append(a)
            return updated.with_changes(args=args)
        if self.kind == "attn_mask":
            # the non-eager implementations get no attention mask
            args = list(updated.args)
            mask = cst.Module([]).code_for_node(args[4].value)
            args[4] = args[4].with_changes(
                value=cst.parse_expression(f"({mask} if self.config._attn_implementation == 'eager' else None)")
            )
            return updated.with_changes(args=args)
        if self.kind == "output":
            # shift the attention output of the non-eager implementations only
            call = cst.Module([]).code_for_node(updated)
            return cst.parse_expression(
                f"(lambda o: (o[0] + (1e-2 if self.config._attn_implementation != 'eager' else 0.0), o[1]))({call})"
            )
        if self.kind == "flex_scale":
            # scaling halved under flex attention only: SDPA and eager stay right
            args = []
            for a in updated.args:
                if a.keyword and a.keyword.value == "scaling":
                    value = cst.Module([]).code_for_node(a.value)
                    half = f"(({value}) * 0.5 if self.config._attn_implementation == 'flex_attention' else ({value}))"
                    a = a.with_changes(value=cst.parse_expression(half))
                args.append(a)
            return updated.with_changes(args=args)
        if self.kind == "flex_mask":
            # the attention mask dropped under flex attention only: eager and SDPA stay right
            args = list(updated.args)
            mask = cst.Module([]).code_for_node(args[4].value)
            flex = "self.config._attn_implementation == 'flex_attention'"
            args[4] = args[4].with_changes(value=cst.parse_expression(f"(None if {flex} else {mask})"))
            return updated.with_changes(args=args)
        if self.kind == "flex_bypass":
            # flex attention run past the dispatch: the release's function called directly, so the dispatch that
            # the check counts is never asked for it
            bypass = (
                "(__import__('transformers.integrations.flex_attention', fromlist=['_']).flex_attention_forward "
                "if self.config._attn_implementation == 'flex_attention' else attention_interface)"
            )
            return updated.with_changes(func=cst.parse_expression(bypass))
        if self.kind == "graph_break":
            # a graph break before the dispatch (a print is one under dynamo): eager, SDPA and flex stay right
            call = cst.Module([]).code_for_node(updated)
            return cst.parse_expression(f"(torch._dynamo.graph_break(), {call})[1]")
        raise ValueError(self.kind)


def sabotage_interface(source: str, kind: str) -> str:
    """The interface port with its dispatch broken: `mask` drops the additive terms (position_bias, or those folded
    into the mask), `scale` halves scaling, `output` shifts; `flex_scale` halves scaling under flex attention alone,
    `flex_mask` drops the mask under flex attention alone and `flex_bypass` calls flex attention past the dispatch;
    `graph_break` breaks the graph before the dispatch."""
    transformer = _SabotageDispatch(kind)
    result = cst.parse_module(source).visit(transformer)
    assert transformer.count > 0, "no dispatch to sabotage"
    return result.code
