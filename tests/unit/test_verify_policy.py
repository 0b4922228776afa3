"""Which runs verify their ports by default, and what a run says when its ports go unverified (no torch here).

Verifying executes the modeling file: by default only one file of the installed transformers or of a Transformers
checkout is verified before it is written; anything else runs only with --verify. torch and transformers are found
without importing them: the fake packages below raise when imported, and a `None` entry in `sys.modules` stands for
a package that is not installed (`import torch` fails on it, `find_spec` finds nothing).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sdpa_port.cli import port_app
from sdpa_port.edge import after_port, trust
from sdpa_port.edge.after_port import Verification
from sdpa_port.edge.files import Target, discover
from sdpa_port.edge.report import summary_lines
from sdpa_port.edge.outcome import RunOptions
from sdpa_port.edge.runner import run
from sdpa_port.edge.trust import BATCH, NOT_ASKED, NOT_WRITING, UNTRUSTED, MissingDependency, Verifying, decide

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
DECODER = FIXTURES / "class_style" / "modeling_tiny_decoder.py"
NOT_IMPORTED = "raise RuntimeError('deciding whether to verify imported this package')\n"
runner = CliRunner()


def invoke(*args: object):  # type: ignore[no-untyped-def]
    return runner.invoke(port_app, [str(a) for a in args])


def package_tree(site: Path) -> Path:
    """`site/transformers/models/tiny_decoder/modeling_tiny_decoder.py`, in a package that must not be imported."""
    model = site / "transformers" / "models" / "tiny_decoder"
    model.mkdir(parents=True)
    (site / "transformers" / "__init__.py").write_text(NOT_IMPORTED)
    shutil.copy(DECODER, model / DECODER.name)
    return model / DECODER.name


@pytest.fixture
def imports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """`imports(torch=..., transformers=...)`: each None (not installed) or a folder put first on sys.path."""

    def arrange(torch: Path | None, transformers: Path | None) -> None:
        if torch is not None:
            (torch / "torch").mkdir(parents=True, exist_ok=True)
            (torch / "torch" / "__init__.py").write_text(NOT_IMPORTED)
        for name, folder in (("torch", torch), ("transformers", transformers)):
            if folder is None:
                monkeypatch.setitem(sys.modules, name, None)
            else:
                monkeypatch.delitem(sys.modules, name, raising=False)
                monkeypatch.syspath_prepend(str(folder))

    return arrange


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """A modeling file of the (fake) installed transformers: tmp/site is what `import transformers` would load."""
    return package_tree(tmp_path / "site")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A modeling file of a checkout: `<root>/src/transformers/...` beside `<root>/tests/models/`."""
    (tmp_path / "checkout" / "tests" / "models").mkdir(parents=True)
    return package_tree(tmp_path / "checkout" / "src")


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    target = tmp_path / "remote" / DECODER.name
    target.parent.mkdir()
    shutil.copy(DECODER, target)
    return target


# ------------------------------------------------------------------ the decision


def test_one_file_of_the_installed_transformers_verifies_by_default(imports, installed: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    imports(torch=tmp_path / "torch", transformers=tmp_path / "site")
    assert decide(None, [Target(installed)], writing=True) == Verifying(run=True, by_default=True)
    by_name = Target(installed, model="tiny_decoder")  # what `sdpa-port tiny_decoder` resolves to
    assert decide(None, [by_name], writing=True) == Verifying(run=True, by_default=True)


def test_one_file_of_a_checkout_verifies_by_default_when_its_transformers_is_imported(imports, checkout: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    imports(torch=tmp_path / "torch", transformers=tmp_path / "checkout" / "src")
    assert decide(None, [Target(checkout)], writing=True) == Verifying(run=True, by_default=True)


def test_a_checkout_whose_transformers_is_not_imported_is_not_verified_against_another(imports, checkout: Path, installed: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    imports(torch=tmp_path / "torch", transformers=tmp_path / "site")
    decision = decide(None, [Target(checkout)], writing=True)
    assert not decision.run and decision.unverified is not None
    assert f"imported from {tmp_path / 'site' / 'transformers'}" in decision.unverified
    assert f"pip install -e {tmp_path / 'checkout'}" in decision.unverified


def test_any_other_file_runs_only_when_asked(imports, elsewhere: Path, installed: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    imports(torch=tmp_path / "torch", transformers=tmp_path / "site")
    assert decide(None, [Target(elsewhere)], writing=True) == Verifying(unverified=UNTRUSTED)
    assert decide(True, [Target(elsewhere)], writing=True) == Verifying(run=True)


def test_batches_check_diff_and_no_verify_verify_only_when_asked(imports, installed: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    imports(torch=tmp_path / "torch", transformers=tmp_path / "site")
    one = Target(installed)
    assert decide(None, [one, Target(tmp_path / "other.py")], writing=True) == Verifying(unverified=BATCH)
    assert decide(None, [Target(installed, explicit=False)], writing=True) == Verifying(unverified=BATCH)  # a directory
    assert decide(None, [one], writing=False) == Verifying(unverified=NOT_WRITING)
    assert decide(False, [one], writing=True) == Verifying(unverified=NOT_ASKED)
    assert decide(True, [one, Target(tmp_path / "other.py")], writing=False) == Verifying(run=True)


def test_without_torch_a_default_verification_says_what_to_install(imports, installed: Path, checkout: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    imports(torch=None, transformers=tmp_path / "site")
    decision = decide(None, [Target(installed)], writing=True)
    assert not decision.run and decision.unverified is not None
    assert "verifying needs torch" in decision.unverified and "pip install torch==2.13.0" in decision.unverified
    with pytest.raises(MissingDependency, match=r"--verify needs torch: pip install torch==2\.13\.0 "):
        decide(True, [Target(installed)], writing=True)


def test_without_transformers_a_checkout_names_itself_to_install(imports, checkout: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    imports(torch=None, transformers=None)
    decision = decide(None, [Target(checkout)], writing=True)
    assert decision.unverified is not None and "needs torch and transformers" in decision.unverified
    assert f"pip install torch==2.13.0; pip install -e {tmp_path / 'checkout'}" in decision.unverified
    with pytest.raises(MissingDependency, match=r"transformers>=4\.40.*sdpa-port\[verify\]"):
        decide(True, [Target(tmp_path / "elsewhere.py")], writing=True)


# ------------------------------------------------------------------ the command


def test_default_port_without_torch_is_written_with_one_line_saying_what_to_install(imports, installed: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    imports(torch=None, transformers=tmp_path / "site")
    result = invoke(installed, "-o", tmp_path / "out.py", "--no-tests")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out.py").read_text() == (FIXTURES / "golden" / DECODER.name).read_text()
    assert result.stderr.splitlines() == [
        f"not verified: {installed}: verifying needs torch, not installed here: pip install torch==2.13.0 "
        "(or pip install 'sdpa-port[verify]')"
    ]
    record = json.loads(invoke(installed, "-o", tmp_path / "again.py", "--no-tests", "--json").stdout)
    assert record["verified"] is None and "pip install torch==2.13.0" in record["unverified"]


def test_verify_without_torch_exits_2_naming_what_to_install(tmp_path: Path) -> None:
    """Asked for, verification that cannot run stops before anything is ported (it used to be an internal error)."""
    target = tmp_path / DECODER.name
    shutil.copy(DECODER, target)
    probe = "import sys; sys.modules['torch'] = None; from sdpa_port.cli import main; main(sys.argv[1:])"
    completed = subprocess.run(
        [sys.executable, "-c", probe, str(target), "--verify", "-o", str(tmp_path / "out.py")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 2, completed.stderr
    [line] = completed.stderr.splitlines()
    assert line.startswith("sdpa-port: --verify needs torch") and "pip install torch==2.13.0" in line, line
    assert "sdpa-port[verify]" in line and "internal error" not in line
    assert completed.stdout == "" and not (tmp_path / "out.py").exists()


def test_another_file_is_written_unverified_with_one_line_saying_how_to_verify(elsewhere: Path) -> None:
    result = invoke(elsewhere, "--no-tests")
    assert result.exit_code == 0, result.output
    assert "TinyDecoderSdpaAttention" in elsewhere.read_text()
    assert result.stderr.splitlines() == [f"not verified: {elsewhere}: {UNTRUSTED}"]
    assert "--verify" in UNTRUSTED and "executes" in UNTRUSTED


def test_no_verify_and_check_say_nothing_of_verification_on_stderr(elsewhere: Path, tmp_path: Path) -> None:
    for arguments in (["--no-verify", "-o", tmp_path / "out.py"], ["--check"], ["--diff"]):
        result = invoke(elsewhere, "--no-tests", *arguments)
        assert result.stderr == "", (arguments, result.stderr)


def test_json_says_per_file_whether_it_was_verified_and_why_not(elsewhere: Path, tmp_path: Path) -> None:
    cases = [
        ([elsewhere, "-o", tmp_path / "out.py"], UNTRUSTED),
        ([elsewhere, "--no-verify", "-o", tmp_path / "out.py"], NOT_ASKED),
        ([elsewhere, "--check"], NOT_WRITING),
        ([elsewhere.parent, "--check"], BATCH),
    ]
    for arguments, why in cases:
        [record] = [json.loads(line) for line in invoke(*arguments, "--json", "--no-tests").stdout.splitlines()]
        assert (record["status"], record["verified"], record["unverified"]) == ("ported", None, why), arguments
    refused = tmp_path / "refused" / "modeling_tiny_topk.py"
    refused.parent.mkdir()
    shutil.copy(FIXTURES / "refused" / refused.name, refused)
    record = json.loads(invoke(refused, "--json").stdout)
    assert (record["verified"], record["unverified"]) == (None, None)  # nothing ported, nothing to verify


def test_a_batch_summary_counts_the_verified_ports(tmp_path: Path) -> None:
    for name in ("modeling_tiny_decoder.py", "modeling_tiny_encoder.py"):
        shutil.copy(FIXTURES / "class_style" / name, tmp_path / name)
    result = invoke(tmp_path, "--no-tests", "-j", "1")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert [line.split() for line in lines[1:4]] == [["ported", "2"], ["verified", "0"], ["2", "not", "verified:", *BATCH.split()]]
    assert not any(line.startswith("not verified:") for line in lines)  # a batch says it once, in its summary


# ------------------------------------------------------------------ what a verification's outcome writes

UNDRIVEN = Verification(False, ("not verified: TinyDecoderModel: no inputs",), "TinyDecoderModel: no inputs")
FAILED = Verification(False, ("TinyDecoderModel[right] sdpa == eager: FAILED max|diff|=0.3",))
PASSED = Verification(True, ("TinyDecoderModel[right] sdpa == eager: ok max|diff|=6e-05",))


@pytest.mark.parametrize(
    "report,by_default,written,verified",
    [
        (PASSED, True, True, True),
        (PASSED, False, True, True),
        (FAILED, True, False, False),
        (FAILED, False, False, False),
        # checks that could not drive the model: written unverified by default, a failure when --verify asked
        (UNDRIVEN, True, True, None),
        (UNDRIVEN, False, False, False),
    ],
    ids=["passed-default", "passed-asked", "failed-default", "failed-asked", "undriven-default", "undriven-asked"],
)
def test_a_failed_verification_writes_nothing_and_an_undriven_one_only_when_asked(
    report: Verification, by_default: bool, written: bool, verified: bool | None, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(after_port, "verify_port", lambda path, source, result, claims=False: report)
    before = elsewhere.read_text()
    options = RunOptions(tests=False, verify=Verifying(run=True, by_default=by_default))
    summary = run([Target(elsewhere)], options, jobs=1)
    [outcome] = summary.outcomes
    assert (outcome.written is not None, outcome.verified) == (written, verified)
    assert (elsewhere.read_text() != before) == written
    assert summary.exit_code(checking=False) == (0 if written else 1)
    if verified is None:
        assert outcome.unverified == "the checks could not drive it: TinyDecoderModel: no inputs"
    counts = {line.split()[0]: line.split()[-1] for line in summary_lines(summary)[1:3]}
    assert counts == {"ported": "1", "verified": "1" if verified else "0"}


def test_startup_decides_without_importing_torch_or_transformers(imports, installed: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The fake packages raise when imported: deciding only looks them up (and ports without torch)."""
    imports(torch=tmp_path / "torch", transformers=tmp_path / "site")
    assert trust.missing_modules() == []
    assert discover([Path("tiny_decoder")]) == [Target(installed, model="tiny_decoder")]


def test_a_checkout_file_ported_in_place_without_torch_says_what_to_install(imports, checkout: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    imports(torch=None, transformers=tmp_path / "checkout" / "src")
    result = invoke(checkout, "--no-tests")
    assert result.exit_code == 0, result.output
    assert "TinyDecoderSdpaAttention" in checkout.read_text()
    [line] = [line for line in result.stderr.splitlines() if line.startswith("not verified:")]
    assert line == f"not verified: {checkout}: verifying needs torch, not installed here: pip install torch==2.13.0 (or pip install 'sdpa-port[verify]')"


def test_files_changed_beside_a_port_are_said_unverified_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sdpa_port.edge.report import print_unverified_beside
    from sdpa_port.edge.outcome import Outcome, Summary
    from sdpa_port.edge.trust import COPIES, FAMILY
    from sdpa_port.result import PortResult, Status

    def outcome(name: str, kind: str, unverified: str | None) -> Outcome:
        path = tmp_path / name
        return Outcome(path, PortResult(Status.PORTED, "", None, ""), written=path, kind=kind, unverified=unverified)

    port = outcome("modeling_a.py", "port", None)
    print_unverified_beside(Summary([port]))
    assert capsys.readouterr().err == ""
    print_unverified_beside(Summary([port, outcome("modeling_b.py", "family", FAMILY), outcome("modeling_c.py", "copies", COPIES)]))
    assert capsys.readouterr().err.splitlines() == [
        "not verified: 2 other file(s) changed to follow the port; only the files named are verified"
    ]
