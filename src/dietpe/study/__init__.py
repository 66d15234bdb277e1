"""The built-in study of `dietpe compare` (docs/study.md): the plan of runs (`scheduler`), the numbers per
seed and method (`results`), the papers' claims and their verdicts (`claims`), the figures (`plots`) and the
report (`report`)."""
