"""Where emitted parity tests go, what they import, and which models they cover (no torch needed to render)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from sdpa_port import port_source
from sdpa_port.edge.after_port import package_of
from sdpa_port.emit.parity_test import default_tests_dir, render_parity_test, target_for
from sdpa_port.emit.parity_test import tested_models as models_under_test

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def checkout(tmp_path: Path) -> Path:
    model_dir = tmp_path / "src" / "transformers" / "models" / "tiny"
    model_dir.mkdir(parents=True)
    (tmp_path / "tests" / "models").mkdir(parents=True)
    path = model_dir / "modeling_tiny.py"
    path.write_text((FIXTURES / "class_style" / "modeling_tiny_decoder.py").read_text())
    return path


def test_in_place_port_in_a_checkout_imports_the_package_module(tmp_path: Path) -> None:
    path = checkout(tmp_path)
    target = target_for(path, path)
    assert (target.module_name, target.path, target.package) == (
        "transformers.models.tiny.modeling_tiny",
        None,
        "transformers.models.tiny",
    )
    assert default_tests_dir(path, path) == tmp_path / "tests" / "models" / "tiny"


def test_output_elsewhere_loads_the_written_file_inside_the_package(tmp_path: Path) -> None:
    path = checkout(tmp_path)
    written = tmp_path / "out" / "modeling_tiny_sdpa.py"
    target = target_for(path, written)
    assert target.path == str(written.resolve()) and target.package == "transformers.models.tiny"
    loose = tmp_path / "loose" / "modeling_tiny.py"
    loose.parent.mkdir()
    loose.write_text("x = 1\n")
    assert default_tests_dir(loose, loose) == loose.parent.resolve()


def test_a_second_modeling_file_of_a_folder_belongs_to_the_folder(tmp_path: Path) -> None:
    """blip/modeling_blip_text.py lives in `transformers.models.blip` and its tests in tests/models/blip."""
    path = checkout(tmp_path).with_name("modeling_tiny_text.py")
    path.write_text("x = 1\n")
    target = target_for(path, path)
    assert (target.model, target.module_name, target.package) == (
        "tiny_text",
        "transformers.models.tiny.modeling_tiny_text",
        "transformers.models.tiny",
    )
    assert default_tests_dir(path, path) == tmp_path / "tests" / "models" / "tiny"
    copied = tmp_path / "copy" / "tiny"  # a model folder copied out of the package, configuration file and all
    copied.mkdir(parents=True)
    (copied / "configuration_tiny.py").write_text("x = 1\n")
    (copied / "modeling_tiny_text.py").write_text("x = 1\n")
    assert package_of(copied / "modeling_tiny_text.py") == "transformers.models.tiny"
    assert target_for(copied / "modeling_tiny_text.py", tmp_path / "out.py").package == "transformers.models.tiny"
    lone = tmp_path / "lone" / "modeling_tiny_text.py"  # no folder to go by: the file names its model
    assert target_for(lone, lone).package == "transformers.models.tiny_text"


def test_rendered_test_is_standalone_and_names_its_config(tmp_path: Path) -> None:
    path = checkout(tmp_path)
    result = port_source(path.read_text())
    emitted = render_parity_test(result.source, path, path, None, "class", "0.0.0")
    assert emitted is not None
    assert emitted.path == tmp_path / "tests" / "models" / "tiny" / "test_sdpa_parity_tiny.py"
    tree = ast.parse(emitted.source)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    outside_stdlib = imported - set(sys.stdlib_module_names)
    assert outside_stdlib <= {"torch", "transformers", "pytest"}, outside_stdlib
    assert 'CONFIG_CLASS = "TinyDecoderConfig"' in emitted.source
    assert '"hidden_size": 32' in emitted.source
    for test in ("test_sdpa_matches_eager", "test_greedy_generation_with_cache", "test_training_gradients_match",
                 "test_each_sdpa_backend_runs_sdpa", "test_output_attentions_falls_back_to_eager",
                 "test_cross_attention_over_padded_encoder"):
        assert f"def {test}(" in emitted.source


def test_one_model_per_task_family() -> None:
    source = '''
class XPreTrainedModel(PreTrainedModel):
    pass
class XModel(XPreTrainedModel):
    def forward(self, input_ids): pass
class XForCausalLM(XPreTrainedModel):
    def forward(self, input_ids): pass
class XForSequenceClassification(XPreTrainedModel):
    def forward(self, input_ids): pass
class XForSequenceClassificationWithExtras(XForSequenceClassification):
    def forward(self, input_ids): pass
class XVision(XPreTrainedModel):
    def forward(self, pixel_values): pass
'''
    assert models_under_test(source) == ("XModel", "XForCausalLM", "XForSequenceClassification")
