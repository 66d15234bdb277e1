"""The cross-lingual tasks of XTREME (Hu et al. 2020) that the DIET paper reports (Table 3): XNLI (accuracy),
XQuAD, MLQA and TyDiQA-GoldP (F1 / exact match), fine-tuned on English and evaluated zero-shot in every
language, read from local files or Hugging Face names, and the built-in data of `dietpe compare --suite xtreme`.

A task is given as `TASK[=EVAL][@TRAIN]`:

* `xnli`, `xquad`, `mlqa`, `tydiqa` alone: the Hugging Face datasets the XTREME papers used (`XTASKS`): XNLI's
  test sets, trained on MNLI's English training set (`facebook/xnli:en`, 393k pairs); the QA sets trained on
  SQuAD v1.1 (`rajpurkar/squad`);
* `=EVAL`: a local folder in its official layout (XNLI's `{split}-{lang}.tsv`; `xquad.{lang}.json`,
  MLQA's `{split}-context-{lang}-question-{lang}.json`, `tydiqa.goldp.{lang}.dev.json`), or a Hugging Face
  name template holding `{lang}` (e.g. `facebook/xnli:{lang}`);
* `@TRAIN`: the English training set, a local file (MNLI's `train.tsv`, SQuAD's `train-v1.1.json`) or a
  Hugging Face name (`nyu-mll/glue:mnli`, `rajpurkar/squad`).

The built-in data (`write_builtin`) comes from `xnli/` and `xquad/` of the shared data folder (`find_data_dir`).
Its XNLI test files carry no labels (XTREME's release hides them), so the labelled development set is split by
premise: two thirds of the premises (every premise whose index is not 2 mod 3), in English, are the training
set; the other third, in all 15 languages, is evaluated; the translations of a training premise are never
evaluated. XQuAD is split the same way by article (every sixth article evaluated, in 12 languages, the others
trained on in English). The pre-training corpus is text no evaluated example holds: the unlabelled XNLI test
sentences of the 15 languages and the contexts of XQuAD's training articles in its 12 languages.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from dietpe.data.corpus import is_hf_name, load_hf_dataset
from dietpe.data.tasks import MLQA, NLI_LABELS, SQUAD, XNLI, Example, TaskData, _qa_rows, load_task
from dietpe.data.text import read_text, write_text_atomic
from dietpe.errors import ConfigError, DataError

XNLI_LANGUAGES = ("en", "ar", "bg", "de", "el", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi", "zh")
XQUAD_LANGUAGES = ("en", "ar", "de", "el", "es", "hi", "ru", "th", "tr", "vi", "zh")  # XTREME's 11 (+ ro here)
MLQA_LANGUAGES = ("en", "ar", "de", "es", "hi", "vi", "zh")
TYDIQA_LANGUAGES = ("en", "ar", "bn", "fi", "id", "ko", "ru", "sw", "te")
TYDIQA_NAMES = {"arabic": "ar", "bengali": "bn", "english": "en", "finnish": "fi", "indonesian": "id",
                "korean": "ko", "russian": "ru", "swahili": "sw", "telugu": "te"}
HF_NLI_LABELS = ("entailment", "neutral", "contradiction")  # the label ids of XNLI and MNLI on the Hub
SQUAD_HF = "rajpurkar/squad"


@dataclass(frozen=True)
class XTask:
    """One XTREME task: its name in the tables, kind, languages, and where the Hub keeps it."""

    name: str
    kind: str               # classification | qa
    languages: tuple[str, ...]
    hf_eval: str            # a name template holding {lang} (TyDiQA: one set, languages from its ids)
    hf_eval_split: str
    hf_train: str
    hf_train_split: str = "train"
    local_eval_split: str = "test"  # the file prefix evaluated in a local folder of the official layout


XTASKS = {
    "xnli": XTask("XNLI", "classification", XNLI_LANGUAGES, "facebook/xnli:{lang}", "test", "facebook/xnli:en"),
    "xquad": XTask("XQuAD", "qa", XQUAD_LANGUAGES, "google/xquad:xquad.{lang}", "validation", SQUAD_HF),
    "mlqa": XTask("MLQA", "qa", MLQA_LANGUAGES, "facebook/mlqa:mlqa.{lang}.{lang}", "test", SQUAD_HF),
    "tydiqa": XTask("TyDiQA", "qa", TYDIQA_LANGUAGES, "google-research-datasets/tydiqa:secondary_task",
                    "validation", SQUAD_HF, local_eval_split="dev"),
}
ALIASES = {"tydiqa-goldp": "tydiqa", "tydi": "tydiqa"}


# -- the data folder -------------------------------------------------------------------------------------------

def find_data_dir(given: str | None, needed: tuple[str, ...] = ("xnli", "xquad"),
                  hint: str = "or give the tasks with --tasks") -> Path:
    """The shared data folder: `given` (--data-dir), else $DIETPE_DATA, else `data/` in the working directory,
    else `shared/data` in it or any folder above it (the layout the docs' `../shared/data` commands assume), else
    the same above the installed package (a source checkout beside the data)."""
    def complete(folder: Path) -> bool:
        return all((folder / n).is_dir() for n in needed)

    if given:
        folder = Path(given)
        missing = [n for n in needed if not (folder / n).is_dir()]
        if missing:
            raise DataError(f"{folder}: --data-dir lacks {', '.join(f'{n}/' for n in missing)} (the built-in "
                            f"suite reads XNLI's per-language TSVs and XQuAD's JSON files from there)")
        return folder
    tried = []
    if os.environ.get("DIETPE_DATA"):
        tried.append(Path(os.environ["DIETPE_DATA"]))
    here, package = Path.cwd().resolve(), Path(__file__).resolve().parent
    tried += [here / "data"] + [p / "shared" / "data" for p in (here, *here.parents)]
    tried += [p / "shared" / "data" for p in package.parents if p / "shared" / "data" not in tried]
    for folder in tried:
        if complete(folder):
            return folder
    raise DataError(f"no data folder with {' and '.join(f'{n}/' for n in needed)} found (looked in "
                    f"{', '.join(str(p) for p in tried[:4])}, ... and above the dietpe package); pass --data-dir "
                    f"DIR or set DIETPE_DATA, {hint}")


# -- the built-in data -----------------------------------------------------------------------------------------

def _xnli_rows(path: Path) -> list[list[str]]:
    rows = [line.split("\t") for line in read_text(path).split("\n") if line.strip()]
    return rows


def _write_json(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, ensure_ascii=False))


def write_builtin(data_dir: Path, out: Path) -> dict[str, Path]:
    """The built-in suite's files under `out`: `corpus/<lang>.txt`, `xnli/` and `xquad/` (see the module's
    docstring), from every language of `data_dir`'s `xnli/dev-<lang>.tsv` and `xquad/xquad.<lang>.json`; returns
    their paths."""
    xnli, xquad = data_dir / "xnli", data_dir / "xquad"
    xnli_languages = sorted(p.stem.split("-", 1)[1] for p in xnli.glob("dev-*.tsv"))
    xquad_languages = sorted(p.name.split(".")[1] for p in xquad.glob("xquad.*.json"))
    for folder, langs, layout in ((xnli, xnli_languages, "dev-<lang>.tsv"), (xquad, xquad_languages,
                                                                           "xquad.<lang>.json")):
        if "en" not in langs:
            raise DataError(f"{folder}: no English file ({layout.replace('<lang>', 'en')}), the language the suite "
                            f"fine-tunes on")
    corpus: dict[str, list[str]] = {}
    for lang in xnli_languages:
        # the files are line-aligned translations, three hypotheses per premise: premise k is rows 3k..3k+2
        dev = _xnli_rows(xnli / f"dev-{lang}.tsv")
        if len(dev) % 3 or any(dev[i][0] != dev[i - i % 3][0] for i in range(len(dev))):
            raise DataError(f"{xnli / f'dev-{lang}.tsv'}: expected three hypotheses per premise on consecutive "
                            f"lines (XNLI's layout)")
        if lang == "en":
            train = [r for i, r in enumerate(dev) if i // 3 % 3 != 2]
            write_text_atomic(out / "xnli" / "train-en.tsv", "".join("\t".join(r[:3]) + "\n" for r in train))
        held = [r for i, r in enumerate(dev) if i // 3 % 3 == 2]
        write_text_atomic(out / "xnli" / f"dev-{lang}.tsv", "".join("\t".join(r[:3]) + "\n" for r in held))
        docs, current = [], None
        for row in _xnli_rows(xnli / f"test-{lang}.tsv"):  # premise then its hypotheses: one document
            if row[0] != current:
                current = row[0]
                docs.append([row[0]])
            docs[-1].append(row[1])
        corpus[lang] = ["\n".join(d) for d in docs]
    for lang in xquad_languages:
        data = json.loads(read_text(xquad / f"xquad.{lang}.json"))
        articles = data["data"]
        if lang == "en":
            _write_json(out / "xquad" / "train-en.json",
                        dict(data=[a for k, a in enumerate(articles) if k % 6 != 5], version=data.get("version")))
        _write_json(out / "xquad" / f"xquad.{lang}.json",
                    dict(data=[a for k, a in enumerate(articles) if k % 6 == 5], version=data.get("version")))
        corpus.setdefault(lang, []).extend(p["context"].replace("\n", " ") for k, a in enumerate(articles)
                                           if k % 6 != 5 for p in a["paragraphs"])
    for lang, docs in corpus.items():
        write_text_atomic(out / "corpus" / f"{lang}.txt", "\n\n".join(docs) + "\n")
    return dict(corpus=out / "corpus", xnli=out / "xnli", xquad=out / "xquad",
                languages=tuple(sorted(corpus)))


# -- tasks by name, folder or Hugging Face name ----------------------------------------------------------------

@dataclass(frozen=True)
class TaskItem:
    """One `--tasks` item: `TASK[=EVAL][@TRAIN]`."""

    task: XTask
    key: str
    eval: str | None
    train: str | None

    @classmethod
    def parse(cls, text: str) -> TaskItem:
        head, _, train = text.partition("@")
        key, _, source = head.partition("=")
        key = ALIASES.get(key.strip().lower(), key.strip().lower())
        if key not in XTASKS:
            raise ConfigError(f"--tasks {text!r}: {key!r} is not one of {', '.join(XTASKS)} (TASK[=EVAL][@TRAIN], "
                              f"e.g. xnli, xquad=data/xquad@data/squad/train-v1.1.json)")
        return cls(XTASKS[key], key, source.strip() or None, train.strip() or None)


def load_item(item: TaskItem, train_split: str, eval_split: str, train_language: str,
              max_train: int | None) -> TaskData:
    """The task's English training set and its per-language evaluation sets."""
    t = item.task
    if item.eval and Path(item.eval).exists():
        train_file = item.train if item.train and Path(item.train).exists() else None
        hub_train = bool(item.train) and train_file is None  # EVAL=folder@TRAIN=a Hugging Face name
        data = load_task(item.eval, "qa" if t.kind == "qa" else "xnli", train_file=train_file,
                         train_split=train_split, eval_split=eval_split, train_language=train_language,
                         eval_only=hub_train)
        if hub_train:
            data.train = _hf_train(t, item.train)
    else:
        template = item.eval or t.hf_eval
        if item.eval and not is_hf_name(item.eval.replace("{lang}", "x")):
            raise DataError(f"{item.eval}: no such file or directory")
        evals = _hf_evals(t, template)
        data = TaskData(XNLI if t.kind == "classification" else SQUAD, _hf_train(t, item.train or t.hf_train),
                        evals, source=f"huggingface:{template}")
    if max_train is not None:
        data.train = data.train[:max_train]
    if t.name == "MLQA":
        data.spec = MLQA
    return data


def _hf_train(t: XTask, name: str) -> list:
    """The English training set: a local file (MNLI's `train.tsv` or an XNLI-layout TSV; SQuAD JSON), or a
    Hugging Face name."""
    if Path(name).is_file():
        from dietpe.data.tasks import GLUE, read_squad, read_tsv
        if t.kind == "qa":
            return read_squad(name)
        return read_tsv(name, GLUE["mnli"] if Path(name).name == "train.tsv" else XNLI)
    rows = load_hf_dataset(name, t.hf_train_split)
    return _nli_rows(rows, name) if t.kind == "classification" else _qa_rows(rows, name)


def _hf_evals(t: XTask, template: str) -> dict[str, list]:
    if t.kind == "qa" and "{lang}" not in template:  # TyDiQA-GoldP: one set, the language in each id
        by_lang: dict[str, list] = {}
        for ex in _qa_rows(load_hf_dataset(template, t.hf_eval_split), template):
            lang = TYDIQA_NAMES.get(ex.id.split("-", 1)[0])
            if lang:
                by_lang.setdefault(lang, []).append(ex)
        return dict(sorted(by_lang.items()))
    out = {}
    for lang in t.languages:
        name = template.replace("{lang}", lang)
        rows = load_hf_dataset(name, t.hf_eval_split)
        out[lang] = _nli_rows(rows, name) if t.kind == "classification" else _qa_rows(rows, name)
    return out


def _nli_rows(rows, name: str) -> list[Example]:
    """XNLI / MNLI rows of the Hub (premise, hypothesis, label 0 entailment 1 neutral 2 contradiction)."""
    columns = set(rows.column_names)
    if not {"premise", "hypothesis", "label"} <= columns:
        raise DataError(f"huggingface:{name}: expected premise, hypothesis and label columns, found {sorted(columns)}")
    ids = {label: i for i, label in enumerate(NLI_LABELS)}
    out = []
    for i, r in enumerate(rows):
        if not 0 <= r["label"] < len(HF_NLI_LABELS):
            continue  # MNLI's unlabelled rows (-1)
        out.append(Example(r["premise"], r["hypothesis"], ids[HF_NLI_LABELS[r["label"]]],
                           f"huggingface:{name} row {i}"))
    return out
