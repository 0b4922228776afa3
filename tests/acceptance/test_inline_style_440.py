"""Inline-style ports (remote code the class style cannot wire) verified inside transformers 4.40.2.

The golden ports of `fixtures/inline_style/` are checked against their fixtures as `--verify` checks them
(`verify/inline.py`), and so are ports of remote code that imports its own package (loaded with stand-ins,
`verify/stubs.py`). Each sabotage is a port wrong in one way a port could be: the checks must see it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sdpa_port import Status, port_source

pytestmark = pytest.mark.tf440

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
INLINE = sorted((FIXTURES / "inline_style").glob("modeling_*.py"))


def _verify(path: Path, source: str):  # type: ignore[no-untyped-def]
    from sdpa_port.edge.after_port import verify_port

    result = port_source(path.read_text(encoding="utf-8"), filename=path.name)
    assert result.status is Status.PORTED and result.style == "inline", result.reasons
    from dataclasses import replace

    return verify_port(path, path.read_text(encoding="utf-8"), replace(result, source=source))


@pytest.mark.parametrize("path", INLINE, ids=lambda p: p.name)
def test_golden_inline_port_verifies(path: Path) -> None:
    golden = (FIXTURES / "golden" / path.name).read_text(encoding="utf-8")
    verification = _verify(path, golden)
    assert verification.passed, "\n".join(verification.lines)
    lines = "\n".join(verification.lines)
    assert "the rewritten computation ran under: defaults" in lines, lines
    if "output_attentions" in path.read_text(encoding="utf-8"):
        # the kept eager forward answers a request for the weights exactly
        assert "with output_attentions=True max|diff|=0" in lines, lines


# each a port wrong in one way: a scale off, a term dropped, the fallback not taken, the mask ignored
SABOTAGES = {
    "modeling_tiny_tower.py": [
        ("scale halved", "scale=1.0,", "scale=0.5,"),
        ("bias dropped", "sdpa_mask = self.relative_bias(N)", "sdpa_mask = torch.zeros_like(self.relative_bias(N))"),
        ("mask dropped", "sdpa_mask = sdpa_mask + mask", "sdpa_mask = sdpa_mask"),
    ],
    "modeling_tiny_precision.py": [
        # each branch's own scale: the upcast one runs by default, the other with `upcast=False`
        (
            "upcast branch's scale dropped",
            "q, k = q.float(), k.float()\n            sdpa_query = q\n            sdpa_key = k\n"
            "            sdpa_scale = sdpa_scale * self.scale",
            "q, k = q.float(), k.float()\n            sdpa_query = q\n            sdpa_key = k\n",
        ),
        (
            "other branch's scale dropped",
            "else:\n            sdpa_query = q\n            sdpa_key = k\n            sdpa_scale = sdpa_scale * self.scale",
            "else:\n            sdpa_query = q\n            sdpa_key = k\n",
        ),
        ("upcast branch's key doubled", "            sdpa_key = k\n", "            sdpa_key = k * 2\n"),
    ],
    "modeling_tiny_dead_branch.py": [
        # the live side multiplies the upcast scores by the coefficient the query was divided by
        ("coefficient not undone", "scale=coeff,", "scale=1.0,"),
        ("mask dropped", "attn_mask=sdpa_mask,", "attn_mask=None,"),
        # the fill dropped: probabilities of the unmasked scores
        ("fill not applied", "sdpa_mask = torch.where(attention_mask", "sdpa_mask = 0 * torch.where(attention_mask"),
    ],
    # found only on a window's tokens and a shifted-window mask, and on packed channels-first query, key and value
    "modeling_tiny_window.py": [
        ("relative bias dropped", "sdpa_mask = bias.permute(2, 0, 1)", "sdpa_mask = 0 * bias.permute(2, 0, 1)"),
        ("window mask dropped", "sdpa_mask = sdpa_mask + (\n", "sdpa_mask = sdpa_mask + 0 * (\n"),
        ("packed key scale dropped", "sdpa_key = (k * scale).transpose(1, 2)", "sdpa_key = k.transpose(1, 2)"),
    ],
    # decomposed relative positions added by a function of the file (`analyse/additive.py`): the term called on zeros,
    # whose sign or slice a port could get wrong, and the mask added to it
    "modeling_tiny_relpos.py": [
        ("term negated", "sdpa_mask = add_decomposed_positions(", "sdpa_mask = -add_decomposed_positions("),
        ("mask dropped", "sdpa_mask = sdpa_mask + attention_mask", "sdpa_mask = sdpa_mask"),
        ("slice term negated", "attn_mask=add_positions_past_cls(", "attn_mask=-add_positions_past_cls("),
        # the helper given the scores themselves, not zeros: the scores counted twice
        ("slice helper on the scores", "add_positions_past_cls(\n                k.new_zeros(scores_shape),",
         "add_positions_past_cls(\n                q @ k.transpose(-2, -1),"),
        # a bias built where none is given, laid out once there (`rewrite/reused_terms.py`): its keys reversed where
        # it is laid out, or not handed over
        ("reused bias reversed", "position_bias = position_bias.contiguous()",
         "position_bias = position_bias.contiguous().flip(-1)"),
        ("reused bias dropped", "attn_mask=position_bias.to(q.dtype),", "attn_mask=None,"),
    ],
    # a key and value shared by every head (multi-query einsums, `forms/products.py`): each expanded to the query's
    # heads; a port could hand over the key as the value, or lay the shared key out as the query is
    "modeling_tiny_multi_query.py": [
        ("key handed over as the value", "            v.unsqueeze(1).expand(-1, q.size(1), -1, -1),",
         "            k.unsqueeze(1).expand(-1, q.size(1), -1, -1),"),
        ("mask dropped", "attn_mask=sdpa_mask,", "attn_mask=None,"),
        ("shared key's positions reversed", "sdpa_key = k.transpose(0, 1).unsqueeze(1)",
         "sdpa_key = k.transpose(0, 1).flip(1).unsqueeze(1)"),
    ],
    # one query per head with no length axis (single-query einsums, `forms/single_query.py`): the query given a
    # length axis of 1, the terms too, the output's removed; a port could get the scale, the mask's axis or the
    # laid-out key wrong
    "modeling_tiny_single_query.py": [
        ("scale off by 1.1", "scale=1.0 / math.sqrt(layer_q.shape[-1]),", "scale=1.1 / math.sqrt(layer_q.shape[-1]),"),
        ("mask dropped", "sdpa_mask = attention_mask.squeeze(1)", "sdpa_mask = 0 * attention_mask.squeeze(1)"),
        ("mask's keys reversed", "attention_mask.squeeze(1).unsqueeze(-2)", "attention_mask.flip(-1)[:, 0, None]"),
        ("fill dropped", "sdpa_mask = torch.where(", "sdpa_mask = 0 * torch.where("),
        ("key not laid out", "sdpa_key = k.transpose(1, 2)", "sdpa_key = k.reshape(b, self.heads, n, -1)"),
    ],
    # ported in place beside a class left eager, which the class style could not leave so
    "modeling_tiny_beside.py": [
        ("scale doubled", "scale=1.0 / math.sqrt(self.head_dim),", "scale=2.0 / math.sqrt(self.head_dim),"),
        ("mask dropped", "attn_mask=sdpa_mask,", "attn_mask=None,"),
    ],
    # one form per class (`fixtures/inline_style/modeling_tiny_remote_forms.py`)
    "modeling_tiny_remote_forms.py": [
        # a key the producer laid out (b, h, d, s) handed over as it is, not transposed back
        ("pre-transposed key kept", "            k.transpose(-1, -2),\n", "            k,\n"),
        ("cast bias dropped", "sdpa_mask = self.relative_bias(N).type_as(q)", "sdpa_mask = 0 * self.relative_bias(N).type_as(q)"),
        ("conditional scale inverted", "scale=1.0 / self.norm_factor,", "scale=self.norm_factor,"),
        ("helper fill ignored", "self._mask_value(q.dtype, q.device)).to(", "q.new_zeros(())).to("),
        ("eager branch's scale doubled", "scale=self.head_dim**-0.5,", "scale=2 * self.head_dim**-0.5,"),
        # the fill of the branch taken off XLA devices, its padded keys read reversed
        ("padding of the non-XLA branch reversed", "key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool), float",
         "key_padding_mask.flip(-1).unsqueeze(1).unsqueeze(2).to(torch.bool), float"),
        # the bias added to the regrouped, permuted scores: left permuted, or the frames' biases swapped
        ("frame bias not permuted back", ").permute(0, 2, 1, 3, 5, 4).reshape(scores_shape)",
         ").reshape(scores_shape)"),
        ("frames' biases swapped", "+ bias[None, None]", "+ bias.flip(0)[None, None]"),
    ],
    # a function forward defines computes each class's attention (`analyse/closures.py`): the SDPA call in it must
    # keep what it reads from forward and what each call passes it
    "modeling_tiny_closure.py": [
        ("forward's mask ignored", "attn_mask=sdpa_mask,\n                scale=scale,",
         "attn_mask=None,\n                scale=scale,"),
        ("forward's scale squared", "                scale=scale,\n", "                scale=scale * scale,\n"),
        ("the mask parameter ignored", "attn_mask=sdpa_mask,\n                dropout_p",
         "attn_mask=None,\n                dropout_p"),
        ("memory calls' scale doubled", "scale=self.scale,", "scale=2 * self.scale,"),
    ],
    # probabilities returned with no request, which every block discards: each returned as None
    "modeling_tiny_discarded.py": [
        ("scale dropped", "scale=1.0 / math.sqrt(self.head_dim),", "scale=1.0,"),
        ("mask dropped", "attn_mask=sdpa_mask,", "attn_mask=None,"),
        ("temperature multiplies", "scale=1.0 / self.temperature,", "scale=self.temperature,"),
        ("None in the output's place", "return self.proj(out), attn", "return attn, self.proj(out)"),
    ],
    # the mask expanded to the scores' shape, read at a rank the port does not know: the product's shape instead
    "modeling_tiny_sized_mask.py": [
        ("batch size read as the heads'", "k.shape[-2:-1])[0],", "k.shape[-2:-1])[1],"),
        ("mask dropped", "attn_mask=sdpa_mask,", "attn_mask=None,"),
    ],
    # a product of padding masks (`m @ m^T`) masks the scores: the port keeps it, as the mask
    "modeling_tiny_mask_product.py": [
        ("mask dropped", "attn_mask=sdpa_mask,", "attn_mask=None,"),
        ("mask inverted", "torch.where(pair != 0,", "torch.where(pair == 0,"),
    ],
    "modeling_tiny_elsewhere.py": [
        ("scale squared", "scale=1.0 / (self.attention_head_size**0.5)", "scale=1.0 / self.attention_head_size"),
        ("fallback skipped", "if output_attentions or head_mask is not None:", "if False:"),
    ],
    # the value on the left of the transposed probabilities (`forms/transposed.py`): a port could transpose the
    # probabilities the wrong way (query and key swapped), or lay the output out without transposing it back
    "modeling_tiny_vae.py": [
        ("probabilities transposed", "q,\n            k.transpose(-1, -2),", "k.transpose(-1, -2),\n            q,"),
        ("output not transposed back", ").transpose(1, 2).contiguous()  # (b, channels",
         ").reshape(b, c, h * w)  # (b, channels"),
        ("scale of the positions", "scale=(int(c) ** (-0.5))", "scale=(int(h * w) ** (-0.5))"),
        # the multi-head block: its output put back on the wrong axes, the key's factor dropped
        ("heads output on other axes", ").transpose(2, 3).contiguous()\n        x = x.reshape",
         ").transpose(1, 2).contiguous()\n        x = x.reshape"),
        ("key factor dropped", "scale=self.scale,", "scale=1.0,"),
    ],
    # non-local blocks (`forms/channels.py`, `forms/softmax.py`): each gate starts at zero, and the first block's
    # projections are under spectral norm, whose vectors the check settles for the sharpened weights: otherwise the
    # attention would not reach the outputs, or its softmax would be one-hot, and no sabotage would show
    "modeling_tiny_nonlocal.py": [
        # the softmax over the keys where eager takes it over the queries (`dim=1`)
        (
            "softmax over the other axis",
            "            k.transpose(-1, -2),\n            q.permute(0, 2, 1),",
            "            q.permute(0, 2, 1),\n            k.transpose(-1, -2),",
        ),
        ("gated block's scale of 2", "v.transpose(1, 2),\n            scale=1.0,", "v.transpose(1, 2),\n            scale=2.0,"),
        ("pooled block's scale of 2", "g.transpose(1, 2),\n            scale=1.0,", "g.transpose(1, 2),\n            scale=2.0,"),
        ("pooled output not transposed back", ").transpose(1, 2).contiguous().view(-1, self.channels",
         ").reshape(-1, self.channels"),
    ],
    # right operands no transpose at the product says are keys (`untranspose`, `forms/products.py`): each must reach
    # SDPA with its last two dims swapped; the output of a value on the left made contiguous for the view after it
    "modeling_tiny_any_key.py": [
        ("helper's key handed over as laid out",
         "k.transpose(-1, -2),\n            v,\n            attn_mask=sdpa_mask,",
         "k,\n            v,\n            attn_mask=sdpa_mask,"),
        ("plain operand handed over as it is", "k.transpose(-1, -2),\n            v,\n            scale=1.0 / 3.0,",
         "k,\n            v,\n            scale=1.0 / 3.0,"),
        ("helper's mask dropped", "attn_mask=sdpa_mask,", "attn_mask=None,"),
        ("value-left output left strided", ").transpose(2, 3).contiguous()", ").transpose(2, 3)"),
    ],
    # Megatron's seq-first layout (`fixtures/inline_style/modeling_tiny_seq_first.py`): the batch and head sizes
    # bound where the scores were viewed, swapped or read again where the tuple and the query hold other sizes
    "modeling_tiny_seq_first.py": [
        ("batch and heads swapped", "sdpa_batch, sdpa_heads = output_size[0], output_size[1]\n        sdpa_mask", "sdpa_heads, sdpa_batch = output_size[0], output_size[1]\n        sdpa_mask"),
        ("sizes read at the call", "sdpa_batch, sdpa_heads = output_size[0], output_size[1]\n        sdpa_mask", "sdpa_batch, sdpa_heads = query.size(1), query.size(2)\n        sdpa_mask"),
        ("coefficient dropped", "scale=1.0 * coeff,", "scale=1.0,"),
        ("fill dropped", "sdpa_mask = torch.where(attention_mask, -10000.0,", "sdpa_mask = 0 * torch.where(attention_mask, -10000.0,"),
        ("norm factor dropped", "scale=1.0 / self.norm_factor,", "scale=1.0,"),
        ("subtracted mask dropped", "attn_mask=(-(attention_mask * 10000.0)).to(query.transpose(0, 1).dtype),",
         "attn_mask=None,"),
        # the multiplicative mask of a lower triangle of ones: the fill dropped, or kept where the triangle masks
        ("triangle fill dropped", "attn_mask=torch.where(ltor_mask.bool(),", "attn_mask=0 * torch.where(ltor_mask.bool(),"),
        ("triangle fill inverted", "attn_mask=torch.where(ltor_mask.bool(),", "attn_mask=torch.where(~ltor_mask.bool(),"),
    ],
    # modules built or run only with values read from their code (`verify/alone_inputs.py`): a window defaulting to
    # None, an output width and a size of three sides, a required term tested against None, a required mask filled
    # where; each class's port wrong in one way the checks must see on exactly those inputs
    "modeling_tiny_inferred.py": [
        ("grid offsets dropped", "attn_mask=offsets.permute(2, 0, 1)", "attn_mask=0 * offsets.permute(2, 0, 1)"),
        ("grid offsets transposed", "attn_mask=offsets.permute(2, 0, 1)", "attn_mask=offsets.permute(2, 1, 0)"),
        ("pooled scale squared", "scale=1.0,\n        ).transpose(1, 2).reshape(B, -1",
         "scale=self.scale,\n        ).transpose(1, 2).reshape(B, -1"),
        ("pair term unscaled", "sdpa_mask = sdpa_mask / math.sqrt(self.width)", "sdpa_mask = sdpa_mask"),
        ("fill inverted", "attn_mask=torch.where(m,", "attn_mask=torch.where(~m,"),
        # the video window attention, run only with its frames folded into the batch: each frame's bias given to
        # another frame, or the frames and the batch swapped where the scores are regrouped
        ("frames' biases reversed", "            + bias[None, None]\n", "            + bias.flip(0)[None, None]\n"),
        ("frames and batch swapped", ".view(batch_size, frame_len, -1, self.num_heads, N, N)",
         ".view(frame_len, batch_size, -1, self.num_heads, N, N)"),
    ],
    # scales of constructor sizes whose head count only the methods' views take (`patterns/view_sizes.py`): the head
    # size's power and the `qk_scale` override's default, each read wrong; the repeated float mask dropped
    "modeling_tiny_view_sizes.py": [
        ("split heads' scale doubled", "            scale=self.scale,\n        ).permute(0, 2, 1, 3)",
         "            scale=2 * self.scale,\n        ).permute(0, 2, 1, 3)"),
        ("override's default scale dropped", "            scale=self.scale,\n        ).transpose(1, 2)",
         "            scale=1.0,\n        ).transpose(1, 2)"),
        ("repeated mask dropped", "sdpa_mask = mask.repeat(", "sdpa_mask = 0 * mask.repeat("),
    ],
    # the shifted-window mask added through temporaries of its branch (`analyse/branch_locals.py`)
    "modeling_tiny_window_steps.py": [
        ("window mask dropped", "sdpa_mask = sdpa_mask + (q.new_zeros", "sdpa_mask = sdpa_mask + 0 * (q.new_zeros"),
        ("relative bias dropped", "sdpa_mask = bias.permute(2, 0, 1)", "sdpa_mask = 0 * bias.permute(2, 0, 1)"),
    ],
    # the product with V in each arm of a test of the settings (`analyse/outputs.py`): each arm's own SDPA call, the
    # unprojected one run only with `use_final_linear=False`
    "modeling_tiny_graph_arms.py": [
        ("projected arm's scale halved", "scale=1.0,\n            ).transpose(1, 2)",
         "scale=0.5,\n            ).transpose(1, 2)"),
        ("unprojected arm's scale halved", "scale=1.0,\n            )\n            return context",
         "scale=0.5,\n            )\n            return context"),
        ("mask dropped", "attn_mask=sdpa_mask,", "attn_mask=None,"),
    ],
}


def _graph_paths(source: str) -> list[str]:
    """What differs between `GraphArmsAttention` of `source` and the fixture's, driven on both paths of its optional
    graph, with either setting of `use_final_linear`: no graph, SDPA runs and agrees within its tolerances; a graph
    given, the eager forward kept runs (no SDPA call) and agrees exactly."""
    import importlib.util
    from unittest import mock

    import torch

    def load(text: str, name: str):  # type: ignore[no-untyped-def]
        spec = importlib.util.spec_from_loader(name, loader=None)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        exec(compile(text, name, "exec"), module.__dict__)
        return module

    fixture = FIXTURES / "inline_style" / "modeling_tiny_graph_arms.py"
    original = load(fixture.read_text(encoding="utf-8"), "graph_arms_original")
    ported = load(source, "graph_arms_port")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    problems = []
    for use_final_linear in (True, False):
        torch.manual_seed(0)
        eager = original.GraphArmsAttention(4, 32, use_final_linear=use_final_linear).eval()
        port = ported.GraphArmsAttention(4, 32, use_final_linear=use_final_linear).eval()
        port.load_state_dict(eager.state_dict())
        x = torch.randn(2, 5, 32) * 2
        mask = torch.zeros(2, 5, 5, dtype=torch.bool)
        mask[1, :, 3:] = True  # padded keys
        graph = torch.rand(2, 5, 5) + 0.1
        for given in (None, graph):
            with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", wraps=sdpa) as calls:
                got = port(x, x, x, mask=mask, graph=given)
            want = eager(x, x, x, mask=mask, graph=given)
            where = f"use_final_linear={use_final_linear}, graph {'given' if given is not None else 'None'}"
            if given is None and (calls.call_count == 0 or not torch.allclose(got, want, atol=1e-5, rtol=1e-4)):
                problems.append(f"{where}: SDPA calls {calls.call_count}, max|diff|={(got - want).abs().max():.2e}")
            if given is not None and (calls.call_count or not torch.equal(got, want)):
                problems.append(f"{where}: SDPA calls {calls.call_count}, max|diff|={(got - want).abs().max():.2e}")
    return problems


def test_an_optional_graph_runs_the_eager_forward_and_its_absence_sdpa() -> None:
    """The golden port of `modeling_tiny_graph_arms.py` on both paths of its optional graph; and a port that does not
    fall back for the graph (it would drop it) is seen."""
    golden = (FIXTURES / "golden" / "modeling_tiny_graph_arms.py").read_text(encoding="utf-8")
    assert _graph_paths(golden) == []
    fallback = "if return_attn or graph is not None:"
    assert fallback in golden
    problems = _graph_paths(golden.replace(fallback, "if return_attn:", 1))
    seen = [problem.split(":")[0] for problem in problems]
    assert seen == ["use_final_linear=True, graph given", "use_final_linear=False, graph given"], problems


def test_values_read_from_the_code_build_and_run_the_modules() -> None:
    """Each class of `modeling_tiny_inferred.py` is checked on the inputs its code asks for: the grid on a window,
    the pair term given, the filled mask given, the video window's frames folded into the batch (none of them runs,
    or builds, from the names alone)."""
    path = FIXTURES / "inline_style" / "modeling_tiny_inferred.py"
    verification = _verify(path, (FIXTURES / "golden" / path.name).read_text(encoding="utf-8"))
    lines = "\n".join(verification.lines)
    assert verification.passed, lines
    checked = {line.split(" in place")[0]: line for line in verification.lines if " in place:" in line}
    expected = ["FilledAttention", "FrameWindowAttention", "GridAttention", "PairTermAttention", "PooledAttention"]
    assert sorted(checked) == expected, lines
    assert "window (3, 3)" in checked["GridAttention"], lines
    assert "folded into a batch of 6, batch_size=1, frame_len=3" in checked["FrameWindowAttention"], lines
    assert "no mask with rel" in checked["PairTermAttention"], lines
    assert "padded keys" in checked["FilledAttention"], lines


@pytest.mark.parametrize(
    "name,label,old,new", [(name, *sabotage) for name, items in SABOTAGES.items() for sabotage in items]
)
def test_sabotaged_inline_port_fails(name: str, label: str, old: str, new: str) -> None:
    path = FIXTURES / "inline_style" / name
    golden = (FIXTURES / "golden" / name).read_text(encoding="utf-8")
    assert old in golden, label
    verification = _verify(path, golden.replace(old, new, 1))
    assert not verification.passed, f"{label}: " + "\n".join(verification.lines)


def _ported_in_place(path: Path, source: str):  # type: ignore[no-untyped-def]
    """`source` written at `path`, ported (in place, it must be) and verified: (result, verification, its lines)."""
    from sdpa_port.edge.after_port import verify_port

    path.write_text(source, encoding="utf-8")
    result = port_source(source, filename=path.name)
    assert result.status is Status.PORTED and result.style == "inline", result.reasons
    verification = verify_port(path, source, result)
    return result, verification, "\n".join(verification.lines)


def test_remote_code_with_unimportable_imports_is_checked_with_stand_ins(tmp_path: Path) -> None:
    """A file importing its own package (relative and absolute) is loaded with stand-ins; its attention classes are
    checked on their own, and a sabotage is still seen."""
    tower = (FIXTURES / "inline_style" / "modeling_tiny_tower.py").read_text(encoding="utf-8")
    source = tower.replace(
        "from torch import nn\n",
        "from torch import nn\n\nfrom .helpers import to_2tuple\nfrom some_missing_package.layers import DropPath\n",
    )
    path = tmp_path / "tower_attention.py"
    result, verification, lines = _ported_in_place(path, source)
    assert verification.passed, lines
    assert "stand-ins for `some_missing_package`, its relative imports" in lines, lines
    from sdpa_port.edge.after_port import verify_port

    sabotaged = replace_result(result, result.source.replace("scale=1.0,", "scale=0.5,", 1))
    assert not verify_port(path, source, sabotaged).passed


def test_a_stand_in_instance_at_module_level_does_not_stop_the_check(tmp_path: Path) -> None:
    """`logger = get_logger()` of a package not installed binds a stand-in's instance at module level: looking for
    the file's config class must pass it by, and the attention class is checked and verified."""
    vae = (FIXTURES / "inline_style" / "modeling_tiny_vae.py").read_text(encoding="utf-8")
    source = vae.replace(
        "from torch import nn\n", "from torch import nn\n\nfrom some_missing_package.logging import get_logger\n\nlogger = get_logger()\n"
    )
    _, verification, lines = _ported_in_place(tmp_path / "vae_logged.py", source)
    assert verification.passed, lines
    assert "channels-first maps" in lines, lines


REGISTRY_IMPORTS = (
    "from torch import nn\n\nfrom some_missing_package.builder import MODELS\nfrom some_missing_package.metainfo import Models\n"
    "from ...registry import Registry\n\nBLOCKS = Registry('blocks')\n"
)


def test_a_registry_of_a_missing_package_decorates_while_the_file_loads(tmp_path: Path) -> None:
    """`@MODELS.register_module(group_key=..., module_name=Models.tower)` and `@BLOCKS.register_module()` on a registry
    built at module level: while the file loads, stand-ins decorate by giving back the class, so the attention class
    is checked, and a sabotage is still seen."""
    tower = (FIXTURES / "inline_style" / "modeling_tiny_tower.py").read_text(encoding="utf-8")
    source = tower.replace("from torch import nn\n", REGISTRY_IMPORTS)
    source = source.replace("class TowerBlock(", "@BLOCKS.register_module()\nclass TowerBlock(")
    source = source.replace(
        "class Tower(", "@MODELS.register_module(group_key='backbone', module_name=Models.tower)\nclass Tower("
    )
    path = tmp_path / "tower_registered.py"
    result, verification, lines = _ported_in_place(path, source)
    assert verification.passed, lines
    assert "stand-ins for `some_missing_package`, its relative imports" in lines, lines
    from sdpa_port.edge.after_port import verify_port

    sabotaged = replace_result(result, result.source.replace("scale=1.0,", "scale=0.5,", 1))
    assert not verify_port(path, source, sabotaged).passed


def test_a_registry_value_read_at_run_time_is_not_a_pass(tmp_path: Path) -> None:
    """Once the file has loaded, a stand-in's attribute read by the forward fails like any stand-in: not verified."""
    tower = (FIXTURES / "inline_style" / "modeling_tiny_tower.py").read_text(encoding="utf-8")
    source = tower.replace("from torch import nn\n", REGISTRY_IMPORTS)
    # a call whose result is dropped: only failing when called tells it apart from a pass
    source = source.replace("        B, N, C = x.shape\n", "        B, N, C = x.shape\n        Models.check(x)\n", 1)
    _, verification, _ = _ported_in_place(tmp_path / "tower_registry_read.py", source)
    assert not verification.passed
    assert verification.undriven is not None, verification.lines


def _split_config(tmp_path: Path, with_sibling: bool) -> Path:
    """The class-style encoder fixture as remote code: its config class in `configuration.py` beside it (when
    `with_sibling`), read through a name no rule values (`config.distance_span`), the rest from a missing package."""
    encoder = (FIXTURES / "class_style" / "modeling_tiny_encoder.py").read_text(encoding="utf-8")
    encoder = encoder.replace("max_length", "distance_span")
    start, end = encoder.index("class TinyEncoderConfig("), encoder.index("class TinyEncoderSelfAttention(")
    header = "from transformers import PretrainedConfig\n\n\n"
    if with_sibling:
        (tmp_path / "configuration.py").write_text(header + encoder[start:end], encoding="utf-8")
    modeling = encoder[:start] + encoder[end:]
    modeling = modeling.replace("from ...configuration_utils import PretrainedConfig\n", "from .configuration import TinyEncoderConfig\n")
    modeling = modeling.replace("from ...modeling_outputs", "from transformers.modeling_outputs")
    modeling = modeling.replace("from ...modeling_utils", "from transformers.modeling_utils")
    modeling = modeling.replace("from torch import nn\n", "from torch import nn\n\nfrom some_missing_package.registry import MODELS\n")
    path = tmp_path / "backbone.py"
    path.write_text(modeling, encoding="utf-8")
    return path


def test_a_config_class_in_a_file_beside_it_builds_the_classes_checked_alone(tmp_path: Path) -> None:
    """`from .configuration import TinyEncoderConfig` where that file sits beside the one ported: it runs (its own
    missing imports standing in), so the attention class is built from the real config class, checked, and a sabotage
    is seen; without that file, the class cannot be built and the port is not verified."""
    from sdpa_port.edge.after_port import verify_port

    path = _split_config(tmp_path, with_sibling=True)
    source = path.read_text(encoding="utf-8")
    result = port_source(source, filename=path.name)
    assert result.status is Status.PORTED and result.style == "class", result.reasons
    verification = verify_port(path, source, result)
    lines = "\n".join(verification.lines)
    assert verification.passed, lines
    assert "alone" in lines, lines
    sabotaged = replace_result(result, result.source.replace("scale=", "scale=0.5 * ", 1))
    assert not verify_port(path, source, sabotaged).passed
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    path = _split_config(lonely, with_sibling=False)
    verification = verify_port(path, source, result)
    assert not verification.passed and verification.undriven is not None, verification.lines


def test_a_stand_in_used_at_run_time_is_not_a_pass(tmp_path: Path) -> None:
    """An attention class that calls what a stand-in replaced cannot be checked: not verified, never a pass."""
    tower = (FIXTURES / "inline_style" / "modeling_tiny_tower.py").read_text(encoding="utf-8")
    source = tower.replace("from torch import nn\n", "from torch import nn\n\nfrom .helpers import scale_of\n")
    source = re.sub(r"q = q / math\.sqrt\(self\.head_dim\)", "q = q * scale_of(self.head_dim)", source)
    path = tmp_path / "tower_used.py"
    path.write_text(source, encoding="utf-8")
    result = port_source(source, filename=path.name)
    if result.status is not Status.PORTED:
        pytest.skip(f"not ported: {result.reasons}")
    from sdpa_port.edge.after_port import verify_port

    verification = verify_port(path, source, result)
    assert not verification.passed
    assert verification.undriven is not None, verification.lines


def replace_result(result, source: str):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(result, source=source)


def test_a_config_from_another_file_is_made_from_the_names_the_class_reads(tmp_path: Path) -> None:
    """Widths, heads, rates, switches (off) and bias switches (on) are valued by name; any other name cannot be."""
    from sdpa_port.verify.alone import _CannotBuild, generic_config

    source = (
        "from torch import nn\n\n\nclass Reads(nn.Module):\n    def __init__(self, config):\n        super().__init__()\n"
        "        self.q = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)\n"
        "        self.heads = config.num_attention_heads\n        self.flash = config.use_flash_attn\n"
        "        self.drop = nn.Dropout(config.attention_dropout)\n        self.norm = config.qk_normalization\n"
    )
    path = tmp_path / "reads.py"
    path.write_text(source + "\n\nclass Unknown(Reads):\n    def __init__(self, config):\n        self.x = config.mystery\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("reads_for_config", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[spec.name] = module  # where `inspect.getsource` finds the class's file
    spec.loader.exec_module(module)
    config = generic_config(module.Reads)
    assert (config.hidden_size, config.num_attention_heads, config.attention_dropout) == (32, 4, 0.0)
    assert config.qkv_bias is True and config.use_flash_attn is False and config.qk_normalization is False
    with pytest.raises(_CannotBuild, match="config.mystery"):
        generic_config(module.Unknown)


@pytest.mark.parametrize("upcast", [True, False])
def test_precision_branches_agree_with_a_boolean_key_mask(tmp_path: Path, upcast: bool) -> None:
    """The product taken on float32 copies in one branch only (`modeling_tiny_precision.py`): the golden port agrees
    with the original in each branch, with padded keys and a batch row whose every key is masked, and gives the value's
    dtype back."""
    import importlib.util

    import torch

    def load(path: Path, name: str):  # type: ignore[no-untyped-def]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    name = "modeling_tiny_precision.py"
    original = load(FIXTURES / "inline_style" / name, f"precision_eager_{upcast}")
    ported = load(FIXTURES / "golden" / name, f"precision_port_{upcast}")
    torch.manual_seed(0)
    eager = original.PrecisionAttention(32, heads=4, upcast=upcast).eval()
    sdpa = ported.PrecisionAttention(32, heads=4, upcast=upcast).eval()
    sdpa.load_state_dict(eager.state_dict())
    x = torch.randn(3, 5, 32) * 2
    context = torch.randn(3, 7, 32)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[0, 4:] = False
    mask[2] = False  # every key masked: eager's fill gives uniform weights, as SDPA's added lowest value does
    for args in ((x, None, None), (x, context, None), (x, context, mask)):
        with torch.no_grad():
            expected, weights = eager(*args, output_attentions=False)
            got, none = sdpa(*args, output_attentions=False)
        assert weights is None and none is None and got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


JSON_CONFIG = '''
import math

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_utils import PreTrainedModel

from some_missing_package.registry import MODELS


class TinyJsonConfig(PretrainedConfig):
    model_type = "tiny_json"
    attribute_map = {"max_position_embeddings": "n_positions"}

    def __init__(self, hidden_size=32, num_attention_heads=4, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads


class TinyCrossAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.heads
        self.span = config.max_position_embeddings
        self.window = config.seq_length
        self.params_dtype = config.params_dtype
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.encoder_hidden_size, config.hidden_size)
        self.value = nn.Linear(config.encoder_hidden_size, config.hidden_size)

    def split(self, x):
        return x.view(x.size(0), x.size(1), self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None):
        q = self.split(self.query(hidden_states))
        k = self.split(self.key(encoder_hidden_states))
        v = self.split(self.value(encoder_hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = scores.softmax(dim=-1)
        out = torch.matmul(probs, v).permute(0, 2, 1, 3)
        return out.reshape(out.size(0), out.size(1), -1)


class TinyJsonPreTrainedModel(PreTrainedModel):
    config_class = TinyJsonConfig
'''


def test_config_values_left_to_config_json_and_cross_states_are_given(tmp_path: Path) -> None:
    """Remote code whose config class sets some values only from a saved `config.json` (`seq_length`,
    `params_dtype`, and an `attribute_map` target its `__init__` never sets), read by a cross-attention that always reads
    `encoder_hidden_states` (of `config.encoder_hidden_size`): each value is given by its name, the states are given,
    the class is checked alone, and a sabotage is seen."""
    result, verification, lines = _ported_in_place(tmp_path / "backbone.py", JSON_CONFIG)
    assert verification.passed, lines
    assert "with encoder_hidden_states" in lines, lines
    sabotaged = replace_result(result, result.source.replace("scale=", "scale=0.5 * ", 1))
    assert not verify_port_of(tmp_path / "backbone.py", JSON_CONFIG, sabotaged).passed


def verify_port_of(path: Path, source: str, result):  # type: ignore[no-untyped-def]
    from sdpa_port.edge.after_port import verify_port

    return verify_port(path, source, result)


def test_sharpened_weights_reach_a_gated_attention_under_spectral_norm() -> None:
    """The checks' sharpened weights (`verify/model_builds.sharpen`): a gate that starts at zero is given a value, and
    a spectral norm's vectors are settled for the redrawn weight, so the normalised weight has norm 1 (the stale
    vectors give a norm of any size and sign: a softmax made one-hot, or flat, that no wrong scale changes)."""
    import torch

    from sdpa_port.verify.model_builds import sharpen

    torch.manual_seed(0)
    block = torch.nn.Module()
    block.proj = torch.nn.utils.spectral_norm(torch.nn.Conv1d(32, 8, kernel_size=1))
    block.gate = torch.nn.Parameter(torch.zeros(1))
    sharpen(block, 2.0)
    block.eval()
    with torch.no_grad():
        block.proj(torch.randn(1, 32, 5))  # the hook divides the weight by the norm its vectors give
        norm = torch.linalg.matrix_norm(block.proj.weight.flatten(1), 2)
    assert float(block.gate) != 0.0
    assert abs(float(norm) - 1.0) < 1e-3, float(norm)


# values read from the code (`verify/alone_inputs.py`): a relation the forward embeds (indices below the embedding's
# size, one per pair of positions), a row split into square patches of a constructor's side (a one-row image of
# several patches), and a head size named `d_head` with seq-first states `w` and a (length, width) position table `r`
READ_OFF_THE_CODE = '''import math

import torch
from torch import nn


class RelationAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.size = config.hidden_size // config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.links = nn.Embedding(5, config.num_attention_heads)

    def forward(self, hidden_states, attention_mask, relation):
        b, n, _ = hidden_states.shape
        q, k, v = self.qkv(hidden_states).view(b, n, 3, self.heads, self.size).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.size)
        scores = scores + self.links(relation).permute(0, 3, 1, 2) + attention_mask
        probs = nn.functional.softmax(scores, dim=-1)
        return torch.matmul(probs, v).transpose(1, 2).reshape(b, n, -1)


class RowPatchAttention(nn.Module):
    def __init__(self, dim_in, dim_out, heads=8, dim_head=64, k=4):
        super().__init__()
        self.heads, self.k = heads, k
        self.scale = dim_head**-0.5
        self.to_q = nn.Conv2d(dim_in, dim_head * heads, 1, bias=False)
        self.to_kv = nn.Conv2d(dim_in, 2 * dim_head * heads, k, stride=k, bias=False)
        self.to_out = nn.Conv2d(dim_head * heads, dim_out, 1)

    def forward(self, fmap):
        b, c, x, y = fmap.shape
        k, h = self.k, self.heads
        q = self.to_q(fmap).reshape(b * h, -1, x * y).transpose(1, 2)
        patches = fmap.reshape(b, c, y // (k * k), k, k).permute(0, 2, 1, 3, 4).reshape(-1, c, k, k)
        kv = self.to_kv(patches).reshape(b, y // (k * k), -1).transpose(1, 2)
        key, value = kv.reshape(b * h, 2, -1, y // (k * k)).unbind(1)
        dots = torch.bmm(q, key) * self.scale
        attn = dots.softmax(dim=-1)
        out = torch.bmm(attn, value.transpose(1, 2))
        return self.to_out(out.transpose(1, 2).reshape(b, -1, x, y))


class PositionTableAttention(nn.Module):
    def __init__(self, n_head, d_model, d_head, dropout):
        super().__init__()
        self.n_head, self.d_head = n_head, d_head
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.drop = nn.Dropout(dropout)
        self.scale = 1 / (d_head**0.5)

    def forward(self, w, r, attn_mask=None):
        qlen, bsz, rlen = w.size(0), w.size(1), r.size(0)
        q, k, v = torch.chunk(self.qkv_net(w), 3, dim=-1)
        q = q.view(qlen, bsz, self.n_head, self.d_head)
        k = k.view(qlen, bsz, self.n_head, self.d_head)
        v = v.view(qlen, bsz, self.n_head, self.d_head)
        r_k = self.r_net(r).view(rlen, self.n_head, self.d_head)
        score = torch.einsum("ibnd,jbnd->ijbn", (q, k)) + torch.einsum("ibnd,jnd->ijbn", (q, r_k))
        score = score * self.scale
        prob = nn.functional.softmax(score, dim=1)
        prob = self.drop(prob)
        vec = torch.einsum("ijbn,jbnd->ibnd", (prob, v))
        return [self.o_net(vec.reshape(qlen, bsz, self.n_head * self.d_head))]
'''


def test_inputs_read_off_the_code_verify_the_modules_and_a_sabotage_is_seen(tmp_path: Path) -> None:
    """Each class runs only on inputs its code asks for; each is checked alone, and a wrong scale fails each."""
    path = tmp_path / "read_off.py"
    result, verification, lines = _ported_in_place(path, READ_OFF_THE_CODE)
    assert verification.passed, lines
    checked = {line.split(" in place")[0]: line for line in verification.lines if " in place:" in line}
    assert sorted(checked) == ["PositionTableAttention", "RelationAttention", "RowPatchAttention"], lines
    assert "padded keys" in checked["RelationAttention"], lines  # the mask is required: given, with the relation
    assert "channels-first maps" in checked["RowPatchAttention"], lines
    assert "seq-first states" in checked["PositionTableAttention"], lines
    for name in checked:
        start = result.source.index(f"class {name}(")
        end = result.source.find("\nclass ", start + 1)
        end = len(result.source) if end < 0 else end
        body = result.source[start:end]
        assert "scale=" in body, name
        sabotaged = result.source[:start] + body.replace("scale=", "scale=1.1 * ", 1) + result.source[end:]
        failed = verify_port_of(path, READ_OFF_THE_CODE, replace_result(result, sabotaged))
        assert not failed.passed, f"{name}: " + "\n".join(failed.lines)
        assert any(line.startswith(f"{name} in place: FAILED") for line in failed.lines), failed.lines


# inputs read off how the forward uses them (issue 36, PoNet's form): positions a gather or `index=` takes, a segment
# per two tokens, and a boolean per token the forward reshapes to fill by, the first token flagged
SEGMENT_INPUTS = '''import math

import torch
from torch import nn


def pool_segments(states, index):
    pooled = torch.zeros_like(states).scatter_reduce(
        1, index.unsqueeze(-1).expand_as(states), states, reduce="amax", include_self=False
    )
    return torch.gather(pooled, 1, index.unsqueeze(-1).expand_as(states))


class SegmentPoolAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.size = config.hidden_size // config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.segment = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states, segment_index, token_type_mask, attention_mask=None):
        b, n, _ = hidden_states.shape
        q, k, v = self.qkv(hidden_states).view(b, n, 3, self.heads, self.size).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.size)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = nn.functional.softmax(scores, dim=-1)
        context = torch.matmul(probs, v).transpose(1, 2).reshape(b, n, -1)
        segments = self.segment(hidden_states).masked_fill(token_type_mask.unsqueeze(-1), 0.0)
        return context + pool_segments(segments, index=segment_index)
'''


def test_positions_and_token_flags_read_off_the_forward_verify_the_module(tmp_path: Path) -> None:
    """A forward that needs segment positions and per-token flags beside its states runs on none of the plain
    inputs; read off the code, it is checked alone with and without padded keys, and a wrong scale is seen."""
    path = tmp_path / "segments.py"
    result, verification, lines = _ported_in_place(path, SEGMENT_INPUTS)
    assert verification.passed, lines
    checked = [line for line in verification.lines if line.startswith("SegmentPoolAttention in place:")]
    assert checked and "padded keys" in checked[0], lines
    sabotaged = result.source.replace("scale=", "scale=1.1 * ", 1)
    assert sabotaged != result.source
    failed = verify_port_of(path, SEGMENT_INPUTS, replace_result(result, sabotaged))
    assert not failed.passed and any(line.startswith("SegmentPoolAttention in place: FAILED") for line in failed.lines)


# widths and images read off the code (issue 36): a constructor parameter no name rule values but `__init__` gives a
# convolution as its channels (`key_channels`), and a forward unpacking an image's sides into names the module holds
# integers of (`rows`, `cols`), which its relative position parameters are sized to
CONV_SIZES = '''import torch
from torch import nn


class ObjectContext(nn.Module):
    def __init__(self, in_channels, key_channels, scale=1):
        super().__init__()
        self.key_channels = key_channels
        self.f_pixel = nn.Sequential(nn.Conv2d(in_channels, key_channels, 1), nn.BatchNorm2d(key_channels), nn.ReLU())
        self.f_object = nn.Conv2d(in_channels, key_channels, 1)
        self.f_down = nn.Conv2d(in_channels, key_channels, 1)
        self.f_up = nn.Conv2d(key_channels, in_channels, 1)

    def forward(self, x, proxy):
        batch_size = x.size(0)
        query = self.f_pixel(x).view(batch_size, self.key_channels, -1).permute(0, 2, 1)
        key = self.f_object(proxy).view(batch_size, self.key_channels, -1)
        value = self.f_down(proxy).view(batch_size, self.key_channels, -1).permute(0, 2, 1)
        sim_map = torch.matmul(query, key)
        sim_map = (self.key_channels**-0.5) * sim_map
        sim_map = nn.functional.softmax(sim_map, dim=-1)
        context = torch.matmul(sim_map, value).permute(0, 2, 1).contiguous()
        return self.f_up(context.view(batch_size, self.key_channels, *x.size()[2:]))


class GridAttention(nn.Module):
    def __init__(self, n_dims, rows=5, cols=3, heads=4):
        super().__init__()
        self.heads, self.rows, self.cols = heads, rows, cols
        self.query = nn.Conv2d(n_dims, n_dims, kernel_size=1)
        self.key = nn.Conv2d(n_dims, n_dims, kernel_size=1)
        self.value = nn.Conv2d(n_dims, n_dims, kernel_size=1)
        self.rel_h = nn.Parameter(torch.randn([1, heads, n_dims // heads, 1, cols]))
        self.rel_w = nn.Parameter(torch.randn([1, heads, n_dims // heads, rows, 1]))
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        n_batch, C, rows, cols = x.size()
        q = self.query(x).view(n_batch, self.heads, C // self.heads, -1)
        k = self.key(x).view(n_batch, self.heads, C // self.heads, -1)
        v = self.value(x).view(n_batch, self.heads, C // self.heads, -1)
        content = torch.matmul(q.permute(0, 1, 3, 2), k)
        position = (self.rel_h + self.rel_w).view(1, self.heads, C // self.heads, -1).permute(0, 1, 3, 2)
        energy = content + torch.matmul(position, q)
        attention = self.softmax(energy * 0.5)
        out = torch.matmul(v, attention.permute(0, 1, 3, 2))
        return out.view(n_batch, C, rows, cols)
'''


# channels-last patch tokens `(B, H, W, C)` of a windowed module, and [DET] tokens `(B, n, C)` beside them (vidt's RAM)
CHANNELS_LAST = '''import torch
from torch import nn


class PatchDetAttention(nn.Module):
    def __init__(self, dim, window_size, num_heads):
        super().__init__()
        self.window_size, self.num_heads = window_size, num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, det, mask=None):
        B, H, W, C = x.shape
        assert H * W == self.window_size[0] * self.window_size[1]
        tokens = torch.cat([x.view(B, H * W, C), det], dim=1)
        qkv = self.qkv(tokens).view(B, -1, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        out = self.proj((attn @ v).transpose(1, 2).reshape(B, -1, C))
        return out[:, : H * W].reshape(B, H, W, C), out[:, H * W :]
'''


@pytest.mark.parametrize(
    "source,expected",
    [
        (
            CONV_SIZES,
            {"ObjectContext": "channels-first maps of 2 x 4", "GridAttention": "channels-first maps of 5 x 3"},
        ),
        (CHANNELS_LAST, {"PatchDetAttention": "channels-last maps of 3 x 3"}),
    ],
    ids=["conv", "channels-last"],
)
def test_widths_and_images_read_off_the_code_verify_the_modules(
    tmp_path: Path, source: str, expected: dict[str, str]
) -> None:
    """`key_channels` and `n_dims` are widths (layer sizes), `GridAttention` runs on images of its own 5 x 3 sides
    (the default image 2 x 4 otherwise), `PatchDetAttention` on channels-last maps of its window's sides with tokens
    beside them; each class is checked alone on those, and a wrong scale fails each."""
    path = tmp_path / "read_off_sizes.py"
    result, verification, lines = _ported_in_place(path, source)
    assert verification.passed, lines
    checked = {line.split(" in place")[0]: line for line in verification.lines if " in place:" in line}
    assert sorted(checked) == sorted(expected), lines
    assert all(layout in checked[name] for name, layout in expected.items()), lines
    for name in checked:
        start = result.source.index(f"class {name}(")
        end = result.source.find("\nclass ", start + 1)
        end = len(result.source) if end < 0 else end
        call = result.source.index("scaled_dot_product_attention(", start)  # the call's scale, not `__init__`'s
        assert call < end and "scale=" in result.source[call:end], name
        sabotaged = result.source[:call] + result.source[call:].replace("scale=", "scale=1.1 * ", 1)
        failed = verify_port_of(path, source, replace_result(result, sabotaged))
        assert not failed.passed, f"{name}: " + "\n".join(failed.lines)
        assert any(line.startswith(f"{name} in place: FAILED") for line in failed.lines), failed.lines
