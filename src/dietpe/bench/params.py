"""DIET Table 6 (model parameters) at bert-base, for any row: `dietpe bench --params [--methods LIST]`.

The count is the pre-training model's, as BERT's checkpoints count it: the encoder with its pooler and the MLM
head (transform, layer norm and output bias; the decoder is the word embeddings, counted once). Position
tables have the papers' 512 rows (the English model trains on 128 tokens with 512-row tables: Table 6's
DIET-ABS rows, 18.9M and 1.6M of P_Q, P_K, need them). The paper's English vocabulary is "30,000" (§4.1); its
counts fit BERT's 30,522 (110.1M; 30,000 gives 109.7M), and the multilingual column its 120,000 (§4.2).

Shaw et al.'s row (112.9M, +2.8M) is not reached by the clip ranges the papers name: Shaw's layout (a^K and
a^V ∈ R^{d_h} per layer, shared by the heads: 1,536 parameters per offset at bert-base) with k = 16 adds
0.05M, with TUPE's t = 128 0.4M, over every offset of 512 positions (k = 511) 1.6M. The count fits that layout
over ±1024 offsets (2,049 rows each: 3.15M for the tables, less BERT's 0.39M input table): the spec
`shaw:shaw_max_distance=1024`, which at the papers' lengths (≤ 512) computes what the unclipped Shaw does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dietpe.methods import Method, parse_method

# (row as the paper names it, spec, English parameters in millions, multilingual parameters in millions)
TABLE6 = (
    ("Devlin et al. (2018)", "absolute", 110.1, 178.9),
    ("Shaw et al. (2018)", "shaw:shaw_max_distance=1024", 112.9, 181.7),
    ("DIET-REL", "diet-rel", 109.9, 178.7),
    ("DIET-REL (share)", "diet-rel:sharing=layer", 109.7, 178.5),
    ("DIET-ABS (d_p=128)", "diet-abs:position_rank=128", 128.6, 197.4),
    ("DIET-ABS (d_p=128, share)", "diet-abs:position_rank=128:sharing=layer", 111.3, 180.1),
)
ENGLISH_VOCAB, MULTILINGUAL_VOCAB = 30522, 120000  # the vocabularies Table 6's counts fit
PAPER_ROWS = 512  # position table rows in both columns


def pretraining_parameters(method: Method, vocab_size: int = ENGLISH_VOCAB, size: str = "bert-base",
                           positions: int = PAPER_ROWS) -> int:
    """Parameters of the pre-training model (encoder with pooler, MLM head with its decoder tied), built on the
    meta device: no memory, no time."""
    from dietpe.models.modeling import DietLMHead, DietModel
    from dietpe.tasks.recipes import build_config

    config = build_config(method, size, vocab_size, positions, 0)
    with torch.device("meta"):
        encoder, head = DietModel(config, add_pooling_layer=True), DietLMHead(config)
    tied = head.decoder.weight.numel()  # the word embeddings, already counted in the encoder
    return sum(p.numel() for p in encoder.parameters()) + sum(p.numel() for p in head.parameters()) - tied


@dataclass
class ParamsRow:
    label: str
    spec: str
    english: int
    multilingual: int
    paper_english: float | None = None  # millions
    paper_multilingual: float | None = None


def table6_rows(methods: list[Method] | None = None, size: str = "bert-base") -> list[ParamsRow]:
    """Table 6's rows, then any other method asked for, each counted at both vocabularies."""
    named = {parse_method(spec).name: (label, en, ml) for label, spec, en, ml in TABLE6}
    wanted = [parse_method(spec) for _, spec, _, _ in TABLE6]
    for m in methods or []:
        if m.name not in {w.name for w in wanted}:
            wanted.append(m)
    rows = []
    for m in wanted:
        label, en, ml = named.get(m.name, ("", None, None))
        rows.append(ParamsRow(label, m.name, pretraining_parameters(m, ENGLISH_VOCAB, size),
                              pretraining_parameters(m, MULTILINGUAL_VOCAB, size), en, ml))
    return rows


def markdown(rows: list[ParamsRow], size: str = "bert-base") -> str:
    base = next((r for r in rows if r.spec == "absolute"), rows[0])

    def cell(n: int, paper: float | None, ref: int) -> str:
        ours = f"{n / 1e6:.1f}M ({(n / ref - 1) * 100:+.1f}%)"
        return ours + (f" | {paper:.1f}M | {n / 1e6 - paper:+.2f}M" if paper is not None else " | – | –")

    lines = [f"### DIET Table 6: parameters at {size}, {PAPER_ROWS}-row position tables", "",
             f"The pre-training model (encoder with pooler, MLM head, decoder tied); English vocabulary "
             f"{ENGLISH_VOCAB:,}, multilingual {MULTILINGUAL_VOCAB:,}; % against `absolute`.", "",
             "| row | spec | English (ours) | paper | ours − paper | multilingual (ours) | paper | ours − paper |",
             "|---|---|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r.label or '–'} | `{r.spec}` | {cell(r.english, r.paper_english, base.english)} "
                     f"| {cell(r.multilingual, r.paper_multilingual, base.multilingual)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(prog="python -m dietpe.bench.params", description="DIET Table 6: parameters of each "
                            "row, ours against the paper's").parse_args()  # takes no options: refuses any
    print(markdown(table6_rows()))
