"""The edge side of --verify that needs no torch: which package a modeling file is loaded in."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdpa_port.edge.after_port import package_of
from sdpa_port.verify import packages
from sdpa_port.verify.packages import NoPackage, package_for


def test_a_file_is_loaded_in_its_model_folder_package() -> None:
    models = Path("/x/transformers/models")
    assert package_of(models / "bert" / "modeling_bert.py") == "transformers.models.bert"
    assert package_of(models / "data2vec" / "modeling_data2vec_audio.py") == "transformers.models.data2vec"
    assert package_of(models / "blip" / "modeling_blip_text.py") == "transformers.models.blip"
    assert package_of(models / "deprecated" / "mctct" / "modeling_mctct.py") == "transformers.models.deprecated.mctct"


def test_a_file_outside_a_models_tree_is_named_by_its_file() -> None:
    assert package_of(Path("/tmp/work/modeling_gpt2.py")) == "transformers.models.gpt2"


def _installed(root: Path) -> Path:
    """A transformers package laid out as installed: a few model folders and the modules their files import."""
    for module in ("__init__.py", "modeling_utils.py", "utils/__init__.py", "models/__init__.py"):
        (root / module).parent.mkdir(parents=True, exist_ok=True)
        (root / module).write_text("")
    for folder, siblings in {"blip": ["configuration_blip"], "gpt2": ["configuration_gpt2"], "deprecated/mctct": []}.items():
        (root / "models" / folder).mkdir(parents=True)
        (root / "models" / folder / "__init__.py").write_text("")
        for sibling in siblings:
            (root / "models" / folder / f"{sibling}.py").write_text("")
    (root / "models" / "deprecated" / "__init__.py").write_text("")
    return root


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = _installed(tmp_path / "site-packages" / "transformers")
    monkeypatch.setattr(packages, "transformers_root", lambda: root)
    return root


def test_a_file_goes_in_its_folder_package_when_installed_and_fitting(installed: Path) -> None:
    source = "from ...modeling_utils import PreTrainedModel\nfrom .configuration_gpt2 import GPT2Config\n"
    assert package_for("transformers.models.gpt2", source, Path("/tmp/work/modeling_gpt2.py")) == "transformers.models.gpt2"


def test_a_copied_file_goes_where_its_sibling_imports_resolve(installed: Path) -> None:
    """blip/modeling_blip_text.py copied to /tmp/x: its name gives `blip_text`, its `.configuration_blip` says blip."""
    source = "from ...modeling_utils import PreTrainedModel\nfrom .configuration_blip import BlipTextConfig\n"
    path = Path("/tmp/x/modeling_blip_text.py")
    assert package_for(package_of(path), source, path) == "transformers.models.blip"


def test_a_file_importing_only_from_transformers_goes_in_any_model_package(installed: Path) -> None:
    """`...` imports resolve in every package two levels below transformers: the one the name begins with, else the
    first; four dots need one under models/deprecated/."""
    source = "from ...modeling_utils import PreTrainedModel\nfrom ...utils import logging\n"
    assert package_for("transformers.models.tiny", source, Path("/t/modeling_tiny.py")) == "transformers.models.blip"
    assert package_for("transformers.models.gpt2_x", source, Path("/t/modeling_gpt2_x.py")) == "transformers.models.gpt2"
    deprecated = "from ....modeling_utils import PreTrainedModel\n"
    assert package_for("transformers.models.x", deprecated, Path("/t/modeling_x.py")) == "transformers.models.deprecated.mctct"
    guarded = source + "try:\n    from .configuration_new import NewConfig\nexcept ImportError:\n    pass\n"
    assert package_for("transformers.models.tiny", guarded, Path("/t/modeling_tiny.py")) == "transformers.models.blip"


def test_a_file_no_package_fits_is_refused_with_what_it_needs(installed: Path) -> None:
    source = "from ...modeling_utils import PreTrainedModel\nfrom .configuration_new import NewConfig\n"
    with pytest.raises(NoPackage, match=r"transformers\.models\.new is not one.*`\.configuration_new`"):
        package_for("transformers.models.new", source, Path("/tmp/modeling_new.py"))
    # a real folder package stays the choice when nothing fits better: loading says what is missing
    assert package_for("transformers.models.gpt2", source, Path("/t/modeling_gpt2.py")) == "transformers.models.gpt2"


def test_without_transformers_there_is_no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages, "transformers_root", lambda: None)
    with pytest.raises(NoPackage, match="not installed"):
        package_for("transformers.models.bert", "", Path("modeling_bert.py"))
