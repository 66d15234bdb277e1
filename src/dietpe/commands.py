"""The `dietpe` command line's parsers, built without importing torch or transformers (they take seconds):
each command's job is imported when it runs (`_later`), so `dietpe <command> --help` answers at once.

A command's options live here; its module (`dietpe.tasks.pretrain`, ...) does the work.
"""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

from dietpe import validate as V
from dietpe.data.vocab import MAX_VOCAB_SIZE, TOKENIZER_TYPES
from dietpe.presets import PRESETS
from dietpe.tasks.recipes import FINETUNE_RECIPES, PRETRAIN_RECIPES, SIZES, STUDY_PLANS, TRANSLATION_RECIPES

# Names the parsers offer, kept here so that listing them imports no model code; tests check they match
# `dietpe.data.mlm.PACKINGS` and `dietpe.models.seq2seq.SEQ2SEQ_PRESETS`.
PACKINGS = ("full-sentences", "documents")
SEQ2SEQ_SIZES = ("transformer-base", "transformer-small", "transformer-tiny")
LM_SIZES = ("toy", *PRESETS)


def module_file(module: str) -> Path:
    """Where a `dietpe.` module's source lies, found without importing its package (whose __init__ may be
    heavy)."""
    return Path(__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")


def _doc(module: str) -> str:
    """A module's docstring, read from its source without importing it."""
    with open(module_file(module), encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def _later(module: str, name: str):
    """The callable `module.name`, imported when the command runs."""
    def run(args):
        return getattr(importlib.import_module(module), name)(args)
    run.__qualname__ = f"{module}.{name}"
    return run


def vocab_size(low: int, why: str):
    """An argparse type: a vocabulary size from `low` up to MAX_VOCAB_SIZE (the DIET paper's multilingual
    120,000)."""
    at_least = V.int_at_least(low, why)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > MAX_VOCAB_SIZE:
            raise argparse.ArgumentTypeError(f"{text} is too large (must be <= {MAX_VOCAB_SIZE:,}, the DIET paper's "
                                             f"multilingual vocabulary)")
        return value
    parse.__name__ = f"vocabulary size {low}..{MAX_VOCAB_SIZE}"
    return parse


def hidden_alias(parser, *names: str, dest: str, **kwargs) -> None:
    """Old spellings of an option (`--learning-rate` for `--lr`): accepted, not listed in --help."""
    parser.add_argument(*names, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


# -- runtime ---------------------------------------------------------------------------------------------
def add_threads_option(p, default: int | None = None) -> None:
    said = "torch's choice" if default is None else default
    p.add_argument("--threads", type=V.positive_int, default=default,
                   help=f"CPU threads per process (default: {said}); 1 is much faster for small models "
                        "on a busy machine, where more threads than free cores stall each other")


PRECISIONS = ("fp32", "bf16", "fp16")
#: torch.compile's modes (inductor), and backends that make no code (a check without a C++ compiler)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_BACKENDS = ("aot_eager", "eager")


def add_compile_option(p, text: str | None = None) -> None:
    p.add_argument("--compile", choices=COMPILE_MODES + COMPILE_BACKENDS, default=None, metavar="MODE",
                   help=text or "train the model compiled: torch.compile's mode (default, reduce-overhead for CUDA "
                                "graphs, max-autotune, max-autotune-no-cudagraphs), or the backends aot_eager and "
                                "eager, which make no code (without it: eager PyTorch). Hugging Face's Trainer "
                                "compiles it (TrainingArguments.torch_compile); a compiled run's bits may differ "
                                "from an eager one's, so a run resumes only with the same choice")


def add_device_options(p, *, training: bool = True, deterministic_default: bool = False) -> None:
    """`--device` on every command that runs a model; `--precision` and `--deterministic` on training ones."""
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="where the model runs (default: cuda if available, else cpu)")
    if training:
        add_precision_option(p)
        p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=deterministic_default,
                       help="deterministic algorithms on CUDA (torch.use_deterministic_algorithms, a fixed cuBLAS "
                            "workspace): same bits on the same GPU and software, slower; CPU runs are always so")


def add_precision_option(p) -> None:
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32 (TF32 matmuls allowed on CUDA), or bf16 / fp16 mixed precision (fp16 needs CUDA; "
                        "bf16 also runs on the CPU)")


# -- pretrain --------------------------------------------------------------------------------------------
def add_pretrain_options(p: argparse.ArgumentParser, recipe_default: str = "cpu") -> None:
    """Options shared by `dietpe pretrain` and `dietpe compare`; unset ones come from the recipe."""
    g = p.add_argument_group("pre-training")
    g.add_argument("--recipe", choices=sorted(PRETRAIN_RECIPES), default=recipe_default,
                   help="hyper-parameter preset: 'paper' is DIET Table 7 (500k steps, batch 4096, lr 0.0018, LAMB, "
                        "512-row tables); 'tupe' TUPE appendix B (1M steps, batch 256, length 512, Adam lr 1e-4); "
                        "every field in docs/recipes.md; "
                        "'cpu' a CPU-session budget; 'toy' the built-in comparison; 'init' continued "
                        "pre-training of a checkpoint (default: 'cpu', 'init' with --init; compare: 'study' on its "
                        "built-in data, else 'cpu')")
    g.add_argument("--size", choices=sorted(SIZES), help="model size preset (default: the recipe's)")
    g.add_argument("--tokenizer", help="an existing tokenizer (directory or tokenizer.json); default: train "
                                       "one on the corpus (--tokenizer-type)")
    g.add_argument("--vocab-size", type=vocab_size(6, ": 5 special tokens and a word"),
                   help="vocabulary size when training a tokenizer (default: the recipe's)")
    g.add_argument("--max-length", type=V.int_at_least(3, ": [CLS], a token and [SEP]"),
                   help="block length in tokens ([CLS] and [SEP] included)")
    g.add_argument("--steps", type=V.positive_int, help="optimizer steps")
    g.add_argument("--batch-size", type=V.positive_int, help="global batch (all processes, after accumulation)")
    g.add_argument("--device-batch-size", type=V.positive_int, default=64,
                   help="largest batch one process computes at once; the rest is gradient accumulation")
    g.add_argument("--lr", type=V.positive_float, help="peak learning rate")
    g.add_argument("--warmup", type=V.fraction, help="warm-up fraction of the steps, in [0, 1)")
    g.add_argument("--save-steps", type=V.positive_int, help="checkpoint interval in steps")
    g.add_argument("--keep-steps", type=_steps,
                   help="comma-separated steps whose model is kept in OUTPUT/steps/step-N (a model folder that "
                        "`dietpe finetune` takes: TUPE Fig. 5's convergence study); '' keeps none (default: the "
                        "recipe's, 'tupe': 10%%, 30%%, 60%% of the steps)")
    g.add_argument("--max-positions", type=V.positive_int,
                   help="rows of the position tables (max_position_embeddings), at least --max-length (default: "
                        "the recipe's, 512 in 'paper' and 'tupe', else --max-length)")
    g.add_argument("--optimizer", choices=("adamw", "lamb"),
                   help="pre-training optimizer (default: the recipe's; LAMB in 'paper', AdamW elsewhere)")
    g.add_argument("--max-documents", type=V.positive_int, help="use only the first N documents of the corpus")
    g.add_argument("--max-validation", type=V.positive_int,
                   help="score validation MLM loss on the first N validation blocks only (faster evaluations)")
    g.add_argument("--seed", type=V.seed, default=0, help="seed of initialisation and data order")
    add_data_options(g)
    g.add_argument("--ignore-memory-check", action="store_true",
                   help="train even when the estimated memory of the model and a device batch exceeds what this "
                        "machine has available (checked before any work)")
    g.add_argument("--logit-lr-scale", type=V.positive_float,
                   help="learning rate of the position and segment parameters added to the attention logits "
                        "(DIET-REL's R, T5's buckets, DIET-ABS's P_Q/P_K, per-head segments) relative to --lr, "
                        "for every method alike, on top of their stored scale (DietConfig.logit_scale) (default: "
                        "the recipe's, 1 in every recipe; docs/parametrization.md)")


def add_data_options(g) -> None:
    """Where and how the corpus is prepared into shards (`dietpe prepare`, `pretrain`, `compare`)."""
    g.add_argument("--cache-dir", help="where prepared corpora (tokenizers and token shards) are kept and reused "
                                       "(default: $XDG_CACHE_HOME/dietpe or ~/.cache/dietpe)")
    g.add_argument("--packing", choices=PACKINGS, default="full-sentences",
                   help="full-sentences: the papers' rule (RoBERTa), documents run on in a block after [SEP]; "
                        "documents: several documents per block, positions restarting and attention kept "
                        "inside each document")
    g.add_argument("--tokenizer-sample", type=V.positive_int, metavar="N",
                   help="train the tokenizer on the first N training documents only (very large corpora)")
    g.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES,
                   help="the tokenizer trained on the corpus: wordpiece (BERT's), unigram (SentencePiece's, the "
                        "DIET paper's multilingual one) or bpe (default: the recipe's, wordpiece except "
                        "paper-multilingual and xtreme)")
    g.add_argument("--special-tokens", metavar="ROLE=NAME,...",
                   help="names of the trained tokenizer's special tokens by role (pad, unk, cls, sep, mask, bos, "
                        "eos), e.g. cls=<s>,sep=</s> (default: [PAD] [UNK] [CLS] [SEP] [MASK] for wordpiece, "
                        "<pad> <unk> <s> </s> <mask> otherwise)")
    g.add_argument("--languages", metavar="L1,L2,...",
                   help="a multilingual corpus: the corpus is a template holding {lang} (a file, folder or "
                        "Hugging Face name, e.g. wikimedia/wikipedia:20231101.{lang}) or a folder of <lang>.txt "
                        "files; languages are sampled by the exponent rule (--language-alpha)")
    g.add_argument("--language-alpha", type=V.positive_float, metavar="ALPHA",
                   help="with --languages: sample language i with probability proportional to p_i^ALPHA, p_i its "
                        "share of the sentences (default 0.5, XLM's, which the DIET paper follows; mBERT 0.7, "
                        "XLM-R 0.3; 1 keeps the shares)")


def _steps(text: str) -> tuple[int, ...]:
    """--keep-steps: comma-separated positive step numbers, or '' for none."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of steps (e.g. 100000,300000)")
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: steps must be positive")
    return values


def register_pretrain(subparsers) -> None:
    p = subparsers.add_parser("pretrain", help="masked-LM pre-training (DIET appendix A)",
                              description=_doc("dietpe.tasks.pretrain"),
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("corpus", help="text file(s) directory (train.txt, valid.txt), a .txt/.jsonl/.tsv file, or a "
                                  "Hugging Face dataset name such as wikitext:wikitext-2-raw-v1")
    p.add_argument("--validation", help="validation corpus (default: the corpus's valid file, else 5%% of the "
                                        "documents held out)")
    p.add_argument("--method", default="absolute",
                   help="position method spec, e.g. absolute, diet-rel, diet-rel:segment=input:sharing=layer")
    p.add_argument("-o", "--output-dir", default="runs/pretrain", help="where checkpoints and the model go")
    p.add_argument("--overwrite", action="store_true", help="start afresh instead of resuming")
    p.add_argument("--init", help="continue pre-training a BERT checkpoint (folder or hub name, safetensors): its "
                                  "content weights and sizes, the method's position parameters fresh, BERT's input "
                                  "positions kept for 'absolute', and beside a per-head method unless the spec says "
                                  "input_positions=false (e.g. diet-rel:input_positions=false drops them); the "
                                  "'init' recipe unless --recipe; its tokenizer unless --tokenizer; the log "
                                  "lists what was loaded, initialised and dropped, and what that means")
    add_pretrain_options(p, recipe_default=None)  # `cpu`, or `init` with --init (recipe_name)
    add_threads_option(p)
    add_device_options(p)
    add_compile_option(p)
    p.set_defaults(func=_later("dietpe.tasks.pretrain", "main"))


# -- prepare ---------------------------------------------------------------------------------------------
def register_prepare(subparsers) -> None:
    p = subparsers.add_parser("prepare", help="prepare a corpus once into token shards (reused by pretrain, "
                                              "compare, lm)", description=_doc("dietpe.tasks.prepare"))
    p.add_argument("corpus", help="text file(s) directory (train.txt, valid.txt), a .txt/.jsonl/.tsv file, or a "
                                  "Hugging Face dataset name (streamed), such as wikitext:wikitext-2-raw-v1")
    p.add_argument("--validation", help="validation corpus (default: the corpus's valid file, else 5%% of the "
                                        "documents held out)")
    p.add_argument("--recipe", choices=sorted(PRETRAIN_RECIPES), default="cpu",
                   help="the pre-training recipe whose vocabulary size and block length are the defaults")
    p.add_argument("--tokenizer", help="an existing tokenizer (directory or tokenizer.json); default: train "
                                       "one on the corpus (--tokenizer-type)")
    p.add_argument("--vocab-size", type=vocab_size(6, ": 5 special tokens and a word"),
                   help="vocabulary size when training a tokenizer (default: the recipe's)")
    p.add_argument("--max-length", type=V.int_at_least(3, ": [CLS], a token and [SEP]"),
                   help="block length in tokens (default: the recipe's)")
    p.add_argument("--max-documents", type=V.positive_int, help="use only the first N documents of the corpus")
    p.add_argument("--processes", type=V.at_most_cores, help="worker processes, at most the cores (default: the "
                                                              "cores, at most 8)")
    add_data_options(p)
    p.set_defaults(func=_later("dietpe.tasks.prepare", "main"))


# -- finetune --------------------------------------------------------------------------------------------
DOC_STRIDE = 64  # QA context windows' overlap unless --doc-stride


def add_finetune_options(p: argparse.ArgumentParser, recipe_default: str = "cpu") -> None:
    g = p.add_argument_group("fine-tuning")
    g.add_argument("--ft-recipe", choices=sorted(FINETUNE_RECIPES), default=recipe_default,
                   help="'paper' is DIET Table 7 (lr {1,2,3,4}e-5 x 5 seeds, 10 epochs (5 for MNLI, QQP, QNLI), "
                        "batch 32, warm-up 0.1)")
    g.add_argument("--lrs", help="comma-separated learning rates (default: the recipe's grid)")
    g.add_argument("--seeds", type=V.positive_int,
                   help="runs per learning rate (seeds 0..N-1); the median is reported")
    g.add_argument("--epochs", type=V.positive_float, help="training epochs per run")
    g.add_argument("--ft-batch-size", type=V.positive_int, help="global fine-tuning batch")
    g.add_argument("--ft-max-length", type=V.int_at_least(5, ": [CLS] A [SEP] B [SEP]"),
                   help="maximum tokens per example (pairs: both segments)")
    g.add_argument("--eval-steps", type=V.positive_int, help="evaluate every N steps instead of every epoch")
    g.add_argument("--max-train", type=V.positive_int, help="use only the first N training examples")
    g.add_argument("--max-eval", type=V.positive_int, help="use only the first N examples of each evaluation set")
    g.add_argument("--doc-stride", type=V.non_negative_int,
                   help=f"QA only: overlap of context windows, in tokens (Hugging Face's `stride`, not BERT's "
                        f"run_squad distance between window starts); less than the room the question leaves "
                        f"(default: the recipe's windows, else an overlap of {DOC_STRIDE})")


def register_finetune(subparsers) -> None:
    p = subparsers.add_parser("finetune", help="fine-tune a pre-trained model on GLUE/XNLI/QA (lr grid x seeds)",
                              description=_doc("dietpe.tasks.finetune"),
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", help="a pre-trained model directory, or a `dietpe pretrain` run folder (its model/ is "
                                 "used)")
    p.add_argument("task", help="a task directory in its official layout (e.g. glue/CoLA, xnli, xquad) or a "
                                "Hugging Face name such as nyu-mll/glue:cola")
    p.add_argument("--task-name", dest="task_type",
                   help="which task the data is (cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli, xnli, qa, "
                        "order, pair-order, topic, tsv); default: from the directory name")
    p.add_argument("--train-file", help="training file, overriding the directory layout (e.g. MNLI's "
                                        "train.tsv for XNLI, SQuAD's train-v1.1.json for XQuAD)")
    p.add_argument("--eval-files", nargs="+", help="evaluation files, overriding the directory layout")
    p.add_argument("--train-split", help="file prefix of the training split in the task's directory (XNLI: dev) "
                                         "(default: train)")
    p.add_argument("--eval-split", help="file prefix of the evaluation split in the task's directory (XNLI: test) "
                                        "(default: dev)")
    p.add_argument("--train-language", help="XNLI and QA: the language fine-tuned on, and the checkpoint chosen "
                                            "on (default: en)")
    p.add_argument("-o", "--output-dir", default="runs/finetune",
                   help="where each run's result.json and fine-tuned model (LR-SEED/model) go")
    p.add_argument("--no-save-model", dest="save_model", action="store_false",
                   help="keep no fine-tuned model, only the scores (each run's model at its last step is kept "
                        "otherwise, loadable with from_pretrained)")
    add_finetune_options(p)
    add_threads_option(p)
    add_device_options(p)
    add_compile_option(p)
    p.set_defaults(func=_later("dietpe.tasks.finetune", "main"))


# -- compare ---------------------------------------------------------------------------------------------
BUILTIN_TASKS = ("order", "pair-order", "topic", "distance", "start")


BUILTIN_SIZE = 1000


def register_compare(subparsers) -> None:
    p = subparsers.add_parser("compare", help="pre-train and fine-tune every position method; write a report",
                              description=_doc("dietpe.tasks.compare"),
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--corpus", help="pre-training corpus (directory, file or Hugging Face name); default: the "
                                    "built-in generated corpus")
    p.add_argument("--tasks", nargs="+", metavar="PATH[=TASK]",
                   help="fine-tuning tasks, each a directory in its official layout (glue/CoLA, xnli, xquad), "
                        "optionally =task-name; default: the built-in tasks " + ", ".join(BUILTIN_TASKS))
    p.add_argument("--methods", help="comma-separated method specs or named lists: the papers' tables (papers, "
                                     "table5, table8, table9, tupe, linformer; docs/recipes.md), study, "
                                     "study+papers, papers+none, registry, gpu-hour; default: study on built-in "
                                     "data (study+papers with --budget 2 or more), papers otherwise")
    p.add_argument("-o", "--output-dir", default="diet-compare", help="where runs and the report go")
    p.add_argument("--train-split", help="file prefix of training splits (XNLI: dev) (default: train)")
    p.add_argument("--eval-split", help="file prefix of evaluation splits (XNLI: test) (default: dev)")
    p.add_argument("--train-language", help="cross-lingual tasks: the language fine-tuned on (default: en)")
    p.add_argument("--builtin-size", type=V.positive_int,
                   help=f"training examples per built-in task (default: {BUILTIN_SIZE})")
    p.add_argument("--pretrain-seeds", type=V.positive_int,
                   help="pre-training seeds per method (--seed, --seed+1, ...); intervals need 2 or more "
                        "(default: 3, 5 with --budget 3 or more)")
    p.add_argument("--budget", type=V.positive_int, default=1,
                   help="scale the study for more time: pre-training steps x N (unless --steps); from N = 2 the "
                        "papers' other rows and fine-tuning protocol (lr grid, median of 3 fine-tuning seeds: "
                        "--ft-recipe study-full), 5 pre-training seeds from N = 3")
    p.add_argument("--plan", choices=sorted(STUDY_PLANS),
                   help="a study sized for a machine on your --corpus and --tasks: 'gpu-hour' is one H100-class GPU "
                        "for about an hour (bert-small, 4 methods x 3 seeds, lr grid x median of 3 fine-tuning "
                        "seeds, 2 epochs; docs/recipes.md); options given here win")
    add_pretrain_options(p, recipe_default=None)
    add_finetune_options(p, recipe_default=None)
    add_threads_option(p, default=1)
    add_device_options(p, deterministic_default=True)  # the study's runs are the same bits on CUDA too
    p.add_argument("--jobs", type=V.positive_int, help="runs trained side by side, one process each (default: CPU "
                                                       "cores / threads, e.g. 2 on 2 cores)")
    x = p.add_argument_group("cross-lingual suite")
    x.add_argument("--suite", choices=("glue", "xtreme"), default="glue",
                   help="glue: the English study; xtreme: pre-train on a multilingual corpus, fine-tune on English "
                        "and evaluate zero-shot in every language of XNLI, XQuAD, MLQA, TyDiQA-GoldP (DIET Tables "
                        "3 and 5; docs/xtreme.md); its --tasks are xnli, xquad, mlqa, tydiqa, each "
                        "TASK[=EVAL][@TRAIN]; without --corpus and --tasks the built-in suite on XNLI and XQuAD")
    x.add_argument("--data-dir", help="--suite xtreme's built-in data: a folder holding xnli/ and xquad/ (default: "
                                      "$DIETPE_DATA, else shared/data in or above the working directory)")
    p.set_defaults(func=_compare_suite)


def _compare_suite(args):
    """`dietpe compare`: the English study (`dietpe.tasks.compare`) or, with --suite xtreme, the cross-lingual
    one (`dietpe.tasks.xtreme`), imported when it runs."""
    module = "dietpe.tasks.xtreme" if getattr(args, "suite", "glue") == "xtreme" else "dietpe.tasks.compare"
    return importlib.import_module(module).main(args)


# -- translate -------------------------------------------------------------------------------------------
def register_translate(subparsers) -> None:
    parser = subparsers.add_parser("translate", help="train and evaluate encoder-decoder translation models",
                                   description=_doc("dietpe.tasks.translate"))
    sub = parser.add_subparsers(dest="translate_command", metavar="{prepare,train,eval}")
    parser.set_defaults(func=lambda a: (parser.print_help(), 2)[1])

    _translate_prepare(sub)
    _translate_train(sub)
    _translate_eval(sub)


def _translate_prepare(sub) -> None:
    w = sub.add_parser("prepare", help="parallel text (WMT by Hugging Face name, local files, or the built-in "
                                       "Multi30k) into the folder `translate train --data` reads",
                       description=_doc("dietpe.tasks.wmt"))
    w.add_argument("-o", "--output-dir", required=True, help="the folder: train.L1/L2, valid.*, test.*, prepare.json")
    w.add_argument("--pair", help="language pair L1-L2 of --dataset or the local files, e.g. de-en, cs-en")
    w.add_argument("--dataset", help="a Hugging Face translation dataset, e.g. wmt/wmt18 (its train, validation = "
                                     "newstest2017 and test = newstest2018 splits; needs a network)")
    for split, what in (("train", "training"), ("valid", "validation"), ("test", "test")):
        w.add_argument(f"--{split}", nargs=2, action="append", metavar=("SRC", "TGT"),
                       help=f"{what} files, line-aligned text or WMT SGML (.sgm); "
                            + ("repeat to concatenate corpora (Europarl v7, Common Crawl, News Commentary v13)"
                               if split == "train" else "repeatable"))
    w.add_argument("--max-train-pairs", type=V.positive_int, help="keep only the first N training pairs")
    w.add_argument("--data-dir", help="without --dataset or files: the folder holding multi30k/ (default: "
                                      "$DIETPE_DATA, else shared/data in or above the working directory)")
    w.set_defaults(func=_later("dietpe.tasks.wmt", "main"))


def _translate_train(sub) -> None:
    t = sub.add_parser("train", help="train a translation model on line-aligned parallel files")
    t.add_argument("--data", help="directory with train.L1/train.L2 and val.L1/val.L2 (or valid./dev.)")
    t.add_argument("--source", help="source language code (file suffix), with --data")
    t.add_argument("--target", help="target language code (file suffix), with --data")
    for name in ("train-source", "train-target", "valid-source", "valid-target"):
        t.add_argument(f"--{name}", help="explicit file instead of --data")
    t.add_argument("-o", "--output-dir", required=True, help="run directory: tokenizer/, checkpoints, final/")
    t.add_argument("--overwrite", action="store_true", help="start afresh instead of resuming")
    t.add_argument("--method", default="sinusoidal",
                   help="position method spec, as for dietpe pretrain, with DietSeq2SeqConfig fields: e.g. t5, "
                        "shaw:shaw_max_distance=16, diet-rel:num_decoder_layers=4:hidden_size=256")
    t.add_argument("--recipe", choices=sorted(TRANSLATION_RECIPES), default="cpu",
                   help="what the options below take when not given: 'cpu' small CPU runs; 'paper' the DIET paper's "
                        "(appendix A, after Vaswani et al. in tensor2tensor): transformer-base, 250k steps, "
                        "batches of 4096 tokens x 8 accumulated, warm-up 4000 to lr 7e-4, a 32k vocabulary, and "
                        "at eval beam 10 with GNMT's length penalty 0.6")
    t.add_argument("--size", dest="preset", choices=SEQ2SEQ_SIZES,
                   help="model size preset (transformer-base is the paper's; default: the recipe's)")
    hidden_alias(t, "--position", dest="method")
    hidden_alias(t, "--preset", dest="preset", choices=SEQ2SEQ_SIZES)
    t.add_argument("--vocab-size", type=vocab_size(5, ": 4 special tokens and a piece"),
                   help="joint BPE vocabulary size (default: the recipe's, 8000)")
    t.add_argument("--max-length", type=V.int_at_least(2, ": a token and </s>"),
                   help="longest source or target, tokens with </s> (default: the recipe's, 128)")
    t.add_argument("--bad-lines", choices=("skip", "error"), default="skip",
                   help="pairs with an empty side or over --max-length: skip and count (default) or stop")
    t.add_argument("--batch-size", type=V.positive_int,
                   help="sentence pairs per step (default: the recipe's, 64; 'paper' counts tokens)")
    t.add_argument("--batch-tokens", type=V.positive_int,
                   help="tokens per step instead, as tensor2tensor counts them: pairs of similar length grouped so "
                        "that the longest side times the pairs stays within N (padding included)")
    t.add_argument("--grad-accum", type=V.positive_int, help="gradient accumulation steps per update (default: "
                                                            "the recipe's)")
    t.add_argument("--lr", dest="learning_rate", metavar="LR", type=V.positive_float,
                   help="peak learning rate, reached at the end of warm-up (default: the recipe's, 1e-3)")
    hidden_alias(t, "--learning-rate", dest="learning_rate", type=V.positive_float)
    t.add_argument("--warmup-steps", type=V.non_negative_int, help="linear warm-up steps (default: the recipe's)")
    t.add_argument("--label-smoothing", type=V.fraction, help="label smoothing of the loss, in [0, 1) (default: 0.1)")
    t.add_argument("--dropout", type=V.fraction, default=None, help="hidden and attention dropout (preset: 0.1)")
    t.add_argument("--max-grad-norm", type=V.non_negative_float, default=None,
                   help="gradient clipping norm, 0: off (default: the recipe's, 1.0; 'paper' 0, as tensor2tensor)")
    t.add_argument("--epochs", type=V.positive_int, help="passes over the training pairs (default: the recipe's, 10)")
    t.add_argument("--max-steps", type=V.positive_int, default=None,
                   help="optimizer steps; overrides --epochs (default: the recipe's, 'paper' 250k)")
    t.add_argument("--eval-steps", type=V.positive_int, default=500, help="validation loss every N steps")
    t.add_argument("--save-steps", type=V.positive_int, default=500, help="checkpoint every N steps")
    t.add_argument("--save-total-limit", default=2, help="checkpoints kept (at least 2)",
                   type=V.int_at_least(2, ": the Trainer deletes the older before the newer is marked complete"))
    t.add_argument("--logging-steps", type=V.positive_int, default=50,
                   help="log the loss every N steps (one that divides --save-steps logs a resumed run as an "
                        "uninterrupted one)")
    t.add_argument("--max-train-pairs", type=V.positive_int, default=None, help="use only the first N training pairs")
    t.add_argument("--max-valid-pairs", type=V.positive_int, default=None, help="use only the first N validation pairs")
    t.add_argument("--seed", type=V.seed, default=1, help="seed of initialisation and data order")
    t.add_argument("--threads", type=V.positive_int, default=None, help="torch CPU threads")
    add_device_options(t)
    add_compile_option(t)
    t.set_defaults(func=_later("dietpe.tasks.translate", "train_main"))


def _translate_eval(sub) -> None:
    e = sub.add_parser("eval", help="beam-search translation and SacreBLEU")
    e.add_argument("model", help="a run directory (uses final/ or the newest checkpoint) or a model directory")
    e.add_argument("--source", required=True, help="source sentences, one per line")
    e.add_argument("--reference", help="reference translations, line-aligned; gives BLEU")
    e.add_argument("--output", help="detokenised translations (default: MODEL/translations.SOURCE)")
    e.add_argument("--report", help="JSON report (default: OUTPUT.json)")
    e.add_argument("--beams", type=V.positive_int, help="beam width (default: the training recipe's, 10)")
    e.add_argument("--length-penalty", type=V.finite_float,
                   help="alpha of the length penalty (default: the training recipe's, 0.6)")
    e.add_argument("--length-penalty-form", choices=("hf", "gnmt"),
                   help="hf: log P / |Y|^alpha (transformers'); gnmt: log P / ((5 + |Y|) / 6)^alpha (GNMT's, "
                        "tensor2tensor's, the paper's) (default: the training recipe's, gnmt for 'paper')")
    e.add_argument("--batch-size", type=V.positive_int, default=32, help="sentences per generate() call")
    e.add_argument("--max-new-tokens", type=V.positive_int, default=None, help="default: 1.5 x source length + 10")
    e.add_argument("--limit", type=V.positive_int, default=None, help="translate only the first N lines (a fixed subset)")
    e.add_argument("--no-cache", action="store_true", help="rerun the whole prefix at every step")
    e.add_argument("--speed", action="store_true",
                   help="decode every batch with and without the cache, interleaved; report both speeds")
    e.add_argument("--threads", type=V.positive_int, default=None, help="torch CPU threads")
    add_device_options(e, training=False)
    e.set_defaults(func=_later("dietpe.tasks.translate", "run_eval"))


# -- lm --------------------------------------------------------------------------------------------------
#: `dietpe lm --methods`' name for every registered method a causal LM takes (read from the registry when the
#: command runs: the parsers import no torch)
ALL_CAUSAL = "all"


ARCHS = ("diet", "llama")


# ------------------------------------------------------------------------------------------------ commands
def _multiples(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers (e.g. 1,2,4,8)")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: multiples of the training length must be >= 1")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r}: a multiple is given twice")
    return values


def register_lm(subparsers) -> None:
    p = subparsers.add_parser("lm", help="causal LMs per position method, then length generalisation",
                              description=_doc("dietpe.tasks.lm"),
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("corpus", help="text corpus (directory with train.txt/valid.txt, a file, or a HF dataset name)")
    p.add_argument("--methods", default=ALL_CAUSAL,
                   help=f"comma-separated method specs; '{ALL_CAUSAL}' is every registered method a causal LM takes")
    p.add_argument("-o", "--output-dir", default="runs/lm", help="where each method's run and the table go")
    p.add_argument("--size", default="toy", choices=sorted(LM_SIZES), help="model size preset")
    p.add_argument("--arch", default="diet", choices=ARCHS,
                   help="diet's causal LM, or transformers' Llama (pre-norm, RMSNorm, SwiGLU) with the method "
                        "attached in place of RoPE (dietpe.attach)")
    p.add_argument("--vocab-size", type=V.int_at_least(6, ": 5 special tokens and a word"), default=4000,
                   help="vocabulary size of the tokenizer trained on the corpus")
    p.add_argument("--max-length", type=V.int_at_least(2, ": a token and the next"), default=64,
                   help="training length L")
    p.add_argument("--steps", type=V.positive_int, default=300, help="optimizer steps per method")
    p.add_argument("--batch-size", type=V.positive_int, default=16, help="sequences per step")
    p.add_argument("--lr", type=V.positive_float, default=2e-3, help="peak learning rate")
    p.add_argument("--seed", type=V.seed, default=0, help="seed of initialisation and data order")
    p.add_argument("--max-documents", type=V.positive_int, help="use only the first N training documents")
    p.add_argument("--lengths", type=_multiples, default=(1, 2, 4, 8), help="multiples of L to evaluate at")
    p.add_argument("--eval-tokens", type=V.positive_int, help="held-out tokens scored at every length "
                                                               "(default: 8 windows of the longest)")
    p.add_argument("--threads", type=V.positive_int, default=1, help="CPU threads")
    p.add_argument("--ignore-memory-check", action="store_true",
                   help="train and score even when the estimated memory of a step, or of scoring the longest "
                        "length, exceeds what this machine has available (checked before any work)")
    add_device_options(p)
    add_compile_option(p, "train each model compiled: torch.compile's mode (default, reduce-overhead for CUDA "
                          "graphs, max-autotune, max-autotune-no-cudagraphs), or the backends aot_eager and eager, "
                          "which make no code (without it: eager PyTorch); the perplexities are read uncompiled")
    p.add_argument("--cache-dir", help="where prepared corpora are kept and reused, shared with `dietpe prepare` and "
                                       "`pretrain` (default: $XDG_CACHE_HOME/dietpe or ~/.cache/dietpe)")
    p.set_defaults(func=_later("dietpe.tasks.lm", "main_lm"))

    q = subparsers.add_parser("lengths", help="perplexity at 1, 2, 4, 8 times the training length",
                              description="Perplexity of trained models at multiples of their training length.",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    q.add_argument("runs", nargs="+", help="run folders of `dietpe lm` (one per method) or `dietpe pretrain`, or "
                                           "their model folders")
    q.add_argument("--data", required=True, help="held-out text (a file, a corpus directory's valid split)")
    q.add_argument("--train-length", type=V.positive_int, help="L, when a run does not record it")
    q.add_argument("--lengths", type=_multiples, default=(1, 2, 4, 8), help="multiples of L to evaluate at")
    q.add_argument("--eval-tokens", type=V.positive_int, help="held-out tokens scored at every length "
                                                               "(default: 8 windows of the longest)")
    q.add_argument("-o", "--output-dir", default="lengths", help="where the table and JSON go")
    q.add_argument("--threads", type=V.positive_int, default=1, help="CPU threads")
    q.add_argument("--ignore-memory-check", action="store_true",
                   help="score even when the estimated memory of scoring the longest length exceeds what this "
                        "machine has available (checked before any work)")
    add_device_options(q, training=False)
    q.set_defaults(func=_later("dietpe.tasks.lengths", "main"))


# -- bench -----------------------------------------------------------------------------------------------
def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must list positive integers")
    return values


def _distinct_ints(text: str) -> list[int]:
    values = _ints(text)
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"{text!r} lists a length more than once")
    return values


def register_bench(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time and memory of every position method against `none`",
                              description=_doc("dietpe.bench.cli"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", type=V.names, default=["bert-small", "bert-base"],
                   help="model presets, or lm-<preset> for the causal LM at its sizes (default: "
                        "bert-small,bert-base)")
    p.add_argument("--lengths", type=_distinct_ints, default=[128, 512],
                   help="sequence lengths (default: 128,512)")
    p.add_argument("--batch", type=_ints, default=None,
                   help="batch size, one for all lengths or one per length (default: 8 at 128, 2 at 512, "
                        "so 1,024 tokens per step; elsewhere max(1, 1024 // length))")
    p.add_argument("--methods", type=V.names, default=None,
                   help="position methods, `+seg` for per-head segments, else input segments (default: all, with "
                        "diet-abs+seg and diet-rel+seg); `none` is always added as the baseline")
    p.add_argument("--backends", type=V.names, default=["auto"],
                   help="attention backends to run each method on, e.g. fused,sdpa,flex (default: auto); each "
                        "row is method@backend, and `none` stays on sdpa (flash on a GPU); a method named with "
                        "its own (rotary@auto) runs on that one only; a method a backend refuses is left out "
                        "with a log line")
    p.add_argument("--attention-dropout", type=float, default=None,
                   help="attention_probs_dropout_prob of every model (default: the preset's 0.1; flex has "
                        "no dropout: give 0 to time it)")
    p.add_argument("--modes", type=V.names, default=["train", "infer"], help="train, infer or both")
    add_compile_option(p, "time every candidate (none and the peers too) as torch.compile(model, mode=MODE): "
                          "default, reduce-overhead (CUDA graphs), max-autotune, max-autotune-no-cudagraphs; or the "
                          "backends aot_eager and eager, which make no code (without it: eager PyTorch; peak memory "
                          "is always the eager step's)")
    p.add_argument("--repeats", type=V.positive_int, default=15, help="timed cycles (default: 15)")
    p.add_argument("--warmup", type=V.non_negative_int, default=2, help="untimed cycles first (default: 2)")
    p.add_argument("--threads", type=V.positive_int, default=2, help="torch intra-op threads (default: 2)")
    p.add_argument("--peers", action="store_true",
                   help="add Hugging Face BertModel (SDPA) and T5EncoderModel on the same shapes")
    p.add_argument("--no-memory", dest="memory", action="store_false",
                   help="skip peak memory (one fresh process per configuration)")
    p.add_argument("--long", action="store_true",
                   help="also: inference at --long-length tokens for the methods with no absolute table")
    p.add_argument("--long-length", type=V.positive_int, help="length for --long (default: 8192)")
    p.add_argument("--long-methods", type=V.names,
                   help="methods for --long (default: none,diet-rel,diet-rel+seg,t5,alibi,rotary)")
    p.add_argument("--json", default=None, help="also write the results as JSON to this path")
    p.add_argument("--markdown", default=None, help="also write the tables as Markdown to this path")
    p.add_argument("--params", action="store_true",
                   help="only count parameters: DIET Table 6 at bert-base with 512-row tables, beside the paper's "
                        "figures, for Table 6's rows and any --methods (specs or named lists, e.g. papers); no timing")
    add_device_options(p, training=False)
    add_precision_option(p)
    p.set_defaults(func=_later("dietpe.bench.cli", "run"))


# -- analysis --------------------------------------------------------------------------------------------
def register_analysis(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze", help="rank and attention pictures of a checkpoint (DIET Fig. 2, 4-8; TUPE Fig. 2, 6)",
        description=_doc("dietpe.analysis.cli"))
    p.add_argument("checkpoint", help="a save_pretrained directory, or a run directory: a pretrain run's model/ or a "
                                      "translate train run's final/ is analysed")
    p.add_argument("--data", required=True, help="text file (one paragraph per line) to sample the batch from")
    p.add_argument("-o", "--output-dir", dest="out", metavar="DIR",
                   help="output directory (default: the analysed model's analysis/, e.g. RUN/model/analysis)")
    hidden_alias(p, "--out", dest="out")
    p.add_argument("--tokenizer", help="tokenizer directory or tokenizer.json (default: the checkpoint's)")
    p.add_argument("--batch-size", type=V.positive_int, default=8, help="sequences in the sampled batch (default 8)")
    p.add_argument("--length", type=V.int_at_least(3, ": [CLS], a token and [SEP]"), default=None,
                   help="tokens per sequence, capped by the position table (default: the training length; a longer "
                        "one is analysed with a note saying so)")
    p.add_argument("--seed", type=V.seed, default=0, help="seed of the sampled batch (default 0)")
    p.add_argument("--rtol", type=V.open_fraction, default=None,
                   help="rank tolerance relative to the largest singular value (default max(M, N) · ε_float32)")
    p.add_argument("--title", help="title of the report (default: the position method)")
    add_device_options(p, training=False)
    p.set_defaults(func=_later("dietpe.analysis.cli", "run"))


# command -> the function adding its parser (`dietpe lm` adds `lengths` too)
REGISTER = {"pretrain": register_pretrain, "prepare": register_prepare, "finetune": register_finetune,
            "compare": register_compare, "translate": register_translate, "bench": register_bench,
            "analyze": register_analysis, "lm": register_lm, "lengths": register_lm}
