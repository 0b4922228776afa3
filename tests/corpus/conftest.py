"""One batch run of the CLI over every PyTorch modeling file of a transformers release, then a `--check` run.

The files are read out of the release wheel (SDPA_PORT_WHEELS, see tests/conftest.py); the extracted tree is cached
(SDPA_PORT_TREES, default: `trees/` beside the wheel folder) and copied afresh for the run, which ports in place.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from corpus_run import RELEASES, Corpus, sdpa_port  # noqa: E402

from sdpa_port.edge.wheels import MODELS, copy_tree, extract_tree, wheel_path  # noqa: E402


@pytest.fixture(scope="session", params=RELEASES)
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    version: str = request.param
    wheels = Path(os.environ["SDPA_PORT_WHEELS"])
    trees = Path(os.environ.get("SDPA_PORT_TREES") or wheels.parent / "trees")
    wheel = wheel_path(wheels, version)
    pristine = extract_tree(wheel, trees)
    tree = copy_tree(pristine, tmp_path_factory.mktemp(f"transformers-{version}"))
    # the models' folder: the tree holds the release's own sources too (`modeling_utils.py` among them), which are
    # read for the release's facts, not ported
    models = tree / MODELS
    first = sdpa_port(str(models), "--json")
    second = sdpa_port(str(models), "--check", "--json")
    return Corpus(version, wheel, pristine, tree, first, second)
