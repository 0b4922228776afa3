"""The edge side of --verify that needs no torch: which package a modeling file is loaded in."""

from __future__ import annotations

from pathlib import Path

from sdpa_port.edge.after_port import package_of


def test_a_file_is_loaded_in_its_model_folder_package() -> None:
    models = Path("/x/transformers/models")
    assert package_of(models / "bert" / "modeling_bert.py") == "transformers.models.bert"
    assert package_of(models / "data2vec" / "modeling_data2vec_audio.py") == "transformers.models.data2vec"
    assert package_of(models / "blip" / "modeling_blip_text.py") == "transformers.models.blip"
    assert package_of(models / "deprecated" / "mctct" / "modeling_mctct.py") == "transformers.models.deprecated.mctct"


def test_a_file_outside_a_models_tree_is_named_by_its_file() -> None:
    assert package_of(Path("/tmp/work/modeling_gpt2.py")) == "transformers.models.gpt2"
