"""Model sizes and the papers' recipes (DIET appendix A, Table 7; TUPE appendix B, its Table 2): what `dietpe
pretrain`, `dietpe finetune` and `dietpe compare` train with unless the command line says otherwise.

`paper` and `tupe` are the papers' settings field by field; where a paper is silent the choice is named in
docs/recipes.md with its reason (tests/tasks/test_recipes.py pins each field to the paper's table)."""

from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING

from dietpe.errors import ConfigError
from dietpe.presets import PRESETS

if TYPE_CHECKING:  # the model code is imported when a config is built, not when the parsers list the sizes
    from dietpe.config import DietConfig
    from dietpe.methods import Method

# `toy` is the built-in comparison's size (fits ~10 CPU minutes for 12 methods); the rest are diet's presets.
SIZES: dict[str, tuple[str, dict]] = {
    "toy": ("bert-tiny", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)),
    # The built-in study (docs/study.md): the toy width with 8 heads of d_h = 8, so that 32-token windows are
    # longer than d_h + d_p (DIET Theorem 1's gap can show) at the toy's cost.
    "study": ("bert-tiny", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, intermediate_size=256)),
    **{name: (name, {}) for name in PRESETS},
}


def build_config(method: Method, size: str, vocab_size: int, max_length: int, pad_token_id: int,
                 max_position_embeddings: int | None = None, dropout: float | None = None,
                 logit_scale: float | None = None) -> DietConfig:
    from dietpe.config import DietConfig
    from dietpe.positions.encoding import check_length

    if size not in SIZES:
        raise ConfigError(f"model size {size!r} is not one of {', '.join(SIZES)}")
    preset, overrides = SIZES[size]
    max_positions = max_position_embeddings or max_length
    check_length(method.position, max_length, max_positions, "max_length=", "raise max_position_embeddings",
                 ConfigError)
    if dropout is not None:
        overrides = {**overrides, "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    if logit_scale is not None:  # the recipe's parametrization; a spec's own logit_scale= still wins
        overrides = {**overrides, "logit_scale": logit_scale}
    fields = {**overrides, **method.config_fields()}  # a method's fields override the size preset's
    return DietConfig.from_preset(preset, **fields, vocab_size=vocab_size, max_position_embeddings=max_positions,
                                  pad_token_id=pad_token_id)


def check_model_length(config: DietConfig, max_length: int, where: str) -> None:
    """Refuse, before training, a length the pretrained model's position method cannot serve."""
    from dietpe.positions.encoding import check_length

    check_length(config.position, max_length, config.max_position_embeddings, "max_length=",
                 f"the model in {where}; use --ft-max-length {config.max_position_embeddings} or less", ConfigError)


@dataclass(frozen=True)
class PretrainRecipe:
    learning_rate: float
    warmup: float            # fraction of the steps
    max_length: int
    batch_size: int          # global, reached with gradient accumulation
    max_steps: int
    save_steps: int
    weight_decay: float = 0.01
    adam_epsilon: float = 1e-6
    max_grad_norm: float = 1.0
    vocab_size: int = 30000
    size: str = "bert-base"
    # learning rate of logit-unit position parameters relative to learning_rate, every method alike
    # (dietpe.tasks.optim): an option; the stored scale (DietConfig.logit_scale) makes 1 train them
    logit_lr_scale: float = 1.0
    optimizer: str = "adamw"          # or "lamb" (dietpe.tasks.lamb)
    # DietConfig.logit_scale of every model: None keeps the config's default (10); 1 stores the logit-unit
    # tables as used, the parametrization a paper trains (docs/parametrization.md)
    logit_scale: float | None = None
    max_positions: int | None = None  # rows of the position tables; None: max_length
    # steps whose model is kept besides the last (a convergence study fine-tunes them; TUPE Fig. 5); with
    # --steps the recipe's are scaled to the new length
    keep_steps: tuple[int, ...] = ()
    tokenizer_type: str = "wordpiece"  # the tokenizer trained on the corpus (dietpe.data.tokenizer)


@dataclass(frozen=True)
class FinetuneRecipe:
    learning_rates: tuple[float, ...]
    seeds: int
    epochs: float
    batch_size: int
    max_length: int
    warmup: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    eval_steps: int | None = None    # evaluate (and checkpoint) every N steps; None: every epoch
    # epochs by task name (`TaskSpec.name`), where they differ from `epochs` ("5 or 10 epochs")
    task_epochs: tuple[tuple[str, float], ...] = ()
    # the metric that picks the best evaluation and is reported, by task name, where it is not the task's first
    metrics: tuple[tuple[str, str], ...] = ()
    adam_epsilon: float = 1e-8
    doc_stride: int | None = None  # QA windows' overlap (None: dietpe.commands.DOC_STRIDE)
    # QA windows' starts this many tokens apart, as BERT's run_squad and XTREME's `doc_stride`: each question's
    # windows then overlap by the room its length leaves less this (None: they overlap by `doc_stride`)
    doc_step: int | None = None


# The papers' "5 or 10 epochs": TUPE's Table 2 footnote says which (DIET's Table 7 has the same words):
# five for the large tasks, ten for the others.
FIVE_EPOCHS = (("MNLI", 5.0), ("QQP", 5.0), ("QNLI", 5.0))
# Both papers report QQP (and TUPE MRPC) by accuracy
ACCURACY = (("QQP", "accuracy"), ("MRPC", "accuracy"))

PRETRAIN_RECIPES = {
    # DIET appendix A, Table 7 (English): 500k steps, lr 0.0018, warm-up 2.5%, length 128, batch 4096, a
    # checkpoint every 20k steps, a 30,000-token WordPiece vocabulary (§4.1), BERT-base, 512-row position tables
    # (Table 6's counts), logit-unit tables stored as used. The optimizer is not named: LAMB, whose BERT recipe at
    # batch 4096 is this learning rate and warm-up (docs/recipes.md).
    "paper": PretrainRecipe(1.8e-3, 0.025, 128, 4096, 500_000, 20_000, optimizer="lamb", logit_scale=1.0,
                            max_positions=512),
    # TUPE appendix B, Table 2: 1M steps, batch 256, length 512, Adam (eps 1e-6, betas 0.9/0.999), lr 1e-4 with a
    # 10k-step (1%) warm-up then linear decay, clip 1.0, weight decay 0.01, dropout 0.1, vocabulary 32,768; the
    # 100k, 300k and 600k checkpoints kept for fine-tuning (Fig. 5, Table 1's "mid" rows).
    "tupe": PretrainRecipe(1e-4, 0.01, 512, 256, 1_000_000, 20_000, vocab_size=32768, logit_scale=1.0,
                           max_positions=512, keep_steps=(100_000, 300_000, 600_000)),
    # `dietpe compare --plan gpu-hour` (docs/recipes.md, "One GPU-hour"): DIET's BERT_SMALL (§3.3: hidden 512, 4
    # layers, 8 heads), the paper's 128-token blocks, 3,000 steps of 256 blocks (98M tokens), AdamW.
    "gpu-hour": PretrainRecipe(1e-3, 0.06, 128, 256, 3000, 500, size="bert-small", vocab_size=16000),
    # A budget for a CPU session: same shape, a few hundred steps of bert-mini.
    "cpu": PretrainRecipe(1e-3, 0.06, 128, 32, 600, 100, size="bert-mini", vocab_size=8000),
    # The built-in comparison: the toy size on the generated corpus.
    "toy": PretrainRecipe(2e-3, 0.06, 32, 32, 800, 200, size="toy", vocab_size=1000),
    # The built-in study (docs/study.md): 8 heads, 500 steps, one learning rate for every parameter: the
    # logit-unit tables are stored over the config's logit_scale (10), which gave the 10x rate the study used
    # to give them in an optimizer group of their own (docs/parametrization.md).
    "study": PretrainRecipe(2e-3, 0.06, 32, 32, 500, 125, size="study", vocab_size=1000),
    # Continued pre-training of a checkpoint (`--init`, chosen when it is given; docs/causal.md): with BERT's
    # input table kept (the --init default) lr 1e-3 keeps what the checkpoint knew and learns fastest of
    # {1e-4, 3e-4, 1e-3}; 10 % warm-up (as good as 6 %, gentler on the fresh terms). Size and vocabulary are
    # the checkpoint's.
    "init": PretrainRecipe(1e-3, 0.1, 128, 32, 600, 100, size="bert-mini", vocab_size=8000),
    # DIET appendix A, Table 7 (multilingual): 125k steps, lr 0.0018, warm-up 2.5%, length 512, batch 4096, a
    # 120k SentencePiece vocabulary (Unigram, SentencePiece's default model type; the paper does not say which)
    # on Wikipedia in 100 languages; --languages samples them with XLM's alpha 0.5 (dietpe.data.multilingual).
    # Table 7 gives both columns the same learning rate and warm-up and names no optimizer: LAMB and the tables as the
    # equations write them, as `paper` (lr 1.8e-3 at batch 4096 is LAMB's BERT recipe; docs/recipes.md).
    "paper-multilingual": PretrainRecipe(1.8e-3, 0.025, 512, 4096, 125_000, 20_000, vocab_size=120_000,
                                         tokenizer_type="unigram", optimizer="lamb", logit_scale=1.0),
    # The built-in cross-lingual suite (docs/xtreme.md): the study size, 128-token blocks (XNLI's pairs reach
    # 125 tokens; QA's windows), 150 steps, one evaluation: what fits two CPU cores in well under an hour.
    "xtreme": PretrainRecipe(2e-3, 0.06, 128, 32, 150, 150, size="study", vocab_size=8000,
                             tokenizer_type="unigram"),
}


FINETUNE_RECIPES = {
    # DIET Table 7: lr grid {1,2,3,4}e-5, warm-up 10%, batch 32, length 128, 5 or 10 epochs, a checkpoint every
    # 3.5k steps; Table 2: "the median of the maximum accuracy over all checkpoints among five runs", QQP by
    # accuracy. Adam's epsilon 1e-6 as in pre-training (BERT's).
    "paper": FinetuneRecipe((1e-5, 2e-5, 3e-5, 4e-5), 5, 10, 32, 128, eval_steps=3500, task_epochs=FIVE_EPOCHS,
                            metrics=ACCURACY, adam_epsilon=1e-6),
    # TUPE Table 2: lr grid {2,3,4,5}e-5, batch 32, warm-up 6%, length 512, 5 epochs for MNLI, QQP, QNLI and 10
    # for the others, the pre-training's Adam (eps 1e-6), clip 1.0, weight decay 0.01; the median of five seeds,
    # the best configuration; accuracy for every task but CoLA (MCC) and STS-B (Pearson).
    "tupe": FinetuneRecipe((2e-5, 3e-5, 4e-5, 5e-5), 5, 10, 32, 512, warmup=0.06, task_epochs=FIVE_EPOCHS,
                           metrics=ACCURACY, adam_epsilon=1e-6),
    # --plan gpu-hour: the papers' protocol (a grid, the median over seeds, QQP by accuracy) at learning rates
    # for a 4-layer model, evaluated each epoch; 3 seeds and 2 epochs to fit the hour as measured on an H200
    # (5 seeds and 3 epochs took 108 min there: docs/recipes.md)
    "gpu-hour": FinetuneRecipe((1e-4, 3e-4), 3, 2, 32, 128, metrics=ACCURACY, adam_epsilon=1e-6),
    "cpu": FinetuneRecipe((1e-4,), 1, 3, 32, 128),
    "toy": FinetuneRecipe((1e-3,), 2, 3, 32, 32),
    # The built-in study (docs/study.md): 8 epochs, at which 1e-3 is the stable learning rate of the grid
    # {1e-3, 3e-3}, one fine-tuning seed per pre-training seed (3 pre-training seeds give the interval) ...
    "study": FinetuneRecipe((1e-3,), 1, 8, 32, 32),
    # ... and with --budget 2 or more the papers' protocol: the grid, the median of 3 fine-tuning seeds.
    "study-full": FinetuneRecipe((1e-3, 3e-3), 3, 8, 32, 32),
    # DIET appendix A, Table 7 (multilingual) and §4.2: lr {1,2,3,4}e-5, warm-up 10%, batch 32, 3 epochs,
    # length 512, a checkpoint every 3.5k steps, 5 trials (median); Adam's epsilon as `paper`'s. The paper does
    # not give QA's windows: BERT's and XTREME's, which start 128 tokens apart.
    "paper-multilingual": FinetuneRecipe((1e-5, 2e-5, 3e-5, 4e-5), 5, 3, 32, 512, eval_steps=3500,
                                         adam_epsilon=1e-6, doc_step=128),
    # The built-in cross-lingual suite (docs/xtreme.md): 2 epochs (the paper's 3 cost half as much again), the
    # study's learning rate; QA windows overlap by 32 tokens, which XQuAD's longest question (88 tokens in Greek)
    # leaves room for.
    "xtreme": FinetuneRecipe((1e-3,), 1, 2, 32, 128, doc_stride=32),
}


@dataclass(frozen=True)
class TranslationRecipe:
    """`dietpe translate train` and `eval` unless the command line says otherwise."""

    size: str
    vocab_size: int            # the joint BPE vocabulary
    max_length: int            # longest source or target, tokens with </s>
    batch_size: int | None     # sentence pairs per step, or
    batch_tokens: int | None   # tokens per step, as tensor2tensor counts them (dietpe.tasks.translate)
    grad_accum: int
    learning_rate: float       # peak, after the linear warm-up, then ∝ 1/√step
    warmup_steps: int
    label_smoothing: float
    epochs: int
    max_steps: int | None
    beams: int                 # decoding
    length_penalty: float
    length_penalty_form: str   # hf: log P / |Y|^α; gnmt: log P / ((5 + |Y|) / 6)^α (dietpe.models.beam)
    max_grad_norm: float = 1.0  # gradient clipping; 0: off
    # DietConfig.logit_scale: None keeps the config's (10, docs/parametrization.md); the paper's recipe stores the
    # logit-unit tables as used (1), as the pre-training paper recipes do
    logit_scale: float | None = None


TRANSLATION_RECIPES = {
    # Small CPU runs (docs/translation.md, Multi30k).
    "cpu": TranslationRecipe("transformer-small", 8000, 128, 64, None, 1, 1e-3, 1000, 0.1, 10, None, 10, 0.6,
                                 "hf"),
    # DIET appendix A, which follows Vaswani et al. (2017) in tensor2tensor: a 6-layer Transformer (base),
    # Adam, 250k steps, beam 10, length penalty 0.6 (tensor2tensor's, GNMT's form). The paper is silent on the
    # rest; from tensor2tensor's transformer_base and Vaswani et al.: batches of 4096 tokens on each of 8 devices
    # (here 8 accumulated, Vaswani's ~25k source + 25k target tokens per step), warm-up 4000 steps to
    # d^-0.5 · 4000^-0.5 = 7e-4, label smoothing 0.1, sequences up to 256 tokens, a shared 32k subword
    # vocabulary (tensor2tensor's translate_ende_wmt32k), no gradient clipping (transformer_base's
    # clip_grad_norm = 0).
    "paper": TranslationRecipe("transformer-base", 32000, 256, None, 4096, 8, 7e-4, 4000, 0.1, 1, 250_000, 10, 0.6,
                               "gnmt", max_grad_norm=0.0, logit_scale=1.0),
}


# `dietpe compare --plan NAME`: a study sized for a machine, on the user's corpus and tasks (docs/recipes.md
# states its sizing and time). Any option given on the command line wins.
STUDY_PLANS = {
    # one H100-class GPU for about an hour: DIET's BERT_SMALL, 3 pre-training seeds of the claims' main rows, the
    # papers' fine-tuning protocol (a learning-rate grid, the median over fine-tuning seeds: 3 here, the papers' 5)
    "gpu-hour": dict(recipe="gpu-hour", ft_recipe="gpu-hour", methods="gpu-hour", pretrain_seeds=3,
                     max_validation=1000),
}
