"""What a fine-tuning task is: the layout of its files and its official metrics (`dietpe.data.tasks` reads
files with it; `dietpe.data.synthetic` declares the built-in tasks with it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["classification", "regression", "qa"]


@dataclass(frozen=True)
class TaskSpec:
    """How a task's files are laid out and scored. Columns are header names, or indices without a header."""

    name: str
    kind: Kind
    metrics: tuple[str, ...]
    labels: tuple[str, ...] = ()  # class names as written in the files; index = class id
    text_a: str | int = "sentence"
    text_b: str | int | None = None
    label: str | int = "label"
    header: bool = True
    eval_files: tuple[str, ...] = ("dev.tsv",)
    value_range: tuple[float, float] | None = None  # regression targets must lie here

    @property
    def num_labels(self) -> int:
        return 1 if self.kind == "regression" else len(self.labels)
