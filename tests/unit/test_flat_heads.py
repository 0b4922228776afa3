"""Before/after pairs for `rewrite/flat_heads.py`: operands flattened only for bmm passed to SDPA whole."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from sdpa_port.rewrite.flat_heads import keep_heads

SHAPE = """
def _shape(self, tensor, seq_len, bsz):
    return tensor.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2).contiguous()
"""
GLOBAL_SHAPE = """
def _shape(self, tensor, seq_len, bsz):
    return tensor.view(bsz, seq_len, HEADS, self.head_dim).transpose(1, 2).contiguous()
"""

SDPA = "torch.nn.functional.scaled_dot_product_attention"
SPLIT = ".unflatten(0, (bsz, self.num_heads))"
CALL = f"out = {SDPA}(q{SPLIT}, k{SPLIT}, v{SPLIT}, attn_mask=mask, scale=1.0).flatten(0, 1)"
CHECK = """if out.size() != (bsz * self.num_heads, tgt_len, self.head_dim):
        raise ValueError("wrong size")
"""
BACK = "out = out.view(bsz, self.num_heads, tgt_len, self.head_dim)"

# BART's form: the query proven by `_shape`; the key and value may come from the cache as they are, so stay flat
BART = f"""
def forward(self, x, past=None, mask=None):
    bsz, tgt_len, _ = x.size()
    if past is not None:
        k = past[0]
        v = past[1]
    else:
        k = self._shape(self.k(x), -1, bsz)
        v = self._shape(self.v(x), -1, bsz)
    proj_shape = (bsz * self.num_heads, -1, self.head_dim)
    q = self._shape(self.q(x), tgt_len, bsz).view(*proj_shape)
    k = k.view(*proj_shape)
    v = v.view(*proj_shape)
    src_len = k.size(1)
    {CALL}

    {CHECK}
    # back to the heads
    {BACK}
    return out.transpose(1, 2)
"""
BART_AFTER = f"""
def forward(self, x, past=None, mask=None):
    bsz, tgt_len, _ = x.size()
    if past is not None:
        k = past[0]
        v = past[1]
    else:
        k = self._shape(self.k(x), -1, bsz)
        v = self._shape(self.v(x), -1, bsz)
    proj_shape = (bsz * self.num_heads, -1, self.head_dim)
    q = self._shape(self.q(x), tgt_len, bsz)
    k = k.view(*proj_shape)
    v = v.view(*proj_shape)
    src_len = k.size(1)
    out = {SDPA}(q, k{SPLIT}, v{SPLIT}, attn_mask=mask, scale=1.0)

    # back to the heads
    return out.transpose(1, 2)
"""

# every operand proven, the cache concatenated along the length: the sizes' tuple goes, the key's length moves on
CACHED = f"""
def forward(self, x, past=None, mask=None):
    bsz, tgt_len, _ = x.size()
    k = self._shape(self.k(x), -1, bsz)
    v = self._shape(self.v(x), -1, bsz)
    if past is not None:
        k = torch.cat([past[0], k], dim=2)
        v = torch.cat([past[1], v], dim=2)
    proj_shape = (bsz * self.num_heads, -1, self.head_dim)
    q = self._shape(self.q(x), tgt_len, bsz).view(*proj_shape)
    k = k.reshape(*proj_shape)
    v = v.reshape(*proj_shape)
    src_len = k.size(1)
    {CALL}
    {BACK}
    return out.to(q.dtype)
"""
CACHED_AFTER = f"""
def forward(self, x, past=None, mask=None):
    bsz, tgt_len, _ = x.size()
    k = self._shape(self.k(x), -1, bsz)
    v = self._shape(self.v(x), -1, bsz)
    if past is not None:
        k = torch.cat([past[0], k], dim=2)
        v = torch.cat([past[1], v], dim=2)
    q = self._shape(self.q(x), tgt_len, bsz)
    src_len = k.size(2)
    out = {SDPA}(q, k, v, attn_mask=mask, scale=1.0)
    return out.to(q.dtype)
"""

# BART's form where forward stores its key and value as the cache it returns: the cache holds what forward stored,
# `(b, h, _, d)` wherever it was proven, so the key and value read from it are taken whole too
STORED = BART.replace(
    "    proj_shape", "    past = (k, v)\n    proj_shape"
).replace("    return out.transpose(1, 2)", "    return out.transpose(1, 2), past")
STORED_AFTER = f"""
def forward(self, x, past=None, mask=None):
    bsz, tgt_len, _ = x.size()
    if past is not None:
        k = past[0]
        v = past[1]
    else:
        k = self._shape(self.k(x), -1, bsz)
        v = self._shape(self.v(x), -1, bsz)
    past = (k, v)
    q = self._shape(self.q(x), tgt_len, bsz)
    src_len = k.size(2)
    out = {SDPA}(q, k, v, attn_mask=mask, scale=1.0)

    # back to the heads
    return out.transpose(1, 2), past
"""

STILL_FLAT = """    proj_shape = (bsz * self.num_heads, -1, self.head_dim)
    q = self._shape(self.q(x), tgt_len, bsz)
    k = k.reshape(*proj_shape)
    v = v.reshape(*proj_shape)
"""

CASES = [
    (BART, SHAPE, BART_AFTER),
    (STORED, SHAPE, STORED_AFTER),
    # the cache returned is not the one stored: what forward reads from it may be laid out otherwise
    (STORED.replace("), past\n", "), None\n"), SHAPE, BART_AFTER.replace("    proj_shape", "    past = (k, v)\n    proj_shape")
     .replace("    return out.transpose(1, 2)", "    return out.transpose(1, 2), None")),
    # the key bound again after it is stored: the cache holds another tensor than the one flattened
    (STORED.replace("    past = (k, v)\n", "    past = (k, v)\n    k = k.flip(2)\n"), SHAPE,
     BART_AFTER.replace("    proj_shape", "    past = (k, v)\n    k = k.flip(2)\n    proj_shape")
     .replace("    return out.transpose(1, 2)", "    return out.transpose(1, 2), past")
     .replace("k.view(*proj_shape)\n    v = v.view", "k.view(*proj_shape)\n    v = v.view")
     .replace("(q, k{SPLIT}, v{SPLIT},".replace("{SPLIT}", SPLIT), f"(q, k{SPLIT}, v,")
     .replace("    v = v.view(*proj_shape)\n", "")),
    # the key laid out otherwise where it is stored than where it is flattened: the cache is not what is proven
    (
        STORED.replace("k = past[0]", "k = past[0].transpose(1, 2)")
        .replace("k = self._shape(self.k(x), -1, bsz)", "k = self._shape(self.k(x), -1, bsz).transpose(1, 2)")
        .replace("    past = (k, v)\n", "    past = (k, v)\n    k = k.transpose(1, 2)\n"),
        SHAPE,
        STORED_AFTER.replace("k = past[0]", "k = past[0].transpose(1, 2)")
        .replace("k = self._shape(self.k(x), -1, bsz)", "k = self._shape(self.k(x), -1, bsz).transpose(1, 2)")
        .replace("    past = (k, v)\n", "    past = (k, v)\n    k = k.transpose(1, 2)\n    proj_shape = (bsz * self.num_heads, -1, self.head_dim)\n")
        .replace("    src_len = k.size(2)\n", "    k = k.view(*proj_shape)\n    src_len = k.size(1)\n")
        .replace("(q, k, v,", f"(q, k{SPLIT}, v,"),
    ),
    # the cache stored in another order: its first element is the value, not the key
    (STORED.replace("past = (k, v)", "past = (v, k)"), SHAPE,
     BART_AFTER.replace("    proj_shape", "    past = (v, k)\n    proj_shape")
     .replace("    return out.transpose(1, 2)", "    return out.transpose(1, 2), past")),
    (CACHED, SHAPE, CACHED_AFTER),
    # the proven last size is not the flattening's: the view regroups, nothing changes
    (CACHED.replace("-1, self.head_dim)", "-1, self.head_size)"), SHAPE, None),
    # the batch size bound twice: read at the view, it may hold another value than where the shape was proven
    (CACHED.replace("    proj_shape", "    bsz = bsz\n    proj_shape"), SHAPE, None),
    # the method reads a name of its module, which forward could bind to something else
    (CACHED, GLOBAL_SHAPE, None),
    # the flat key's first size, and the flat value used otherwise: neither has a whole-tensor reading
    (
        CACHED.replace("k.size(1)", "k.size(0)").replace("out.to(q.dtype)", "out + v.sum()"),
        SHAPE,
        CACHED_AFTER.replace("    q = self._shape(self.q(x), tgt_len, bsz)\n", STILL_FLAT)
        .replace("k.size(2)", "k.size(0)")
        .replace("(q, k, v,", f"(q, k{SPLIT}, v{SPLIT},")
        .replace("out.to(q.dtype)", "out + v.sum()"),
    ),
    # the query's length not written where it is viewed: the output's check and view back stay
    (
        BART.replace("self.q(x), tgt_len, bsz", "self.q(x), -1, bsz"),
        SHAPE,
        BART_AFTER.replace("self.q(x), tgt_len, bsz", "self.q(x), -1, bsz")
        .replace("scale=1.0)\n", f"scale=1.0).flatten(0, 1)\n\n    {CHECK}")
        .replace("    # back to the heads\n", f"    # back to the heads\n    {BACK}\n"),
    ),
    # the check names another length than the query's: it may raise, so it stays, and the view back with it
    (
        BART.replace("self.num_heads, tgt_len, self.head_dim):", "self.num_heads, src_len, self.head_dim):"),
        SHAPE,
        BART_AFTER.replace("scale=1.0)\n", "scale=1.0).flatten(0, 1)\n\n    "
        + CHECK.replace("tgt_len", "src_len"))
        .replace("    # back to the heads\n", f"    # back to the heads\n    {BACK}\n"),
    ),
]


def _parsed(text: str) -> cst.FunctionDef:
    node = cst.parse_module(textwrap.dedent(text).lstrip("\n")).body[0]
    assert isinstance(node, cst.FunctionDef)
    return node


@pytest.mark.parametrize(
    "before,method,after",
    CASES,
    ids=[
        "bart", "stored", "stored-not-returned", "stored-rebound", "stored-relaid", "stored-swapped", "all-proven", "other-last-size", "batch-rebound", "module-name", "other-reads", "unknown-length",
        "other-check",
    ],
)
def test_keep_heads(before: str, method: str, after: str | None) -> None:
    shape = _parsed(method)
    forward = _parsed(before)
    result = keep_heads(forward, lambda name: shape if name == "_shape" else None)
    expected = before if after is None else after
    assert cst.Module(body=[result]).code == textwrap.dedent(expected).lstrip("\n")


def test_keep_heads_is_idempotent() -> None:
    shape = _parsed(SHAPE)
    once = keep_heads(_parsed(CACHED), lambda name: shape if name == "_shape" else None)
    assert keep_heads(once, lambda name: shape) is once


def test_a_function_reading_the_flat_operand_keeps_it_flat() -> None:
    shape = _parsed(SHAPE)
    before = CACHED.replace("    return out.to(q.dtype)", "    first = lambda: q[0]\n    return out.to(first().dtype)")
    result = cst.Module(body=[keep_heads(_parsed(before), lambda name: shape)]).code
    assert "q = self._shape(self.q(x), tgt_len, bsz).view(*proj_shape)" in result
    assert f"{SDPA}(q{SPLIT}, k, v," in result
