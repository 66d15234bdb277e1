#!/usr/bin/env bash
# Every command that runs a model, once on a GPU at its smallest size, to its report: pretrain, analyze,
# finetune, lm, lengths, translate train and eval, bench (compare is the checklist's own step). Each step has
# its own time limit and prints one summary line; the commands' output goes to one file, OUT/commands.log,
# and their folders to a temporary directory, removed at the end. Exit status 1 when a step fails.
#
#   scripts/gpu_commands.sh OUT [DEVICE [STEP ...]]    DEVICE: cuda (default), or cpu for a dry run on the CPU
#
# Steps: pretrain analyze finetune lm lengths translate_train translate_eval bench (default: all; analyze and
# finetune read pretrain's model, lengths lm's, translate_eval translate_train's). On the CPU under load
# all eight took 6 min; expect 2-4 min on a GPU (each step starts Python and torch; flex is not used).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_commands.sh OUT [DEVICE [STEP ...]]}
DEV=${2:-cuda}
shift $(( $# < 2 ? $# : 2 ))
STEPS=${*:-pretrain analyze finetune lm lengths translate_train translate_eval bench}
PY=${PYTHON:-python}
mkdir -p "$OUT"
LOG="$OUT/commands.log"
: > "$LOG"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
status=0

step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    case " $STEPS " in *" $name "*) ;; *) return 0;; esac
    echo "== $name: $*" >> "$LOG"
    timeout "$limit" "$@" >> "$LOG" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        echo "commands $name: ok $((SECONDS - start))s"
    else
        status=1
        echo "commands $name: FAIL rc=$rc $((SECONDS - start))s: $(grep -v '^[[:space:]]*$' "$LOG" | tail -1 | cut -c1-240)"
    fi
}

$PY - "$W" <<'EOF' >> "$LOG" 2>&1
import random, sys
from pathlib import Path
from dietpe.data.synthetic import write_builtin
root = Path(sys.argv[1])
write_builtin(root / "data", seed=0, documents=400, train=200, dev=100)
rng, words = random.Random(0), {w: w[::-1] for w in "red blue green cat dog bird runs sits eats big small".split()}
pairs = root / "pairs"
pairs.mkdir()
for name, n in (("train", 400), ("val", 40)):
    src = [" ".join(rng.choices(list(words), k=rng.randint(3, 7))) for _ in range(n)]
    (pairs / f"{name}.xx").write_text("\n".join(src) + "\n")
    (pairs / f"{name}.yy").write_text("\n".join(" ".join(words[w] for w in s.split()) for s in src) + "\n")
EOF
D="--device $DEV --threads 2"
TINY=":hidden_size=64:num_hidden_layers=1:num_decoder_layers=1:num_attention_heads=4:intermediate_size=128"

step pretrain 150 dietpe pretrain "$W/data/corpus" --method diet-rel:segment=per-head --recipe toy --steps 20 \
    --batch-size 8 --max-length 32 --save-steps 20 $D -o "$W/pre"
step analyze 90 dietpe analyze "$W/pre/model" --data "$W/data/corpus/valid.txt" --batch-size 4 --length 32 \
    --device "$DEV" -o "$W/analyze"
step finetune 150 dietpe finetune "$W/pre/model" "$W/data/order" --ft-recipe toy --lrs 1e-3 --seeds 1 --epochs 1 \
    --max-train 64 --max-eval 32 $D -o "$W/finetune"
step lm 150 dietpe lm "$W/data/corpus" --methods alibi,fire --steps 20 --max-length 16 --vocab-size 200 \
    --batch-size 8 --lengths 1,2 $D -o "$W/lm"
step lengths 90 dietpe lengths "$W/lm/alibi" --data "$W/data/corpus" --lengths 1,2 $D -o "$W/lengths"
step translate_train 150 dietpe translate train --data "$W/pairs" --source xx --target yy --output-dir "$W/tr" \
    --method "diet-rel$TINY" --vocab-size 80 --batch-size 16 --lr 3e-3 --warmup-steps 5 --dropout 0 \
    --max-steps 20 --eval-steps 10 --save-steps 20 $D
step translate_eval 90 dietpe translate eval "$W/tr" --source "$W/pairs/val.xx" --reference "$W/pairs/val.yy" \
    --output "$W/hyp.txt" --beams 2 --limit 12 --speed $D
MEMORY=$([ "$DEV" = cpu ] && echo --no-memory)  # the CPU's memory phase runs each case again in a process
step bench 150 dietpe bench --shapes bert-tiny --lengths 64 --batch 2 --repeats 1 --warmup 1 \
    --methods diet-rel+seg,alibi --device "$DEV" $MEMORY
exit $status
