"""A port of a generated modeling file is carried into its modular source, so that regenerating gives it back."""

from __future__ import annotations

import textwrap
from pathlib import Path

from sdpa_port.checkout.modular import carry
from sdpa_port.edge.files import Target, discover
from sdpa_port.edge.outcome import RunOptions
from sdpa_port.edge.runner import run
from sdpa_port.result import Status

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


GENERATED = dedent(
    """
    from ...modeling_utils import PreTrainedModel
    from ..parent.modeling_parent import ParentAttention


    class ChildAttention(nn.Module):
        def forward(self, x):
            return x


    class ChildPreTrainedModel(PreTrainedModel):
        base_model_prefix = "child"
        _no_split_modules = ["ChildLayer"]

        def _init_weights(self, module):
            pass
    """
)
MODULAR = dedent(
    """
    from ...modeling_utils import PreTrainedModel
    from ..parent.modeling_parent import ParentAttention


    class ChildAttention(ParentAttention):
        pass


    class ChildPreTrainedModel(PreTrainedModel):
        base_model_prefix = "child"
        _no_split_modules = ["ChildLayer"]

        def _init_weights(self, module):
            pass
    """
)


def test_an_added_flag_lands_after_the_same_attribute() -> None:
    ported = GENERATED.replace('["ChildLayer"]\n', '["ChildLayer"]\n    _supports_sdpa = True\n')
    carried = carry(MODULAR, GENERATED, ported)
    assert carried.reasons == []
    assert carried.source == MODULAR.replace('["ChildLayer"]\n', '["ChildLayer"]\n    _supports_sdpa = True\n')


def test_a_changed_method_of_an_inherited_class_becomes_an_override() -> None:
    ported = GENERATED.replace("        return x\n", "        return x * 2\n")
    carried = carry(MODULAR, GENERATED, ported)
    assert carried.source is not None
    assert (
        "class ChildAttention(ParentAttention):\n    def forward(self, x):\n        return x * 2\n" in carried.source
    )


def test_new_definitions_and_imports_follow() -> None:
    ported = "from ...modeling_attn_mask_utils import helper\n" + GENERATED.replace(
        "\n\nclass ChildPreTrainedModel",
        '\n\nCHILD_CLASSES = {"eager": ChildAttention}\n\n\nclass ChildPreTrainedModel',
    )
    carried = carry(MODULAR, GENERATED, ported)
    assert carried.source is not None
    assert (
        carried.source.index("class ChildAttention")
        < carried.source.index("CHILD_CLASSES = ")
        < carried.source.index("class ChildPreTrainedModel")
    )
    assert "from ...modeling_attn_mask_utils import helper\n" in carried.source


def test_a_definition_the_modular_file_does_not_have_cannot_be_carried() -> None:
    generated = GENERATED + "\n\nclass ChildModel(ChildPreTrainedModel):\n    x = 1\n"
    carried = carry(MODULAR, generated, generated.replace("x = 1", "x = 2"))
    assert carried.source is None and carried.reasons == ["ChildModel changed but the modular file does not define it"]


BANNER = "# This file was automatically generated from src/transformers/models/tiny_decoder/modular_tiny_decoder.py.\n"
# a stand-in for utils/modular_model_converter.py: the generated file is the banner and the modular file
CONVERTER = """\
import sys
from pathlib import Path

modular = Path(sys.argv[-1])
text = modular.read_text()
banner = "# This file was automatically generated from " + str(modular) + ".\\n"
modular.with_name(modular.name.replace("modular_", "modeling_")).write_text(banner + text)
"""


def checkout(tmp_path: Path, converter: str | None) -> Path:
    model = tmp_path / "src" / "transformers" / "models" / "tiny_decoder"
    model.mkdir(parents=True)
    (tmp_path / "tests" / "models").mkdir(parents=True)
    source = (FIXTURES / "class_style" / "modeling_tiny_decoder.py").read_text(encoding="utf-8")
    (model / "modular_tiny_decoder.py").write_text(source, encoding="utf-8")
    (model / "modeling_tiny_decoder.py").write_text(BANNER + source, encoding="utf-8")
    if converter is not None:
        (tmp_path / "utils").mkdir()
        (tmp_path / "utils" / "modular_model_converter.py").write_text(converter, encoding="utf-8")
    return model


def test_porting_the_modular_file_writes_both_and_the_converter_agrees(tmp_path: Path) -> None:
    model = checkout(tmp_path, CONVERTER)
    summary = run([Target(model / "modular_tiny_decoder.py")], RunOptions(tests=False), jobs=1)
    [outcome] = summary.outcomes
    assert outcome.status is Status.PORTED and outcome.path == model / "modeling_tiny_decoder.py"
    generated = (model / "modeling_tiny_decoder.py").read_text(encoding="utf-8")
    modular = (model / "modular_tiny_decoder.py").read_text(encoding="utf-8")
    assert "TinyDecoderSdpaAttention" in modular and generated == BANNER + modular
    assert any("modular_model_converter.py regenerates this port" in line for line in outcome.context)
    assert not any("generated from" in warning for warning in outcome.result.warnings)


def test_a_converter_that_disagrees_is_reported_and_the_port_kept(tmp_path: Path) -> None:
    model = checkout(tmp_path, CONVERTER.replace("banner + text", "banner + text + '# changed\\n'"))
    summary = run([Target(model / "modeling_tiny_decoder.py")], RunOptions(tests=False), jobs=1)
    [outcome] = summary.outcomes
    assert any("regenerates a different file" in warning for warning in outcome.result.warnings)
    assert "# changed" not in (model / "modeling_tiny_decoder.py").read_text(encoding="utf-8")


def test_a_directory_holding_both_files_ports_the_model_once(tmp_path: Path) -> None:
    """The modular file and the modeling file generated from it are one target: porting both would write the
    generated file twice and count the model twice."""
    model = checkout(tmp_path, CONVERTER)
    targets = discover([model.parent])
    assert [t.path.name for t in targets] == ["modeling_tiny_decoder.py"]
    summary = run(targets, RunOptions(tests=False), jobs=1)
    [outcome] = summary.outcomes
    assert outcome.status is Status.PORTED
    assert "TinyDecoderSdpaAttention" in (model / "modular_tiny_decoder.py").read_text(encoding="utf-8")
