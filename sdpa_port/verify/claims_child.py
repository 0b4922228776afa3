"""The claim checks of one port, run in a process of their own: a compiler crash there cannot take `--verify` down.

`python -m sdpa_port.verify.claims_child` reads one JSON request on stdin (the original's and the port's sources with
their module names, the package they load in; then the token model and its config overrides, or the file that holds
the driven models, `driven_claims.py`) and prints the checks as one JSON line. `claims.in_child` is the parent's side.
Imports torch.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

def main() -> int:
    from sdpa_port.verify.auto import pick_targets, token_config
    from sdpa_port.verify.claims import claim_checks
    from sdpa_port.verify.loader import load_in_package
    from sdpa_port.verify.quiet import transformers_quiet

    request = json.loads(sys.stdin.read())
    with tempfile.TemporaryDirectory(prefix="sdpa-port-claims-") as directory, transformers_quiet():
        loaded = []
        for stem, source in request["modules"]:  # under their names in the parent, so that classes match
            path = Path(directory) / f"{stem}.py"
            path.write_text(source, encoding="utf-8")
            loaded.append(load_in_package(path, request["package"], stem))
        original, ported = loaded
        if "driven" in request:
            from sdpa_port.verify.driven_claims import driven_claim_checks, load_models

            models = load_models(request["driven"])  # after the files: a config may be defined in one
            checks = [check for model in models for check in driven_claim_checks(original, ported, model)]
        else:
            targets = pick_targets(original)
            assert targets is not None and targets.base.__name__ == request["base"]
            config = token_config(targets, request["overrides"])
            padded = "left" if targets.kind == "decoder" else "right"
            checks = claim_checks(targets.base, ported, config, padded, targets.kind)
    print(json.dumps([asdict(check) for check in checks]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
