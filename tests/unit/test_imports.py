"""Imports a port adds land where ruff's isort wants them (I001), inside the leading block (E402), formatted.

Each expected text below was checked once with Transformers' pinned ruff (0.1.5 and 0.14.10, the checkout's
pyproject.toml): `ruff check` and `ruff format --check` find nothing. tests/checkout runs the real ruff on real ports.
"""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from sdpa_port.analyse.names import ImportMap
from sdpa_port.rewrite import imports

MASKS = "modeling_attn_mask_utils"
LONG = "_prepare_4d_causal_attention_mask_for_sdpa"

CASES = {
    "late-import": (
        """\
        import torch

        from ...activations import ACT2FN
        from ...modeling_utils import PreTrainedModel


        _CONFIG_FOR_DOC = "T5Config"

        from ..deprecated._archive_maps import T5_PRETRAINED_MODEL_ARCHIVE_LIST  # noqa: F401, E402
        """,
        [(MASKS, "_prepare_4d_attention_mask_for_sdpa")],
        """\
        import torch

        from ...activations import ACT2FN
        from ...modeling_attn_mask_utils import _prepare_4d_attention_mask_for_sdpa
        from ...modeling_utils import PreTrainedModel


        _CONFIG_FOR_DOC = "T5Config"

        from ..deprecated._archive_maps import T5_PRETRAINED_MODEL_ARCHIVE_LIST  # noqa: F401, E402
        """,
    ),
    "sorted-member": (
        """\
        from ...modeling_attn_mask_utils import _prepare_4d_attention_mask, _prepare_4d_causal_attention_mask
        """,
        [(MASKS, "_prepare_4d_attention_mask_for_sdpa")],
        """\
        from ...modeling_attn_mask_utils import (
            _prepare_4d_attention_mask,
            _prepare_4d_attention_mask_for_sdpa,
            _prepare_4d_causal_attention_mask,
        )
        """,
    ),
    "fits-on-one-line": (
        """\
        from ...modeling_attn_mask_utils import _prepare_4d_causal_attention_mask
        """,
        [(MASKS, LONG)],
        f"""\
        from ...modeling_attn_mask_utils import _prepare_4d_causal_attention_mask, {LONG}
        """,
    ),
    "parenthesised": (
        """\
        from ...utils import (
            DUMMY_INPUTS,
            add_start_docstrings,
            logging,
        )
        """,
        [("utils", "ModelOutput"), ("utils", "is_torch_fx_proxy")],
        """\
        from ...utils import (
            DUMMY_INPUTS,
            ModelOutput,
            add_start_docstrings,
            is_torch_fx_proxy,
            logging,
        )
        """,
    ),
    "standard-library-section": (
        '''\
        """Docs."""

        import torch
        from torch import nn

        from ...modeling_utils import PreTrainedModel
        ''',
        [("math", None)],
        '''\
        """Docs."""

        import math

        import torch
        from torch import nn

        from ...modeling_utils import PreTrainedModel
        ''',
    ),
    "first-of-section": (
        """\
        import math

        import torch

        from ...modeling_utils import PreTrainedModel
        """,
        [("abc", None)],
        """\
        import abc
        import math

        import torch

        from ...modeling_utils import PreTrainedModel
        """,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_added_imports_are_sorted(case: str) -> None:
    before, needed, after = CASES[case]
    module = cst.parse_module(textwrap.dedent(before))
    assert imports.add_imports(module, ImportMap.of(module), needed).code == textwrap.dedent(after)


def test_comments_inside_parentheses_stay() -> None:
    source = "from ...utils import (\n    add_start_docstrings,  # used below\n    logging,\n)\n"
    module = cst.parse_module(source)
    result = imports.add_imports(module, ImportMap.of(module), [("utils", "is_torch_fx_proxy")]).code
    assert "# used below" in result and "is_torch_fx_proxy" in result


def test_member_order_by_type() -> None:
    names = ["logging", "ModelOutput", "DUMMY_INPUTS", "_private", "add2", "add10"]
    assert sorted(names, key=imports.member_key) == [
        "DUMMY_INPUTS",
        "ModelOutput",
        "_private",
        "add2",
        "add10",
        "logging",
    ]
