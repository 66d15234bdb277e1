#!/bin/bash
# The position-learning-rate experiment of docs/study.md: pre-train each method with --position-lr-scale 1 and
# 10, seeds 0 and 1, at the study size; prints the validation MLM loss of every run (one core, sequential).
# usage: scripts/study_recipe.sh OUT [STEPS]
set -e
out=${1:-study-recipe}; steps=${2:-500}
python -c "from diet.data.synthetic import write_builtin; write_builtin('$out/data', seed=0)"
for seed in 0 1; do for m in absolute diet-rel t5 diet-abs tupe-r; do for scale in 1 10; do
  d=$out/$m-x$scale-s$seed
  diet pretrain $out/data/corpus --method $m --recipe toy --size study --steps $steps --save-steps 250 \
       --position-lr-scale $scale --seed $seed --threads 1 -o $d >/dev/null 2>&1
  python -c "import json; r=json.load(open('$d/pretrain_results.json')); print('$m', $scale, $seed, round(r['val_loss'],4), round(r['seconds']))"
done; done; done
