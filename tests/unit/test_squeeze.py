"""Before/after pairs for `rewrite/squeeze.py`: names of an SDPA forward that only hand a value on, dropped."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from sdpa_port.rewrite.squeeze import squeeze

# None held in a name: written where the name is read
NONE_NAME = """
def forward(self, x):
    weights = None
    out = f(x)
    return out, weights
"""
NONE_NAME_AFTER = """
def forward(self, x):
    out = f(x)
    return out, None
"""

# the mask set to None, then to the mask under `is not None`: set to the mask at once
HOISTED = """
def forward(self, x, attention_mask=None):
    sdpa_mask = None
    if attention_mask is not None:
        check(attention_mask)
        sdpa_mask = attention_mask
        sdpa_mask = sdpa_mask.clamp(min=-1)
    return f(x, sdpa_mask)
"""
HOISTED_AFTER = """
def forward(self, x, attention_mask=None):
    sdpa_mask = attention_mask
    if attention_mask is not None:
        check(attention_mask)
        sdpa_mask = sdpa_mask.clamp(min=-1)
    return f(x, sdpa_mask)
"""

# `x = y; x = g(x)` and `t = e; x = t`, in any block
MERGED = """
def forward(self, x, q, k):
    if x:
        sdpa_mask = q
        sdpa_mask = sdpa_mask + k
    else:
        scores = torch.einsum("bhld,lrd->bhlr", q, k)
        sdpa_mask = scores
    return f(x, sdpa_mask)
"""
MERGED_AFTER = """
def forward(self, x, q, k):
    if x:
        sdpa_mask = q + k
    else:
        sdpa_mask = torch.einsum("bhld,lrd->bhlr", q, k)
    return f(x, sdpa_mask)
"""

UNCLAMPED = HOISTED.replace("        sdpa_mask = sdpa_mask.clamp(min=-1)\n", "")

CASES = [
    (NONE_NAME, NONE_NAME_AFTER),
    # bound again: the name holds something else where it is read
    (NONE_NAME.replace("    out = f(x)\n", "    out = f(x)\n    if x:\n        weights = x\n"), None),
    # read before it is bound (an error eager would raise)
    ("def forward(self, x):\n    out = f(weights)\n    weights = None\n    return out, weights\n", None),
    # a parameter: its default is not None everywhere
    (NONE_NAME.replace("(self, x)", "(self, x, weights=None)"), None),
    # read inside a function of its own, which could be called where the name is not yet bound
    (NONE_NAME.replace("return out, weights", "return out, (lambda: weights)"), None),
    (HOISTED, HOISTED_AFTER),
    # the mask read between: it would see the mask, not None
    (UNCLAMPED.replace("        check(attention_mask)\n", "        check(sdpa_mask)\n"), None),
    # the source bound again before it is handed on
    (UNCLAMPED.replace("        check(attention_mask)\n", "        attention_mask = attention_mask * 2\n"), None),
    # another test than `is not None`: where the branch does not run the mask is None, the source may not be
    (UNCLAMPED.replace("if attention_mask is not None:", "if attention_mask is not None and x:"), None),
    # a function of forward's reads the mask: called between, it would see the mask, not None
    (UNCLAMPED.replace("    sdpa_mask = None\n", "    show = lambda: sdpa_mask\n    sdpa_mask = None\n")
     .replace("check(attention_mask)", "check(show())"), None),
    # a comment on the line handed on stays where it was
    (UNCLAMPED.replace("sdpa_mask = attention_mask\n", "sdpa_mask = attention_mask  # as given\n"), None),
    (MERGED, MERGED_AFTER),
    # the name read twice, or not first: merging would move or repeat its evaluation
    (MERGED.replace("sdpa_mask + k", "sdpa_mask + sdpa_mask"), "merged-once"),
    (MERGED.replace("sdpa_mask + k", "k + sdpa_mask"), "merged-once"),
    # the temporary read elsewhere: it stays
    (MERGED.replace("return f(x, sdpa_mask)", "return f(scores, sdpa_mask)"), "merged-kept"),
    # a merged line over the line length stays two
    (MERGED.replace('"bhld,lrd->bhlr"', '"' + "b" * 100 + '"'), "merged-long"),
    # a comment between the two lines stays where it was
    (MERGED.replace("        sdpa_mask = scores\n", "        # the scores\n        sdpa_mask = scores\n"), "merged-comment"),
]


def _expected(before: str, after: str | None) -> str:
    if after is None:
        return before
    if after == "merged-once":
        return before.replace("scores = torch.einsum(\"bhld,lrd->bhlr\", q, k)\n        sdpa_mask = scores\n",
                              "sdpa_mask = torch.einsum(\"bhld,lrd->bhlr\", q, k)\n")
    if after in ("merged-kept", "merged-long", "merged-comment"):
        return before.replace("        sdpa_mask = q\n        sdpa_mask = sdpa_mask + k\n", "        sdpa_mask = q + k\n")
    return after


@pytest.mark.parametrize(
    "before,after",
    CASES,
    ids=[
        "none-name", "none-rebound", "none-read-before", "none-parameter", "none-in-lambda", "hoisted",
        "hoisted-read-between", "hoisted-source-rebound", "hoisted-other-test", "hoisted-closure", "hoisted-comment", "merged",
        "merged-read-twice", "merged-read-second", "merged-temporary-read", "merged-too-long", "merged-comment",
    ],
)
def test_squeeze(before: str, after: str | None) -> None:
    function = _parsed(before)
    result = cst.Module(body=[squeeze(function)]).code
    assert result == _dedented(_expected(before, after))


def test_squeeze_is_idempotent() -> None:
    for before, _ in CASES:
        once = squeeze(_parsed(before))
        assert cst.Module(body=[squeeze(once)]).code == cst.Module(body=[once]).code


def _dedented(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _parsed(text: str) -> cst.FunctionDef:
    node = cst.parse_module(_dedented(text)).body[0]
    assert isinstance(node, cst.FunctionDef)
    return node
