"""The differential fuzzer in CI: fixed seeds of both families (class style in the tf440 session, interface style
in tf523), the regression specs, and the judge's own sensitivity.

`python tests/fuzz/run.py --seeds 0:5000 [--family 523]` runs many more seeds outside pytest.
"""

from __future__ import annotations

import libcst as cst
import pytest

from judge import FAILURES, judge
from regressions import REGRESSIONS, regression
from run import run_seeds
from spec import Spec, normalise

SEEDS = {"440": 500, "523": 300, "inline": 200}
BLOCK = 50
FAMILY_MARK = {"440": pytest.mark.tf440, "523": pytest.mark.tf523, "inline": pytest.mark.tf440}
SDPA = "torch.nn.functional.scaled_dot_product_attention"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # type: ignore[no-untyped-def]
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "family,start",
    [pytest.param(family, start, marks=FAMILY_MARK[family]) for family in SEEDS for start in range(0, SEEDS[family], BLOCK)],
)
def test_no_wrong_port_crash_or_miss(family: str, start: int) -> None:
    tally = run_seeds(list(range(start, start + BLOCK)), jobs=1, progress=False, family=family)
    failures = [f"{verdict.kind}: {spec.describe()}\n    {verdict.detail}" for spec, verdict in tally.failures]
    assert not failures, "\n".join(failures)
    assert set(tally.counts) <= {"exact", "refused"}, tally.counts


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=FAMILY_MARK[REGRESSIONS[name][0].family]) for name in sorted(REGRESSIONS)]
)
def test_regression(name: str) -> None:
    spec, expected, code = regression(name)
    verdict = judge(spec)
    assert verdict.kind == expected, f"{verdict.kind}: {verdict.detail}"
    if code is not None:
        assert any(reason.endswith(f"[{code}]") for reason in verdict.reasons), verdict.reasons


# ------------------------------------------------------------------ the judge sees what it must


class _Sabotage(cst.CSTTransformer):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.count = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if cst.Module([]).code_for_node(updated.func) != SDPA:
            return updated
        self.count += 1
        args = []
        for argument in updated.args:
            keyword = argument.keyword.value if argument.keyword else None
            if self.kind == "mask" and keyword == "attn_mask":
                continue
            if self.kind == "scale" and keyword == "scale":
                argument = argument.with_changes(value=cst.parse_expression(f"({cst.Module([]).code_for_node(argument.value)}) * 1.05"))
            if self.kind == "dropout" and keyword == "dropout_p":
                argument = argument.with_changes(value=cst.parse_expression("0.0"))
            if self.kind == "is_causal" and keyword == "is_causal":
                argument = argument.with_changes(value=cst.parse_expression(f"not ({cst.Module([]).code_for_node(argument.value)})"))
            args.append(argument)
        return updated.with_changes(args=args)


def sabotaged(kind: str):  # type: ignore[no-untyped-def]
    def transform(source: str) -> str:
        transformer = _Sabotage(kind)
        result = cst.parse_module(source).visit(transformer)
        assert transformer.count, "no SDPA call in the port"
        return result.code

    return transform


SABOTAGE_SPECS = {
    # a 5 % error in the scale, on a chain with a mask and a position bias
    "scale": Spec(mask_style="plain_helper", terms=(("mask", "not_none"), ("bias", "plain"))),
    # the padding mask and the position bias dropped from the SDPA call
    "mask": Spec(mask_style="plain_helper", terms=(("mask", "not_none"), ("bias", "plain"))),
    # the dropout rate dropped (eval alone cannot see it: the judge's training run with a rate of 1.0 must)
    "dropout": Spec(mask_style="plain_helper", terms=(("mask", "not_none"),), dropout="module"),
    # a causal layer whose None mask must become is_causal=True
    "is_causal": Spec(mask_style="causal_helper", causal="mask", terms=(("mask", "plain"),), is_causal_attr=True),
}


@pytest.mark.tf440
@pytest.mark.parametrize("kind", sorted(SABOTAGE_SPECS))
def test_judge_sees_a_broken_port(kind: str) -> None:
    spec = normalise(SABOTAGE_SPECS[kind])
    assert judge(spec).kind == "exact"
    verdict = judge(spec, transform=sabotaged(kind))
    assert verdict.kind == "wrong", f"{kind}: {verdict.kind} {verdict.detail}"
    assert verdict.kind in FAILURES


@pytest.mark.tf440
@pytest.mark.parametrize("kind", ["scale", "mask", "dropout"])
def test_judge_sees_a_broken_inline_port(kind: str) -> None:
    """The inline family's judge compares the in-place port with the original alone: it must still see each."""
    from dataclasses import replace

    spec = replace(normalise(SABOTAGE_SPECS[kind]), style="inline")
    assert judge(spec).kind == "exact"
    verdict = judge(spec, transform=sabotaged(kind))
    assert verdict.kind == "wrong", f"{kind}: {verdict.kind} {verdict.detail}"


class _Uncast(cst.CSTTransformer):
    """The port's `term.to(query.dtype)` undone: the caller's term handed to SDPA in its own dtype."""

    def __init__(self) -> None:
        self.count = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        func = updated.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "to" and len(updated.args) == 1):
            return updated
        target = updated.args[0].value
        if not (isinstance(target, cst.Attribute) and target.attr.value == "dtype"):
            return updated
        self.count += 1
        return func.value


def uncast(source: str) -> str:
    transformer = _Uncast()
    result = cst.parse_module(source).visit(transformer)
    assert transformer.count, "no term cast to the query's dtype in the port"
    return result.code


@pytest.mark.tf440
@pytest.mark.parametrize("dtype", ["bool", "int64", "float16"])
def test_judge_sees_a_caller_term_left_in_its_dtype(dtype: str) -> None:
    """The inline family's term dtype axis: the judge hands the layers a mask and a bias of that dtype, which eager's
    addition promotes; a port handing them to SDPA as they are (read as keep or drop, or raising) is wrong."""
    spec = normalise(Spec(mask_style="plain_helper", terms=(("mask", "not_none"), ("bias", "plain")), style="inline",
                          term_dtype=dtype))
    assert spec.term_dtype == dtype
    assert judge(spec).kind == "exact"
    verdict = judge(spec, transform=uncast)
    assert verdict.kind == "wrong", f"{dtype}: {verdict.kind} {verdict.detail}"
