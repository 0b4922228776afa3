"""Before/after pairs for `rewrite/inherited_comments.py`: comments on statements the SDPA forward copies unchanged
stay with the eager forward."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from sdpa_port.rewrite.inherited_comments import without_inherited_comments

EAGER = """
def forward(self, x, cache=None):
    # project the query
    q = self.q(x)
    if cache is not None:
        # reuse the cached keys
        k = cache[0]
    else:
        k = self.k(x)
    if self.is_decoder:
        # keep the keys for the next step
        cache = (k,)
    # the scores, scaled
    scores = q @ k.transpose(-1, -2)  # (b, h, q, k)
    # fmt: off
    probs = scores.softmax(-1)
    # fmt: on
    if self.relative:
        # relative positions, as Transformer-XL adds them
        steps = self.steps(x)
        scores = scores + steps
    return probs @ x, cache
"""

# unchanged statements lose their comment lines, at any depth; what the port wrote keeps its own
SDPA = """
def forward(self, x, cache=None):
    # project the query
    q = self.q(x)
    if cache is not None:
        # reuse the cached keys
        k = cache[0]
    else:
        k = self.k(x)
    if self.is_decoder:
        # keep the keys for the next step
        cache = (k,)
    # the SDPA call
    out = sdpa(q, k, x)  # fused
    return out, cache
"""
SDPA_AFTER = """
def forward(self, x, cache=None):
    q = self.q(x)
    if cache is not None:
        k = cache[0]
    else:
        k = self.k(x)
    if self.is_decoder:
        cache = (k,)
    # the SDPA call
    out = sdpa(q, k, x)  # fused
    return out, cache
"""

# a statement changed inside an `if` keeps the comment above the unchanged one under it only where that one opens the
# block: the comment heads the block the port changed
HEADER = """
def forward(self, x, cache=None):
    mask = None
    if self.relative:
        # relative positions, as Transformer-XL adds them
        steps = self.steps(x)
        # clipped
        clipped = steps.clamp(0, 4)
        mask = clipped
    return mask
"""
HEADER_AFTER = """
def forward(self, x, cache=None):
    mask = None
    if self.relative:
        # relative positions, as Transformer-XL adds them
        steps = self.steps(x)
        clipped = steps.clamp(0, 4)
        mask = clipped
    return mask
"""
HEADER_EAGER = """
def forward(self, x, cache=None):
    if self.relative:
        steps = self.steps(x)
        clipped = steps.clamp(0, 4)
        scores = scores + clipped
"""

# directives and trailing comments stay, and a statement the port changed keeps its comment even where a statement
# of the same text stands elsewhere in a changed form
DIRECTIVES = """
def forward(self, x, cache=None):
    # fmt: off
    probs = scores.softmax(-1)
    # fmt: on
    # the scores, scaled
    scores = q @ k.transpose(-1, -2)  # (b, h, q, k)
    # the scores, now a mask
    scores = q @ k.transpose(-2, -1)
"""
DIRECTIVES_AFTER = """
def forward(self, x, cache=None):
    # fmt: off
    probs = scores.softmax(-1)
    # fmt: on
    scores = q @ k.transpose(-1, -2)  # (b, h, q, k)
    # the scores, now a mask
    scores = q @ k.transpose(-2, -1)
"""


@pytest.mark.parametrize(
    ("before", "after", "eager"),
    [(SDPA, SDPA_AFTER, EAGER), (HEADER, HEADER_AFTER, HEADER_EAGER), (DIRECTIVES, DIRECTIVES_AFTER, EAGER)],
    ids=["unchanged-statements", "block-header", "directives"],
)
def test_comments_of_unchanged_statements_stay_with_eager(before: str, after: str, eager: str) -> None:
    function = _function(before)
    assert cst.Module(body=[without_inherited_comments(function, _function(eager))]).code == _dedented(after)


def test_nothing_changes_without_a_shared_statement() -> None:
    function = _function(SDPA)
    unrelated = _function("def forward(self):\n    return None\n")
    assert without_inherited_comments(function, unrelated).deep_equals(function)


def _function(text: str) -> cst.FunctionDef:
    node = cst.parse_module(_dedented(text)).body[0]
    assert isinstance(node, cst.FunctionDef)
    return node


def _dedented(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")
