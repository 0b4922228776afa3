"""scripts/census_package.py screens files and classes the tool's JSON records (no torch, no network, nothing run)."""

from __future__ import annotations

import sys
import textwrap
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import census_package  # noqa: E402

TREE = Path("/tmp/census-package-x/package")

ATTENTION = textwrap.dedent(
    """
    import torch

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            scores = torch.matmul(q, k.transpose(-1, -2))
            return scores.softmax(dim=-1) @ v
    """
)


def record(status: str = "ported", name: str = "pkg/models/attention.py", **extra) -> dict:  # type: ignore[no-untyped-def]
    return {"path": str(TREE / name), "status": status, "detail": "", "reasons": [], "refusals": [],
            "verification": [], "verified": None, **extra}


def test_the_screen_wants_a_softmax_and_a_product() -> None:
    assert census_package.has_attention(ATTENTION)
    assert census_package.has_attention("import torch.nn as nn\ny = nn.Softmax(dim=-1)(torch.einsum('ij,jk->ik', a, b))\n")
    assert census_package.has_attention("def f(a, b):\n    w = torch.bmm(a, b)\n    return F.softmax(w, -1)\n")
    assert not census_package.has_attention("import torch\nlogits = torch.matmul(a, b)\nloss = logits.sum()\n")
    assert not census_package.has_attention("probs = torch.softmax(logits, -1)\n")
    # a decorator's `@` and a word in a comment or a string are not a product
    assert not census_package.has_attention("@torch.no_grad()\ndef f(x):\n    return x.softmax(-1)  # matmul\n")


def test_the_screen_reads_unparsable_files_as_text() -> None:
    assert census_package.has_attention("def f(:\n    torch.softmax(torch.matmul(q, k), -1)\n")
    assert not census_package.has_attention("def f(:\n    torch.softmax(x, -1)\n")


def test_select_copies_the_screened_files_keeping_their_paths(tmp_path: Path) -> None:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as bundle:
        bundle.writestr("pkg/models/attention.py", ATTENTION)
        bundle.writestr("pkg/models/mlp.py", "import torch\ny = torch.matmul(a, b)\n")
        bundle.writestr("pkg/other/attention.py", ATTENTION)
        bundle.writestr("pkg/README.md", "softmax matmul")
    assert census_package.archives(tmp_path) == [wheel]
    read, chosen = census_package.select(wheel, tmp_path / "tree", None)
    assert read == 3 and [p.relative_to(tmp_path / "tree").as_posix() for p in chosen] == [
        "pkg/models/attention.py",
        "pkg/other/attention.py",
    ]
    assert chosen[0].read_text() == ATTENTION
    read, chosen = census_package.select(wheel, tmp_path / "only", ["pkg/models/"])
    assert read == 2 and len(chosen) == 1


def test_classes_of_files_not_ported() -> None:
    classify = census_package.classify
    assert classify(record("unchanged", detail="already supports SDPA"), TREE).kind == "already supports SDPA"
    # the classes left eager beside those on SDPA are named with their codes
    staying = ["CrossBlock stays eager: CrossBlock (line 9): `.transpose()` is applied to the scores [S101]", "other"]
    already = classify(record("unchanged", detail="already supports SDPA", warnings=staying), TREE)
    assert (already.kind, already.why) == ("already supports SDPA", "CrossBlock stays eager (S101)")
    none = classify(record("unchanged", detail="no eager attention found"), TREE)
    assert (none.path, none.kind, none.why) == ("pkg/models/attention.py", "no eager attention found", "")
    refusals = [{"code": "SP104", "detail": "x"}, {"code": "SP201", "detail": "y"}, {"code": "SP104", "detail": "z"}]
    refused = classify(record("refused", reasons=["Attention (line 3): sparse attention [SP104]"], refusals=refusals), TREE)
    assert (refused.kind, refused.codes) == ("refused", ("SP104", "SP201"))
    assert refused.why == "SP104, SP201 (first: Attention (line 3): sparse attention [SP104])"
    error = classify(record("error", reasons=[f"{TREE}/pkg/a.py: internal error: KeyError: 'x'"]), TREE)
    assert (error.kind, error.why) == ("error", "pkg/a.py: internal error: KeyError: 'x'")


def test_classes_of_ported_files() -> None:
    classify = census_package.classify
    verified = classify(record(verification=["BertModel[left] eager unchanged: ok max|diff|=0"], verified=True), TREE)
    assert (verified.kind, verified.why) == ("ported, verified", "BertModel on token ids")
    failed = classify(record(verification=["BertModel[left] sdpa == eager: FAILED max|diff|=0.3"], verified=False), TREE)
    assert failed.kind == "ported, failed"
    undriven = classify(record(verification=["not verified: MModel: needs timm"], verified=None), TREE)
    assert (undriven.kind, undriven.why) == ("ported, not verifiable", "MModel: needs timm")
    # a file importing its own package cannot be loaded: not verifiable, with the import, never an error or a pass
    missing = ["could not run the checks: ModuleNotFoundError: No module named 'pkg'"]
    unloadable = classify(record(verification=missing, verified=False), TREE)
    assert (unloadable.kind, unloadable.why) == ("ported, not verifiable", "not loadable here: ModuleNotFoundError: No module named 'pkg'")
    crashed = classify(record(verification=["could not run the checks: RuntimeError: boom"], verified=False), TREE)
    assert crashed.kind == "ported, verification error"
    without = classify(record(verification=[], verified=None), TREE, "--verify not run: this Python has no torch")
    assert (without.kind, without.why) == ("ported, not verifiable", "--verify not run: this Python has no torch")


def test_the_section_counts_each_class_and_lists_every_file(tmp_path: Path) -> None:
    rows = [
        census_package.Row("pkg/b.py", "refused", "SP104, SP201", ("SP104", "SP201")),
        census_package.Row("pkg/a.py", "ported, verified", "BertModel on token ids"),
        census_package.Row("pkg/c.py", "refused", "SP104", ("SP104",)),
        census_package.Row("pkg/d.py", "ported, not verifiable", "not loadable here: a | b"),
    ]
    facts = {"read": "12", "transformers": "4.40.2", "torch": "2.13.0+cpu", "command": "python scripts/census.py --package pkg==1.0"}
    section = census_package.markdown("pkg==1.0", rows, facts, 90.0)
    lines = section.splitlines()
    assert "transformers 4.40.2, torch 2.13.0+cpu: `python scripts/census.py" in section  # where it ran
    assert lines[0] == "<!-- census package pkg==1.0 -->" and lines[-1] == "<!-- /census package pkg==1.0 -->"
    assert "| ported, verified | 1 |" in lines and "| refused | 2 |" in lines and "| error | 0 |" in lines
    assert lines.index("| SP104 | 2 |") < lines.index("| SP201 | 1 |")
    files = [line for line in lines if line.startswith("| `pkg/")]
    assert [line.split("`")[1] for line in files] == ["pkg/a.py", "pkg/b.py", "pkg/c.py", "pkg/d.py"]
    assert "| `pkg/d.py` | ported, not verifiable | not loadable here: a \\| b |" in lines
    # the section goes after the others and replaces itself on a rerun
    out = tmp_path / "census.md"
    out.write_text("# Census\n\n<!-- census 4.40.2 -->\nrelease\n<!-- /census 4.40.2 -->\n")
    census_package.census.write_section(out, "package pkg==1.0", section)
    census_package.census.write_section(out, "package pkg==1.0", section)
    text = out.read_text()
    assert text.count("<!-- census package pkg==1.0 -->") == 1 and text.index("release") < text.index("## package")


def test_the_loading_note_names_the_modules_this_python_lacks() -> None:
    tree = Path("/tmp/t/package")
    chosen = [tree / "no_such_module_here" / "a.py", tree / "json" / "b.py", tree / "tests" / "c.py"]
    note = census_package.loading_note(chosen, tree)
    assert "`no_such_module_here`" in note and "`json`" not in note and "`tests`" not in note


def test_the_loading_note_names_the_other_packages_installed_or_not(tmp_path: Path) -> None:
    """The figures depend on the optional packages installed where the census ran: the note names them."""
    tree = tmp_path / "package"
    (tree / "pkg").mkdir(parents=True)
    module = tree / "pkg" / "a.py"
    module.write_text("import os\nimport torch\nimport pytest\nfrom no_such_dependency.x import y\nfrom pkg.b import c\nfrom . import d\n")
    present, absent = census_package.third_party([module], {"pkg"})
    assert present == ["pytest"] and absent == ["no_such_dependency"]
    note = census_package.loading_note([module], tree)
    assert "installed here `pytest`; not installed `no_such_dependency`" in note
