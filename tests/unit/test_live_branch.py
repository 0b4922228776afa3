"""The live branch decides what a file computes (`discover/live.py`).

Rule 1: a side of a branch that cannot run (`if False:`, a module constant, an attribute set once to a literal in
`__init__`) does not count; a file whose live path calls SDPA already supports it, and a file whose SDPA call is dead
is ported. Rule 2: a class whose forward calls SDPA on its default path (torch 2 or later, the constructor's defaults,
no weights asked for) keeps its eager code for the other paths: the file already supports SDPA, and a warning names
that eager code. Each rule has its look-alikes, which do not count.
"""

from __future__ import annotations

import ast
import textwrap

from sdpa_port import Status, port_source
from sdpa_port.api import KEPT_EAGER
from sdpa_port.discover.bindings import Bindings
from sdpa_port.discover.live import live_tree, sdpa_use
from sdpa_port.discover.values import Evaluator, Scope
from sdpa_port.result import SUPPORTS_SDPA

# a module the class style wires (built from the config by a layer of a PreTrainedModel): where nothing decides the
# branch, the eager side is ported beside the SDPA call, so a look-alike comes out ported
WIRED = '''
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...modeling_utils import PreTrainedModel
{module}


class TinyAttention(nn.Module):
    def __init__(self, config{init_params}):
        super().__init__()
        self.heads = config.num_attention_heads
        self.scale = (config.hidden_size // self.heads) ** -0.5
        self.qkv = nn.Linear(config.hidden_size, config.hidden_size * 3)
{init}

    def forward(self, x, attn_mask=None{params}):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
{body}
        return x.transpose(1, 2).reshape(b, n, c)
{methods}

class TinyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyAttention(config)

    def forward(self, x):
        return x + self.attention(x)


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"


class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.layers = nn.ModuleList([TinyLayer(config) for _ in range(2)])
{tail}'''

SDPA = "x = F.scaled_dot_product_attention(q, k, v)"
EAGER = """attn = (q @ k.transpose(-2, -1)) * self.scale
attn = attn.softmax(dim=-1)
x = attn @ v"""


def branch(test: str, then: str = SDPA, otherwise: str = EAGER) -> str:
    """`if test: then else: otherwise`, indented as forward's body."""
    text = f"if {test}:\n{textwrap.indent(then, '    ')}\nelse:\n{textwrap.indent(otherwise, '    ')}"
    return textwrap.indent(text, " " * 8)


def wired(body: str, *, module: str = "", init: str = "", init_params: str = "", params: str = "", methods: str = "",
          tail: str = "") -> str:
    return WIRED.format(
        module=module,
        init=textwrap.indent(init, " " * 8) if init else "",
        init_params=init_params,
        params=params,
        body=body,
        methods=textwrap.indent(textwrap.dedent(methods), "    ") if methods else "",
        tail=tail,
    )


def eager_line(source: str, start: str = "attn = attn.softmax(dim=-1)") -> int:
    """The line of the first softmax of forward's eager code."""
    return next(number for number, line in enumerate(source.splitlines(), 1) if line.strip() == start)


def supported(source: str) -> tuple[str, ...]:
    """The port's warnings, the port being "already supports SDPA"."""
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.UNCHANGED and result.detail == SUPPORTS_SDPA, (result.detail, result.reasons)
    return result.warnings


def kept(source: str, where: str = "TinyAttention.forward") -> str:
    return f"eager attention the file keeps beside its SDPA support (not ported): {where} (line {eager_line(source)})"


def ported(source: str) -> None:
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, (result.detail, result.reasons)


# ------------------------------------------------------------------ rule 1: the branch that cannot run


def test_an_attribute_set_once_to_a_literal_decides_its_branch() -> None:
    """`self.fused_attn = True` set once, in `__init__`: the eager side cannot run and is not named."""
    assert supported(wired(branch("self.fused_attn"), init="self.fused_attn = True")) == ()
    # set to False, the SDPA call cannot run: the file computes eager attention, and is ported
    ported(wired(branch("self.fused_attn"), init="self.fused_attn = False"))


def test_a_literal_test_decides_its_branch() -> None:
    assert supported(wired(branch("False", EAGER, SDPA))) == ()
    assert supported(wired(branch("not True", EAGER, SDPA))) == ()
    ported(wired(branch("False")))


def test_a_module_constant_decides_its_branch() -> None:
    assert supported(wired(branch("USE_SDPA"), module="USE_SDPA = True")) == ()
    assert supported(wired(branch("not USE_SDPA or not self.fused", EAGER, SDPA), module="USE_SDPA: bool = True",
                           init="self.fused = True")) == ()
    ported(wired(branch("USE_SDPA"), module="USE_SDPA = False"))


def test_a_dead_sdpa_call_does_not_make_an_unwired_file_supported() -> None:
    """The inline style (a module built elsewhere) used to take any SDPA call in forward for support."""
    unwired = wired(branch("self.fused_attn"), init="self.fused_attn = False").split("class TinyLayer")[0]
    result = port_source(unwired, filename="modeling_tiny.py")
    assert result.status is Status.PORTED and result.style.value == "inline", (result.detail, result.reasons)
    live = wired(branch("self.fused_attn"), init="self.fused_attn = True").split("class TinyLayer")[0]
    assert supported(live) == ()


def test_attribute_look_alikes_are_not_constant() -> None:
    """Set in two places, from a parameter, outside `__init__`, by name, or by the frameworks: both sides can run."""
    twice = wired(branch("self.fused_attn"), init="self.fused_attn = True", methods="""
        def unfuse(self):
            self.fused_attn = False
    """)
    from_parameter = wired(branch("self.fused_attn"), init="self.fused_attn = fused", init_params=", fused")
    outside = wired(branch("self.fused_attn"), init="self.fused_attn = True",
                    tail="        self.layers[0].attention.fused_attn = False\n")
    by_name = wired(branch("self.fused_attn"), init="self.fused_attn = True\nsetattr(self, config.flag_name, False)")
    frameworks = wired(branch("not self.gradient_checkpointing"), init="self.gradient_checkpointing = False")
    for source in (twice, from_parameter, outside, by_name, frameworks):
        ported(source)


def test_constant_look_alikes_are_not_constant() -> None:
    """A module name bound again anywhere (assigned, a parameter, a local) is not a constant."""
    reassigned = wired(branch("USE_SDPA"), module="USE_SDPA = True\nUSE_SDPA = False")
    rebound = wired(branch("USE_SDPA"), module="USE_SDPA = True\ntry:\n    import xformers\nexcept ImportError:\n"
                                               "    USE_SDPA = False")
    shadowed = wired("        USE_SDPA = self.training\n" + branch("USE_SDPA"), module="USE_SDPA = True")
    for source in (reassigned, rebound, shadowed):
        ported(source)


def test_the_certain_tests_read_directly() -> None:
    source = textwrap.dedent('''
        import torch
        FLAG = True
        OTHER = 1
        OTHER = 2

        class Base(torch.nn.Module):
            def __init__(self, width):
                self.on = True
                self.off = None
                self.width = width
                self.training = True

        class Child(Base):
            def forward(self, FLAG2=True):
                if FLAG and self.on:
                    pass
                if self.off is None:
                    pass
                if self.width or OTHER or self.training:
                    pass
                if self.on == 1:
                    pass

        class Stranger(torch.nn.Module):
            def forward(self):
                if self.on:
                    pass
    ''')
    tree = ast.parse(source)
    bindings = Bindings.of(tree)
    evaluator = Evaluator(bindings)
    truths = [(owner, ast.unparse(test), evaluator.truth(test, Scope(owner))) for owner, test in bindings.tests]
    assert truths == [
        ("Child", "FLAG and self.on", True),
        ("Child", "self.off is None", True),
        ("Child", "self.width or OTHER or self.training", None),
        ("Child", "self.on == 1", True),
        ("Stranger", "self.on", None),  # not a class that sets it
    ]
    live = live_tree(tree, bindings)
    child = next(node for node in live.body if isinstance(node, ast.ClassDef) and node.name == "Child")
    assert [type(s).__name__ for s in child.body[0].body] == ["Pass", "Pass", "If", "Pass"]
    undecided = ast.parse("import torch\nif x:\n    pass\n")
    assert live_tree(undecided) is undecided


def test_statements_after_a_return_that_always_runs_cannot_run() -> None:
    after = "        if True:\n            " + SDPA + "\n            return x\n" + textwrap.indent(EAGER, " " * 8)
    assert supported(wired(after)) == ()


# ------------------------------------------------------------------ rule 2: the default path


def test_a_hasattr_check_in_init_selects_sdpa_by_default() -> None:
    """open_clip's `self.use_fsdpa = hasattr(nn.functional, 'scaled_dot_product_attention')`."""
    source = wired(branch("self.use_fsdpa"), init="self.use_fsdpa = hasattr(nn.functional, 'scaled_dot_product_attention')")
    assert supported(source) == (kept(source),)
    direct = wired(branch("hasattr(torch.nn.functional, 'scaled_dot_product_attention')"))
    assert supported(direct) == (kept(direct),)
    # another attribute of F, or of another module, says nothing
    ported(wired(branch("hasattr(F, 'flash_attention')")))
    ported(wired(branch("hasattr(math, 'scaled_dot_product_attention')")))


def test_a_torch_version_check_selects_sdpa_by_default() -> None:
    """chatglm2's `pytorch_major_version = int(torch.__version__.split('.')[0])`, and the usual parsers."""
    local = wired("        major = int(torch.__version__.split('.')[0])\n" + branch("major >= 2"))
    assert supported(local) == (kept(local),)
    parsed = wired(branch("version.parse(torch.__version__) >= version.parse('2.0')"),
                   module="from packaging import version")
    assert supported(parsed) == (kept(parsed),)
    below = wired(branch("torch.__version__ < '2'", EAGER, SDPA))
    assert supported(below) == (kept(below),)
    # not true on every torch from 2.0 on, or true on none
    ported(wired(branch("version.parse(torch.__version__) >= version.parse('2.1')"), module="from packaging import version"))
    ported(wired(branch("int(torch.__version__.split('.')[0]) >= 3")))


def test_a_weights_request_falls_back_to_eager() -> None:
    """`if output_attentions:` eager, else SDPA; before, the class style refused it (S109)."""
    source = wired(branch("output_attentions", EAGER, SDPA), params=", output_attentions=False")
    assert supported(source) == (kept(source),)
    weights = wired(branch("not need_weights"), params=", need_weights=True")
    assert supported(weights) == (kept(weights),)
    # a switch that is not a request for the weights, left to the caller, decides nothing
    ported(wired(branch("fast"), params=", *, fast"))


def test_a_flag_defaulting_to_sdpa_selects_it() -> None:
    source = wired(branch("self.use_sdpa"), init="self.use_sdpa = use_sdpa", init_params=", use_sdpa=True")
    assert supported(source) == (kept(source),)
    ported(wired(branch("self.use_sdpa"), init="self.use_sdpa = use_sdpa", init_params=", use_sdpa=False"))
    # the parameter bound again in `__init__`: its default says nothing
    ported(wired(branch("self.use_sdpa"), init="use_sdpa = config.use_sdpa\nself.use_sdpa = use_sdpa",
                 init_params=", use_sdpa=True"))


def test_a_flag_set_on_both_sides_of_an_open_test() -> None:
    """`__init__` sets the flag under a test its defaults do not decide: it holds what both sides agree on."""
    init = "if config.fast:\n    self.use_sdpa = True\nelse:\n    self.use_sdpa = {other}"
    source = wired(branch("self.use_sdpa"), init=init.format(other="True"))
    assert supported(source) == (kept(source),)
    ported(wired(branch("self.use_sdpa"), init=init.format(other="False")))


def test_an_option_off_by_default_leaves_its_eager_branch_off_the_default_path() -> None:
    """open_clip's scaled cosine attention: `self.logit_scale` is None unless `scaled_cosine=True`."""
    init = "self.scaled_cosine = scaled_cosine\nif self.scaled_cosine:\n    self.logit_scale = nn.Parameter(torch.ones(1))\n"
    init += "else:\n    self.logit_scale = None"
    body = branch("self.logit_scale is not None", EAGER, SDPA)
    source = wired(body, init=init, init_params=", scaled_cosine=False")
    assert supported(source) == (kept(source),)
    ported(wired(body, init=init, init_params=", scaled_cosine=True"))


def test_another_kernel_beside_sdpa_keeps_it_on_the_default_path() -> None:
    """xformers where it is installed, SDPA on torch 2, eager otherwise."""
    body = branch("self.use_xformers", "x = xops.memory_efficient_attention(q, k, v)", SDPA).replace(
        "else:", "elif hasattr(F, 'scaled_dot_product_attention'):", 1
    ) + "\n        else:\n" + textwrap.indent(EAGER, " " * 12)
    source = wired(body, init="self.use_xformers = config.use_xformers")
    assert supported(source) == (kept(source),)


def test_an_eager_helper_kept_for_the_weights_is_named() -> None:
    body = "        if output_attentions:\n            return self._eager(q, k, v)\n        " + SDPA
    helper = """
        def _eager(self, q, k, v):
            attn = (q @ k.transpose(-2, -1)) * self.scale
            attn = attn.softmax(dim=-1)
            return attn @ v
    """
    source = wired(body, params=", output_attentions=False", methods=helper)
    assert supported(source) == (kept(source, "TinyAttention._eager"),)


def test_an_optional_argument_left_at_none_falls_back_to_eager_off_the_default_path() -> None:
    """An inline port's own fallback for an optional input (`if graph is not None: return self._eager_forward(...)`):
    a call leaving it None runs SDPA, so the port ported again is unchanged."""
    helper = """
        def _eager(self, q, k, v, graph=None):
            attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
            if graph is not None:
                attn = attn * graph
            return attn @ v
    """
    body = "        if {test}:\n            return self._eager(q, k, v, graph)\n        " + SDPA
    source = wired(body.format(test="graph is not None"), params=", graph=None", methods=helper)
    line = eager_line(source, "attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)")
    assert supported(source) == (f"{KEPT_EAGER}TinyAttention._eager (line {line})",)
    # an input every call passes (a mask): a call may leave it None, a model does not
    masked = wired(body.format(test="attn_mask is not None").replace("graph)", "attn_mask)"), methods=helper)
    assert port_source(masked, filename="modeling_tiny.py").detail != SUPPORTS_SDPA
    # the parameter bound again in forward: its default says nothing
    again = wired("        graph = graph if self.training else None\n" + body.format(test="graph is not None"),
                  params=", graph=None", methods=helper)
    assert port_source(again, filename="modeling_tiny.py").detail != SUPPORTS_SDPA


def test_a_class_computing_with_sdpa_by_default_is_left_beside_a_port() -> None:
    """Another class of the file computes eager attention: that one is ported, and the warning names what the SDPA
    class keeps (class, method, line)."""
    source = wired(branch("self.use_fsdpa"), init="self.use_fsdpa = hasattr(F, 'scaled_dot_product_attention')")
    source += textwrap.dedent('''

        class TinyCrossAttention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.heads = config.num_attention_heads
                self.kv = nn.Linear(config.hidden_size, config.hidden_size * 2)

            def forward(self, x, context):
                b, n, c = x.shape
                q = x.reshape(b, n, self.heads, c // self.heads).transpose(1, 2)
                k, v = self.kv(context).reshape(b, -1, 2, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
                probs = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(dim=-1)
                return (probs @ v).transpose(1, 2).reshape(b, n, c)
    ''')
    source = source.replace(
        "self.attention = TinyAttention(config)",
        "self.attention = TinyAttention(config)\n        self.cross = TinyCrossAttention(config)",
    ).replace("return x + self.attention(x)", "return self.cross(x + self.attention(x), x)")
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED and result.attention_classes == ("TinyCrossAttention",), result.reasons
    assert result.warnings[-1] == kept(source), result.warnings


def test_sdpa_look_alikes_are_not_sdpa() -> None:
    """A function of the file named `scaled_dot_product_attention` (CTRL's eager one), or a method so named."""
    own = wired(branch("True", "x = scaled_dot_product_attention(q, k, v)", EAGER),
                module="\n\ndef scaled_dot_product_attention(q, k, v):\n    return (q @ k.transpose(-2, -1)).softmax(-1) @ v")
    assert port_source(own, filename="modeling_tiny.py").detail != SUPPORTS_SDPA
    method = wired(branch("True", "x = self.scaled_dot_product_attention(q, k, v)", EAGER))
    assert port_source(method, filename="modeling_tiny.py").detail != SUPPORTS_SDPA
    imported = wired(branch("True", "x = sdpa(q, k, v)", EAGER),
                     module="from torch.nn.functional import scaled_dot_product_attention as sdpa")
    assert supported(imported) == ()


def test_the_default_path_read_directly() -> None:
    """Which classes call SDPA by default, and which at all."""
    source = wired(branch("self.use_sdpa"), init="self.use_sdpa = use_sdpa", init_params=", use_sdpa=False")
    tree = ast.parse(source)
    use = sdpa_use(tree, Bindings.of(tree))
    assert use.default == frozenset() and use.live == frozenset({"TinyAttention"})
    on = source.replace("use_sdpa=False", "use_sdpa=True")
    tree = ast.parse(on)
    assert sdpa_use(tree, Bindings.of(tree)).default == frozenset({"TinyAttention"})


INTERFACE_WITH_A_POOLER = '''
import torch
import torch.nn.functional as F
from torch import nn

from ...modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel


def eager_attention_forward(module, query, key, value, attention_mask, scaling, **kwargs):
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(attn_weights, value).transpose(1, 2).contiguous(), attn_weights


class TinyAttention(nn.Module):
    def forward(self, query, key, value, attention_mask=None):
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        return interface(self, query, key, value, attention_mask, scaling=1.0)


class TinyPooler(nn.Module):
    def forward(self, query, states):
        return F.scaled_dot_product_attention(query, states, states)


class TinyPreTrainedModel(PreTrainedModel):
    _supports_sdpa = False
'''


def test_an_sdpa_class_beside_the_attention_interface_decides_nothing() -> None:
    """5.23.0's Inkling2: a pooler on SDPA beside attention dispatched through the interface, whose eager function
    is handed over as a value (no class holds a softmax): the interface style decides the file, here refusing it
    for the authors' `_supports_sdpa = False`."""
    result = port_source(INTERFACE_WITH_A_POOLER, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED and [r.code.code for r in result.refusals] == ["A501"], result.reasons
