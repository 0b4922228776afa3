#!/usr/bin/env bash
# The run behind docs/benchmarks.md: every figure there comes from the files this writes under $DATA.
#
#   AUTO=/path/venv440/bin/python HAND=/path/venv447/bin/python NEW=/path/venv523/bin/python \
#       bash scripts/bench_docs.sh
#
# AUTO: transformers 4.40.2 (its files have no SDPA; the bench ports them with this checkout),
# HAND: transformers 4.47.1 (its files carry the SDPA ports written by hand; measured as they are, needs matplotlib),
# NEW:  transformers 5.23.0 (the interface-style ports). Each has torch 2.13.0 and this checkout (pip install -e .).
# Nothing else should run on the machine meanwhile: the lockstep ratios resist background load, the plain tables less.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${AUTO:?python of a transformers 4.40.2 environment}" "${HAND:?python of a transformers 4.47.1 environment}"
: "${NEW:?python of a transformers 5.23.0 environment}"
DATA=${DATA:-docs/bench-data}
ROUNDS=${ROUNDS:-30}
INTERFACE_MODELS=${INTERFACE_MODELS:-xglm codegen gptj bloom rembert megatron_bert tapas roformer trocr:TrOCRForCausalLM switch_transformers}
COMPARE="$HAND scripts/bench_compare.py"

rm -rf "$DATA" docs/img
mkdir -p "$DATA" docs/img
echo "start $(date -u)"

# 1. speed-up ratio at L=1024: automatic against hand port, the four (side, implementation) pairs taking turns
$COMPARE lockstep --auto-python "$AUTO" --hand-python "$HAND" --data "$DATA" --rounds "$ROUNDS"
echo "lockstep done $(date -u)"

# 2. full tables on both sides: forward (and prefill/decode for decoders) at 512-4096, peak memory per length
$COMPARE run --auto-python "$AUTO" --hand-python "$HAND" --data "$DATA" --cases unpadded --runs 3
echo "tables done $(date -u)"

# 3. the interface-style ports of transformers 5.23.0: speed-up and memory per length
for entry in $INTERFACE_MODELS; do  # MODEL or MODEL:CLASS where the file has no XxxModel
    model=${entry%%:*}
    class=()
    [[ $entry == *:* ]] && class=(--model-class "${entry#*:}")
    "$NEW" -m sdpa_port bench "$model" "${class[@]}" --out "$DATA/tf523" --no-plot --phases forward --runs 3 --threads 1 --device cpu
done
echo "interface models done $(date -u)"

$COMPARE summarise --data "$DATA" --out "$DATA/ratios.json"
$COMPARE plot --data "$DATA" --out docs/img
$COMPARE overview --data "$DATA" --side auto --case unpadded --out docs/img/overview_auto_unpadded.png
$COMPARE overview --data "$DATA" --side tf523 --case unpadded --out docs/img/overview_tf523.png
echo "ALL DONE $(date -u)"
