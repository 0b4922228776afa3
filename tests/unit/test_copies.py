"""The `# Copied from` checker follows the repository's rules (utils/check_copies.py), on trees given as texts."""

from __future__ import annotations

import textwrap

import pytest

from sdpa_port.checkout.copies import (
    Replacement,
    apply_replacements,
    check_tree,
    marker_text,
    parse_replacements,
    same_up_to_formatting,
)
from sdpa_port.checkout.tree import Texts

A = "src/transformers/models/alpha/modeling_alpha.py"
B = "src/transformers/models/beta/modeling_beta.py"

UPSTREAM = '''\
import torch


class AlphaAttention(nn.Module):
    """Attention of Alpha."""

    def __init__(self, config):
        super().__init__()
        self.scale = config.alpha_scale

    def forward(self, x):
        # Alpha's scores
        return torch.softmax(x * self.scale, -1)


def alpha_helper(x):
    return x + 1
'''

COPY = '''\
import torch


# Copied from transformers.models.alpha.modeling_alpha.AlphaAttention with Alpha->Beta,alpha_->beta_
class BetaAttention(nn.Module):
    """Attention of Beta."""

    def __init__(self, config):
        super().__init__()
        self.scale = config.beta_scale

    def forward(self, x):
        # Beta's scores
        return torch.softmax(x * self.scale, -1)
'''


def check(copy: str, upstream: str = UPSTREAM, **options: object) -> list[str]:
    tree = Texts({A: textwrap.dedent(upstream), B: textwrap.dedent(copy)})
    return [f"{i.marker.path}:{i.line + 1}: {i.reason}" for i in check_tree(tree, **options)]  # type: ignore[arg-type]


def test_a_faithful_copy_is_consistent() -> None:
    assert check(COPY) == []


def test_a_stale_copy_is_reported_at_its_first_differing_line() -> None:
    stale = COPY.replace("x * self.scale, -1", "x / self.scale, -1")
    assert check(stale) == [f"{B}:14: the copy differs from the source"]


def test_blank_lines_and_the_copy_name_do_not_count() -> None:
    loose = COPY.replace("        super().__init__()\n", "\n        super().__init__()\n\n")
    assert check(loose.replace("class BetaAttention", "class BetaOtherAttention")) == []


def test_ignore_copy_blocks_are_left_out_on_both_sides() -> None:
    ignored = COPY.replace("    def forward(self, x):\n", "    # Ignore copy\n    def forward(self, x):\n").replace(
        "x * self.scale", "x * self.scale * 2"
    )
    assert check(ignored) == []
    # a block only the copy has is ignored too
    extra = COPY + "\n    # Ignore copy\n    def extra(self):\n        return 1\n"
    assert check(extra) == []


def test_end_copy_stops_the_copy() -> None:
    upstream = "def alpha_setup(model):\n    model.a = 1\n"
    copy = (
        "# Copied from transformers.models.alpha.modeling_alpha.alpha_setup\ndef beta_setup(model):\n    model.a = 1\n"
    )
    assert check(copy + "    # End copy\n    model.b = 2\n", upstream) == []
    assert check(copy + "    model.b = 2\n", upstream) != []


def test_method_markers() -> None:
    copy = textwrap.dedent(
        """\
        class BetaAttention(nn.Module):
            # Copied from transformers.models.alpha.modeling_alpha.AlphaAttention.__init__ with Alpha->Beta,alpha_->beta_
            def __init__(self, config):
                super().__init__()
                self.scale = config.beta_scale

            def forward(self, x):
                return x
        """
    )
    assert check(copy) == []
    assert check(copy.replace("config.beta_scale", "config.alpha_scale")) == [
        f"{B}:5: the copy differs from the source"
    ]


def test_replacements_are_regular_expressions_applied_in_order() -> None:
    replacements = parse_replacements("with A.->Bx,Bx->C all-casing")
    assert replacements == (Replacement("A.", "Bx"), Replacement("Bx", "C", True))
    assert apply_replacements("AA Ab bx BX", replacements) == "C C c C"


def test_every_with_is_dropped_from_the_pattern_as_upstream_does() -> None:
    assert parse_replacements("with Bert->Bert, and more text") == (Replacement("Bert", "Bert"),)


def test_all_casing() -> None:
    assert apply_replacements("Bert BERT bert", (Replacement("Bert", "Ernie", True),)) == "Ernie ERNIE ernie"
    # each form is substituted over the result of the previous one, as upstream does
    assert apply_replacements("Bert", (Replacement("Bert", "Roberta", True),)) == "Rorobertaa"


def test_marker_text_round_trips() -> None:
    replacements = (Replacement("Bert", "ClapText"), Replacement("BERT", "CLAP_TEXT"))
    text = marker_text("    ", "models.bert.modeling_bert.BertAttention", replacements)
    assert (
        text
        == "    # Copied from transformers.models.bert.modeling_bert.BertAttention with Bert->ClapText,BERT->CLAP_TEXT"
    )
    assert parse_replacements(text.split("BertAttention", 1)[1]) == replacements


def test_unresolved_targets_are_reported() -> None:
    copy = COPY.replace("modeling_alpha.AlphaAttention", "modeling_alpha.AlphaMissing")
    assert check(copy) == [f"{B}:4: `models.alpha.modeling_alpha.AlphaMissing` matches no class or function in {A}"]
    gone = COPY.replace("models.alpha.modeling_alpha", "models.zzz.modeling_zzz")
    assert len(check(gone)) == 1


LONG_UPSTREAM = """\
def alpha_helper(first_argument, second_argument):
    return some_function(first_argument, second_argument, third=first_argument, fourth=second_argument, five=5)
"""
LONG_COPY = """\
# Copied from transformers.models.alpha.modeling_alpha.alpha_helper with some_function->a_much_longer_function_name
def beta_helper(first_argument, second_argument):
    return a_much_longer_function_name(
        first_argument, second_argument, third=first_argument, fourth=second_argument, five=5
    )
"""


def test_replaced_code_is_compared_after_formatting() -> None:
    # without a formatter: the same syntax and comments up to formatting
    assert check(LONG_COPY, LONG_UPSTREAM) == []
    assert check(LONG_COPY.replace("five=5", "five=6"), LONG_UPSTREAM) != []

    # with one (the edge runs the checkout's ruff): its output is what must match
    calls: list[int] = []

    def formatter(modules: list[str]) -> list[str]:
        calls.append(len(modules))
        return [
            m.replace(
                "(first_argument, second_argument, third", "(\n        first_argument, second_argument, third"
            ).replace("five=5)", "five=5\n    )")
            for m in modules
        ]

    assert check(LONG_COPY, LONG_UPSTREAM, formatter=formatter) == [] and calls == [1]
    assert check(LONG_COPY, LONG_UPSTREAM, formatter=lambda modules: list(modules)) != []


def test_formatting_fallback_still_sees_comments() -> None:
    assert same_up_to_formatting("x = f(a, b)\n", "x = f(\n    a,\n    b,\n)\n")
    assert not same_up_to_formatting("x = f(a, b)  # one\n", "x = f(a, b)  # two\n")


@pytest.mark.parametrize(
    "upstream_change", ["def forward(self, x, y):", "    def extra(self):\n        pass\n\n    def forward(self, x):"]
)
def test_any_change_of_the_source_makes_the_copy_stale(upstream_change: str) -> None:
    changed = UPSTREAM.replace(
        "    def forward(self, x):",
        f"    {upstream_change.strip()}" if upstream_change.startswith("def") else upstream_change,
    )
    assert check(COPY, changed) != []
