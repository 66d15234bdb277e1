"""Look inside a model: the rank of attention matrices (DIET, Chen et al. 2021, Fig. 2 and 8; Theorem 1),
position-only attention patterns (DIET Fig. 4 and 7, TUPE Fig. 6), segment attention (DIET Fig. 6) and the
cosine similarity of position embeddings (DIET Fig. 5).

Pure functions compute the numbers (`rank`, `logits`, `patterns`); `plots` draws them; `report` does both for
one model and writes an index. The same functions serve `dietpe analyze`, `dietpe compare` and a model in memory:

    >>> from dietpe.analysis import position_pattern, report
    >>> position_pattern(model, 64)[0]          # (H, 64, 64), layer 0's position-only logits
    >>> report(model, tokenizer, "out/", data="valid.txt")   # -> Path("out/index.md")
"""

from dietpe.analysis.logits import LayerLogits, attention_logits, encoder_of
from dietpe.analysis.patterns import (
    cosine_similarity_matrix,
    offset_profile,
    position_cosine_similarity,
    position_embeddings,
    position_pattern,
    segment_pattern,
    toeplitz_deviation,
    two_segments,
)
from dietpe.analysis.rank import default_rtol, numerical_rank, singular_values
from dietpe.analysis.report import Analysis, analyze, compare_section, report, sample_batch, write_report

__all__ = ["numerical_rank", "singular_values", "default_rtol", "attention_logits", "LayerLogits", "encoder_of",
           "position_pattern", "segment_pattern", "two_segments", "offset_profile", "toeplitz_deviation",
           "position_embeddings", "position_cosine_similarity", "cosine_similarity_matrix", "analyze", "Analysis",
           "report", "write_report", "sample_batch", "compare_section"]
