"""What follows a successful port at the edge: verifying it and writing its parity test.

Verifying imports and runs the code.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from sdpa_port import __version__
from sdpa_port.checkout.context import find_checkout
from sdpa_port.edge.files import atomic_write
from sdpa_port.emit.parity_test import model_folder, model_name, render_parity_test
from sdpa_port.result import PortResult, Style


@dataclass(frozen=True)
class Verification:
    passed: bool
    lines: tuple[str, ...]  # every check, as "name: ok/FAILED max|diff|=..."
    undriven: str | None = None  # why, when no check failed but some could not be driven (`not verified: ...`)
    # the flags whose checks ran and matched (`verify/claims.py`), each with the model classes to set it on
    claimed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    not_claimed: tuple[tuple[str, str], ...] = ()  # the flags checked and not claimed, each with why


def verify_port(input_path: Path, original_source: str, result: PortResult, claims: bool = False) -> Verification:
    """Load the original and the port inside the installed transformers and run the parity checks.

    This imports torch and transformers and executes both modeling files. `claims`: an interface-style port also runs
    under flex attention, through transformers' flash path with a CPU stand-in kernel, and compiled; those checks
    (with the port's static proof, for flash) say which flags the port may set and never fail the verification.
    """
    from sdpa_port.verify.auto import verify_pair
    from sdpa_port.verify.claims import ClaimCheck, claiming_classes, verdicts
    from sdpa_port.verify.loader import load_source_in_package
    from sdpa_port.verify.packages import package_for
    from sdpa_port.verify.quiet import transformers_quiet
    from sdpa_port.verify.unverified import Unverified

    with tempfile.TemporaryDirectory(prefix="sdpa-port-verify-") as directory, transformers_quiet():
        try:
            try:
                package = package_for(package_of(input_path), original_source, input_path)
                original = load_source_in_package(original_source, package, Path(directory), f"{input_path.stem}_original")
                ported = load_source_in_package(result.source, package, Path(directory), f"{input_path.stem}_ported")
            except ImportError as error:  # NoPackage too: its own package is not importable here
                checks = _with_stand_ins(input_path, original_source, result, Path(directory), error)
                claims = False
            else:
                claims = claims and result.style is Style.INTERFACE
                if result.style is Style.INLINE:
                    from sdpa_port.verify.inline import verify_inline

                    checks = verify_inline(original, ported, result.attention_classes)
                else:
                    checks = verify_pair(original, ported, claims=claims)
            reasons = with_flash_proof(verdicts(checks), result) if claims else {}
            claimed = tuple((flag, claiming_classes(ported, flag)) for flag, why in reasons.items() if not why)
        except Exception as error:  # an import or run failure of user code is a failed verification
            return Verification(False, (f"could not run the checks: {type(error).__name__}: {error}",))
    parity = [c for c in checks if not isinstance(c, ClaimCheck)]
    passed = all(c.passed for c in parity)
    failed = any(not c.passed and not isinstance(c, Unverified) for c in parity)
    undriven = "; ".join(c.detail for c in parity if isinstance(c, Unverified)) if not (passed or failed) else None
    if not passed:
        claimed, reasons = (), {}
    elif claims and not reasons:
        reasons = {"": "not checked: the checks ran no model of this port under flex or flash attention, or compiled"}
    not_claimed = tuple((flag, why) for flag, why in reasons.items() if why)
    return Verification(passed, tuple(str(c) for c in checks), undriven, claimed=claimed, not_claimed=not_claimed)


def with_flash_proof(reasons: dict[str, str], result: PortResult) -> dict[str, str]:
    """The flags' verdicts, flash attention's withheld where the port's static proof does not hold
    (`plan/flash_proof.py`): a run that matched is not a proof for the inputs it did not try."""
    from sdpa_port.plan.flash_proof import FLASH_FLAG

    if FLASH_FLAG not in reasons or result.no_flash == "":
        return reasons
    run = reasons[FLASH_FLAG] or "its run through transformers' flash path matched eager"
    proof = result.no_flash if result.no_flash is not None else "the port's plan made no proof"
    return {**reasons, FLASH_FLAG: f"not a plain masked attention: {proof} ({run})"}


def _with_stand_ins(input_path: Path, original_source: str, result: PortResult, directory: Path, error: ImportError) -> list:  # type: ignore[type-arg]
    """The port's attention classes checked on their own, both files loaded with stand-ins for what they import from
    a package this Python cannot import (`verify/stubs.py`); `error` is raised again when even that cannot load them."""
    from sdpa_port.verify.alone import verify_alone
    from sdpa_port.verify.diagnose import attention_classes
    from sdpa_port.verify.inline import verify_inline
    from sdpa_port.verify.stubs import load_with_stand_ins, missing_imports

    tops, relative = missing_imports(original_source)
    try:
        original = load_with_stand_ins(original_source, directory, f"{input_path.stem}_original", input_path.parent)
        ported = load_with_stand_ins(result.source, directory, f"{input_path.stem}_ported", input_path.parent)
    except Exception:
        raise error from None
    standing = [f"`{top}`" for top in tops] + (["its relative imports (files beside it run)"] if relative else [])
    why = (
        f"not loadable as it is here ({type(error).__name__}: {str(error)[:120]}); loaded with stand-ins for "
        f"{', '.join(standing) or 'nothing'}, so only its attention classes are checked, on their own"
    )
    if result.style is Style.INLINE:
        return verify_inline(original, ported, result.attention_classes, alone=why)
    return verify_alone(original, ported, attention_classes(original, ported), why)


def package_of(input_path: Path) -> str:
    """The transformers package a modeling file's folder names, tried first to load it in.

    See `model_folder`; `verify.packages.package_for` checks it against the installed transformers.
    """
    return f"transformers.models.{model_folder(input_path)}"


# why a port comes without a parity test (said as a warning, not left to be noticed)
NO_PARITY_TEST = (
    "no parity test written: the emitted tests drive models that take `input_ids`, and no model class of this file "
    "does (audio, vision); `--verify` checks the port on the inputs each model takes"
)


NO_INLINE_PARITY_TEST = (
    "no parity test written: an in-place port keeps no eager implementation to compare against inside the file; "
    "`--verify` compares it with the original file"
)


def write_parity_test(input_path: Path, written: Path, result: PortResult, tests_dir: Path | None) -> Path | None:
    """Write the port's parity test, or return None when no test can be made for the file.

    In a checkout the test goes beside the model's own tests, built on its testers. `NO_PARITY_TEST` says why there may
    be none.
    """
    if result.style is Style.INLINE:
        return None
    style = result.style.value if result.style else "auto"
    checkout = find_checkout(input_path)
    tester_source = None
    if checkout is not None:
        try:
            tester = checkout.tester_module(model_folder(input_path), model_name(input_path))
            tester_source = tester.read_text(encoding="utf-8")
        except OSError:
            tester_source = None
    emitted = render_parity_test(result.source, input_path, written, tests_dir, style, __version__, tester_source)
    if emitted is None:
        return None
    emitted.path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(emitted.path, emitted.source)
    return emitted.path
