#!/bin/bash
# The learning-rate experiment of docs/study.md: pre-train each method with --logit-lr-scale 1 and 10, seeds 0
# and 1, at the study size; prints the validation MLM loss of every run (one core, sequential).
# usage: scripts/study_recipe.sh OUT [STEPS] [METHODS]
set -e
out=${1:-study-recipe}; steps=${2:-500}; methods=${3:-"absolute diet-rel t5 diet-abs tupe-r"}
python -c "from dietpe.data.synthetic import write_builtin; write_builtin('$out/data', seed=0)"
for seed in 0 1; do for m in $methods; do for scale in 1 10; do
  d=$out/$m-x$scale-s$seed
  [ -f $d/pretrain_results.json ] || dietpe pretrain $out/data/corpus --method $m --recipe study --steps $steps \
       --save-steps 250 --logit-lr-scale $scale --seed $seed --threads 1 -o $d >/dev/null 2>&1
  python -c "import json; r=json.load(open('$d/pretrain_results.json')); print('$m', $scale, $seed, round(r['val_loss'],4), round(r['seconds']))"
done; done; done
