"""Test sessions. `nox` runs them all; each builds its own virtualenv.

- unit:   the pure tool (no torch): analysis, passes, golden files, CLI; strict types on the core (mypy) and no
          unused code (vulture).
- tf440:  transformers 4.40.2 + torch 2.13.0 CPU: class-style acceptance on real files, with parity, and the
          differential fuzzer (fixed seeds, the regression specs, the judge's own sensitivity).
- tf523:  transformers 5.23.0 + torch 2.13.0 CPU: interface-style acceptance on real files, with parity, and the
          fuzzer's interface-style family.
- tf510:  transformers 5.10.4 (its sdpa reads no position_bias): the T5 family's folded position biases, with parity.
- tf525:  transformers 5.25.0 (the model updates continuous batching's paged cache), installed without its `kernels`
          requirement: serving checks of claimed ports, and the decoders that may not claim them.
- corpus: every PyTorch modeling file of both releases, read from their wheels, ported in one batch.
- checkout440: a contributor's transformers 4.40.2 checkout (sdist + the repository's tests at that tag), six models
  ported in place with the CLI, then the repository's checks: pinned ruff, `# Copied from` consistency, the emitted
  tests, and the models' own test files before and after.
- checkout523: the same for a transformers 5.23.0 checkout (sdist), with a model generated from a modular file.
- serving: transformers 5.23.0 + torch 2.13.0 CPU + executorch 1.5.1: the ported decoders lowered to XNNPACK and run
          from their `.pte` (continuous batching, kernels and static-cache export run in tf523).
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["unit", "tf440", "tf523", "tf510", "tf525", "corpus", "checkout440", "checkout523", "serving"]
nox.options.reuse_existing_virtualenvs = True

TORCH = "torch==2.13.0"  # installed first: a CPU build from this machine's disk, never a CUDA download
EXECUTORCH = "executorch==1.5.1"  # pinned beside torch 2.13.0 (it brings torchao)
PYTEST = "pytest>=7"


def _pytest(session: nox.Session, *args: str, env: dict[str, str] | None = None) -> None:
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *args, *session.posargs, env=env or {})


VULTURE = "vulture==2.14"
RUFF = "ruff==0.14.10"
MYPY = "mypy==2.4.1"
UNUSED = ["--min-confidence", "60", "--ignore-names", "visit_*,leave_*,on_visit,on_leave,__package__,pytestmark,pytest_*"]


@nox.session
def unit(session: nox.Session) -> None:
    session.install("-e", ".", PYTEST, VULTURE, MYPY, RUFF)
    _pytest(session, "tests/unit", "-q")
    session.run("mypy")  # strict on the pure core (pyproject's [tool.mypy])
    # pyflakes' checks: unused imports and locals, undefined names (the whitelist names vulture's findings as `_`)
    session.run("ruff", "check", "--select", "F", "sdpa_port", "tests", "scripts", "--exclude", "tests/vulture_whitelist.py")
    # no dead code: whatever the package defines is used by the package, its tests or its scripts
    session.run(
        "vulture", "sdpa_port", "tests", "scripts", "tests/vulture_whitelist.py", *UNUSED,
        "--ignore-decorators", "@app.command,@*.command,@pytest.fixture",
    )


@nox.session
def tf440(session: nox.Session) -> None:
    session.install(TORCH)
    session.install("transformers==4.40.2", "-e", ".", PYTEST)
    _pytest(session, "tests/acceptance", "tests/fuzz", "-m", "tf440", "-q", env={"SDPA_PORT_REQUIRE": "tf440"})


@nox.session
def tf523(session: nox.Session) -> None:
    session.install(TORCH)
    session.install("transformers==5.23.0", "-e", ".", PYTEST)
    _pytest(session, "tests/acceptance", "tests/fuzz", "-m", "tf523", "-q", env={"SDPA_PORT_REQUIRE": "tf523"})


# transformers 5.25.0 requires `kernels>=0.19.1` (hub kernels, a binary wheel not served for every interpreter), which
# nothing tested here imports: the release is installed without its dependencies, and these (its METADATA's
# Requires-Dist, less `kernels`) beside it
TF525_DEPS = [
    "huggingface-hub>=2.4.0,<3.0", "numpy>=1.17", "packaging>=20.0", "pyyaml>=5.1", "regex>=2025.10.22",
    "tokenizers>=0.23.1,<0.24.0", "typer", "safetensors>=0.8.0", "tqdm>=4.60",
]


@nox.session
def tf510(session: nox.Session) -> None:
    """Interface-style ports run inside 5.10.4, whose sdpa and flex read no `position_bias` (the T5 family)."""
    session.install(TORCH)
    session.install("transformers==5.10.4", "-e", ".", PYTEST)
    _pytest(session, "tests/acceptance", "-m", "tf510", "-q", env={"SDPA_PORT_REQUIRE": "tf510"})


@nox.session
def tf525(session: nox.Session) -> None:
    """Serving checks of interface-style ports inside 5.25.0 (continuous batching, registered kernels)."""
    session.install(TORCH)
    session.install(*TF525_DEPS)
    session.install("--no-deps", "transformers==5.25.0")
    session.install("-e", ".", PYTEST)
    _pytest(session, "tests/acceptance", "-m", "tf525", "-q", env={"SDPA_PORT_REQUIRE": "tf525"})


@nox.session
def corpus(session: nox.Session) -> None:
    session.install("-e", ".", PYTEST)
    cache = os.path.join(os.getcwd(), ".cache", "wheels")
    for version in ("4.40.2", "5.23.0"):
        session.run("python", "-m", "pip", "download", "--no-deps", "-q", "-d", cache, f"transformers=={version}")
    _pytest(session, "tests/corpus", "-m", "corpus", "-q", env={"SDPA_PORT_WHEELS": cache, "SDPA_PORT_REQUIRE": "corpus"})


# the checkouts' test dependencies (4.40.2's setup.py "testing" extra, the parts its model tests import)
CHECKOUT_TEST_DEPS = ["parameterized", "pytest-timeout", "timeout-decorator", "psutil", "datasets"]
# Transformers' own tests at v4.40.2, laid over the sdist (which ships none)
TRANSFORMERS_TESTS = os.environ.get("SDPA_PORT_TRANSFORMERS_TESTS", "/work/shared/transformers-tests-4.40.2")


def _checkout(session: nox.Session, version: str, ruff: str, extra: list[str], marker: str) -> None:
    session.install(TORCH)
    # the release's wheel brings the checkout's runtime dependencies; PYTHONPATH=src then runs the checkout itself
    session.install(f"transformers=={version}", f"ruff=={ruff}", *extra, "-e", ".", PYTEST)
    env = {
        "SDPA_PORT_SDISTS": os.path.join(os.getcwd(), ".cache", "sdists"),
        "SDPA_PORT_TRANSFORMERS_TESTS": TRANSFORMERS_TESTS,
        "SDPA_PORT_REQUIRE": marker,
    }
    _pytest(session, "tests/checkout", "-m", marker, "-q", "-rxXf", env=env)


@nox.session
def checkout440(session: nox.Session) -> None:
    _checkout(session, "4.40.2", "0.1.5", [*CHECKOUT_TEST_DEPS, "accelerate==0.30.1"], "checkout440")


@nox.session
def checkout523(session: nox.Session) -> None:
    _checkout(session, "5.23.0", "0.14.10", [], "checkout523")


@nox.session
def serving(session: nox.Session) -> None:
    session.install(TORCH)
    session.install(EXECUTORCH, "transformers==5.23.0", "-e", ".", PYTEST)
    _pytest(
        session,
        "tests/acceptance/test_serving_523.py",
        "-m",
        "tf523 and executorch",
        "-q",
        env={"SDPA_PORT_REQUIRE": "tf523,executorch"},
    )
