"""Forms of eager attention the engine learned for issue 12, each on a real 4.40.2 file that needs it: the port
verifies inside the release, and breaking the SDPA call (mask dropped or scale halved) is seen."""

from __future__ import annotations

from pathlib import Path

import pytest

from driven import assert_sabotage_seen, broken, port_for_kind, verify

pytestmark = pytest.mark.tf440

# model -> (the form it needs, the sabotage its inputs must reveal)
CASES = {
    "swin": ("a per-window mask added to scores regrouped as (batch // windows, windows, heads, q, k)", "mask"),
    "big_bird": ("full attention rebuilt in set_attention_type, which has only self.config", "scale"),
    "gptj": ("a scale held as a 0-d tensor: torch.sqrt(torch.tensor(head_dim)).to(dtype)", "scale"),
    "bloom": ("keys transposed when split into heads, baddbmm with ALiBi", "scale"),
    "gpt_neo": ("no scaling at all and a banded local causal buffer", "scale"),
    "swinv2": ("cosine attention scaled by a per-head parameter of shape (heads, 1, 1)", "scale"),
    "deprecated/open_llama": ("the computation in the else branch of an xformers training path", "scale"),
    "blip_2": ("weights handed to a hook while a switch off by default is on", "scale"),
    "instructblip": ("a Q-Former built from its own config inside a composite", "scale"),
    "altclip": ("a vision attention only the vision model builds with SDPA", "scale"),
    "openai": ("a -1e4 blend with a top-left causal slice while the keys are the call's own positions", "scale"),
    "ctrl": ("attention built where no config is in scope: the implementation's name passed down", "scale"),
    # an amplifying model (outputs move 5e-3 for a 1e-6 change of the attention outputs): judged against that
    # response; 0.1 % off the scale moves them by about 0.5
    "nystromformer": ("exact attention beside a Nystrom approximation, chosen by the module's settings", "scale"),
    "cvt": ("einsum operands as one list, constructors threaded, outputs amplifying rounding", "slight"),
    "funnel": ("einsum on (batch, length, heads, dim) operands, a query plus a bias, a mask subtracted", "mask"),
    # relative scores a helper method returns under one setting (the default), shifted by a reshape: the helper's
    # statements written out in the SDPA forward, its position term in the mask, each branch's own scale; the mask
    # sabotage withholds that term
    "wav2vec2_conformer": ("scores a helper method computes, each branch of a setting scaling its own", "mask"),
    # the weights returned permuted (`einsum("bnij->ijbn", probs)`) by the helper under `if output_attentions:`
    "xlnet": ("a helper keeping a step for the weights it returns, given forward's output_attentions", "scale"),
    "wav2vec2_bert": ("the same helper, with a relative-key term read from the query under the default setting", "mask"),
    # the same helper in a composite of speech and text models
    "seamless_m4t": ("the same helper in a speech encoder beside text attention", "mask"),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reach440")


@pytest.mark.parametrize("model", CASES)
def test_form_ports_and_verifies(model: str, workdir: Path) -> None:
    checks = verify(model, port_for_kind(model, CASES[model][0]), workdir)
    lines = "\n".join(str(c) for c in checks)
    assert checks and all(c.passed for c in checks), lines
    executed = [c for c in checks if c.name.endswith("sdpa executed")]
    assert executed and all(c.passed for c in executed), lines


@pytest.mark.parametrize("model", CASES)
def test_a_broken_port_of_the_form_is_seen(model: str, workdir: Path) -> None:
    kind = CASES[model][1]
    assert_sabotage_seen(verify(model, broken(model, port_for_kind(model, CASES[model][0]), kind), workdir, kind))
