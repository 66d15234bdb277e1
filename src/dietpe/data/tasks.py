"""Fine-tuning tasks from their official file layouts: GLUE TSVs, XNLI per-language TSVs, SQuAD-v1.1 JSON.

GLUE (Wang et al. 2019) as `download_glue_data.py` writes it: CoLA without a header (label in column 1,
sentence in column 3), the other tasks with a header whose column names are used here. XNLI in XTREME's
per-language layout (Hu et al. 2020): `{split}-{lang}.tsv`, no header, `premise, hypothesis, label`.
SQuAD v1.1 JSON (Rajpurkar et al. 2016) for XQuAD, MLQA and TyDiQA-GoldP. Each task names its official
metrics (GLUE's: Matthews correlation for CoLA, Pearson/Spearman for STS-B, F1 and accuracy for MRPC and
QQP, accuracy elsewhere; F1/EM for span QA). The first metric selects the best checkpoint, unless the
fine-tuning recipe names another (the papers' recipes score QQP and MRPC by accuracy).

Every malformed line, unknown label or missing file is a `DataError` naming the file and line.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from dietpe.data.corpus import folder_listing, is_hf_name, load_hf_splits
from dietpe.data.synthetic import TASKS as BUILTIN
from dietpe.data.taskspec import TaskSpec
from dietpe.data.text import read_text
from dietpe.errors import DataError

NLI_LABELS = ("contradiction", "entailment", "neutral")
LABEL_ALIASES = {"contradictory": "contradiction"}  # XTREME's XNLI copies spell it both ways


GLUE: dict[str, TaskSpec] = {
    "cola": TaskSpec("CoLA", "classification", ("mcc",), ("0", "1"), text_a=3, label=1, header=False),
    "sst-2": TaskSpec("SST-2", "classification", ("accuracy",), ("0", "1")),
    "mrpc": TaskSpec("MRPC", "classification", ("f1", "accuracy"), ("0", "1"), text_a="#1 String",
                     text_b="#2 String", label="Quality"),
    "sts-b": TaskSpec("STS-B", "regression", ("pearson", "spearman"), text_a="sentence1", text_b="sentence2",
                      label="score", value_range=(0.0, 5.0)),
    "qqp": TaskSpec("QQP", "classification", ("f1", "accuracy"), ("0", "1"), text_a="question1",
                    text_b="question2", label="is_duplicate"),
    "mnli": TaskSpec("MNLI", "classification", ("accuracy",), NLI_LABELS, text_a="sentence1",
                     text_b="sentence2", label="gold_label", eval_files=("dev_matched.tsv", "dev_mismatched.tsv")),
    "qnli": TaskSpec("QNLI", "classification", ("accuracy",), ("entailment", "not_entailment"),
                     text_a="question", text_b="sentence"),
    "rte": TaskSpec("RTE", "classification", ("accuracy",), ("entailment", "not_entailment"),
                    text_a="sentence1", text_b="sentence2"),
    "wnli": TaskSpec("WNLI", "classification", ("accuracy",), ("0", "1"), text_a="sentence1",
                     text_b="sentence2"),
}
XNLI = TaskSpec("XNLI", "classification", ("accuracy",), NLI_LABELS, text_a=0, text_b=1, label=2, header=False)
SQUAD = TaskSpec("SQuAD", "qa", ("f1", "exact_match"))
MLQA = TaskSpec("MLQA", "qa", ("f1", "exact_match"))  # scored with MLQA's own normalisation (data.metrics)
ALIASES = {"sst2": "sst-2", "stsb": "sts-b", "sts": "sts-b", "mnli-m": "mnli"}


@dataclass
class Example:
    text_a: str
    text_b: str | None
    label: int | float
    where: str  # "file:line", for messages


@dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[dict]  # [{"text": str, "answer_start": int}]
    where: str


@dataclass
class TaskData:
    """A task's training examples and its evaluation sets by name (a split, or a language for XNLI/QA)."""

    spec: TaskSpec
    train: list = field(default_factory=list)
    evals: dict[str, list] = field(default_factory=dict)
    source: str = ""

    def fingerprint(self) -> str:
        """sha256 (16 hex digits) of every example's content, training and evaluation, in order: what a run
        read, whichever files or dataset it came from (the places in messages left out)."""
        digest = hashlib.sha256()
        for name, examples in (("train", self.train), *sorted(self.evals.items())):
            digest.update(name.encode())
            for ex in examples:
                fields = {k: v for k, v in vars(ex).items() if k != "where"}
                digest.update(json.dumps(fields, sort_keys=True, ensure_ascii=False).encode())
        return digest.hexdigest()[:16]

    def scored(self, max_eval: int | None) -> dict[str, list]:
        """The evaluation sets as fine-tuning scores them: each set's first `max_eval` examples (all when None
        or 0)."""
        return {name: examples[:max_eval] if max_eval else examples for name, examples in self.evals.items()}


# -- reading TSV ---------------------------------------------------------------------------------------------

def _column(spec_col: str | int, header: list[str] | None, path: Path) -> int:
    if isinstance(spec_col, int):
        return spec_col
    if spec_col not in header:
        raise DataError(f"{path}:1: the header lacks the column {spec_col!r} (has {header})")
    return header.index(spec_col)


def read_tsv(path: str | Path, spec: TaskSpec, with_labels: bool = True) -> list[Example]:
    """Examples of a GLUE/XNLI-style TSV; raises DataError naming file:line for anything malformed."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    lines = read_text(path).split("\n")  # DataError with file:line for invalid UTF-8; a BOM is dropped
    start, header = 0, None
    if spec.header:
        if not lines or not lines[0].strip():
            raise DataError(f"{path}:1: expected a header row")
        header, start = lines[0].rstrip("\r").split("\t"), 1
    ia = _column(spec.text_a, header, path)
    ib = _column(spec.text_b, header, path) if spec.text_b is not None else None
    il = _column(spec.label, header, path) if with_labels else None
    needed = max(i for i in (ia, ib, il) if i is not None) + 1
    label_ids = {name: i for i, name in enumerate(spec.labels)}
    examples = []
    # every row as wide as the header (or, without one, the first row): a tab inside a text shifts the cells
    width, widest = (len(header), "the header has") if header is not None else (None, "")
    for lineno, line in enumerate(lines[start:], start + 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        cells = line.split("\t")
        where = f"{path}:{lineno}"
        if len(cells) < needed:
            # the label column alone missing from a test file: XTREME's XNLI test files hide their labels
            hidden = " (a test file without labels? evaluate on the dev files: --eval-split dev)" \
                if il is not None and il == needed - 1 == len(cells) and path.name.startswith("test") else ""
            raise DataError(f"{where}: {len(cells)} tab-separated columns, {spec.name} needs at least "
                            f"{needed}{hidden}")
        if width is None:
            width, widest = len(cells), f"line {lineno} has"
        if len(cells) != width:
            raise DataError(f"{where}: {len(cells)} tab-separated columns where {widest} {width} (a tab inside a "
                            f"text?)")
        text_a = cells[ia].strip()
        text_b = cells[ib].strip() if ib is not None else None
        if not text_a or (ib is not None and not text_b):
            raise DataError(f"{where}: empty sentence")
        label: int | float = -1
        if il is not None:
            label = parse_label(cells[il].strip(), spec, label_ids, where)
        examples.append(Example(text_a, text_b, label, where))
    if not examples:
        raise DataError(f"{path}: no examples (the file is empty)")
    return examples


def parse_label(raw: str, spec: TaskSpec, label_ids: dict[str, int], where: str) -> int | float:
    if spec.kind == "regression":
        try:
            value = float(raw)
        except ValueError:
            raise DataError(f"{where}: label {raw!r} is not a number ({spec.name} is a regression task)") from None
        lo, hi = spec.value_range or (float("-inf"), float("inf"))
        if not lo <= value <= hi:
            raise DataError(f"{where}: label {value} lies outside {spec.name}'s range [{lo}, {hi}]")
        return value
    raw = LABEL_ALIASES.get(raw, raw)
    if raw not in label_ids:
        raise DataError(f"{where}: label {raw!r} is not one of {spec.name}'s labels {{{', '.join(spec.labels)}}}")
    return label_ids[raw]


# -- reading SQuAD JSON --------------------------------------------------------------------------------------

def read_squad(path: str | Path, require_answers: bool = True) -> list[QAExample]:
    """Questions of a SQuAD-v1.1 JSON file (`data[].paragraphs[].qas[]`)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        root = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(root, dict) or not isinstance(root.get("data"), list):
        raise DataError(f"{path}: expected SQuAD JSON, an object with a 'data' list, found {_kind(root)}"
                        + (f" with keys {sorted(root)[:6]}" if isinstance(root, dict) else ""))
    out, seen = [], {}
    for a, article in enumerate(root["data"]):
        _expect(article, dict, f"{path}: data[{a}]", "an object (an article with 'paragraphs')")
        paragraphs = _expect(article.get("paragraphs", []), list, f"{path}: data[{a}].paragraphs", "a list")
        for p, para in enumerate(paragraphs):
            where_p = f"{path}: data[{a}].paragraphs[{p}]"
            _expect(para, dict, where_p, "an object with 'context' and 'qas'")
            context = para.get("context")
            if not isinstance(context, str):
                raise DataError(f"{where_p}: no 'context' string")
            for q, qa in enumerate(_expect(para.get("qas", []), list, f"{where_p}.qas", "a list")):
                where = f"{where_p}.qas[{q}]"
                _expect(qa, dict, where, "an object with 'id', 'question' and 'answers'")
                if not isinstance(qa.get("question"), str) or "id" not in qa:
                    raise DataError(f"{where}: needs 'id' and 'question'")
                answers = _expect(qa.get("answers", []), list, f"{where}.answers", "a list")
                if require_answers and not answers:
                    raise DataError(f"{where}: no answers (SQuAD v1.1 questions all have one)")
                for k, ans in enumerate(answers):
                    if not isinstance(ans, dict) or not isinstance(ans.get("text"), str) \
                            or not isinstance(ans.get("answer_start"), int):
                        raise DataError(f"{where}.answers[{k}]: an answer needs 'text' and an integer "
                                        f"'answer_start', found {json.dumps(ans)[:80]}")
                    start = ans["answer_start"]
                    if not ans["text"].strip() or start < 0:  # no token span to train on or to score
                        raise DataError(f"{where}.answers[{k}]: an answer needs non-blank 'text' and a "
                                        f"non-negative 'answer_start', found {json.dumps(ans)[:80]}")
                    if context[start:start + len(ans["text"])] != ans["text"]:
                        raise DataError(f"{where}: answer {ans['text']!r} is not at answer_start={start} "
                                        f"of the context")
                qid = str(qa["id"])
                if qid in seen:  # predictions and scores are kept by id: a repeat would drop a question
                    raise DataError(f"{where}: question id {qid!r} is also {seen[qid]}'s; ids must be unique")
                seen[qid] = where
                out.append(QAExample(qid, qa["question"], context, answers, where))
    if not out:
        raise DataError(f"{path}: no questions")
    return out


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number")


def _expect(value, kind: type, where: str, what: str):
    if not isinstance(value, kind):
        raise DataError(f"{where}: expected {what}, found {_kind(value)}")
    return value


# -- finding a task's files ----------------------------------------------------------------------------------

_LANG_PATTERNS = (
    re.compile(r"^xquad\.([a-z]{2,3})\.json$"),                       # XQuAD
    re.compile(r"context-([a-z]{2,3})-question-\1\.json$"),             # MLQA (same-language pairs)
    re.compile(r"^tydiqa\.goldp\.([a-z]{2,3})\.(?:dev|test)\.json$"),   # TyDiQA-GoldP, XTREME layout
    re.compile(r"^tydiqa-goldp-(?:v1\.1-)?(?:dev|test)-([a-z]+)\.json$"),
    re.compile(r"^(?:dev|test|valid)[-.]([a-z]{2,3})\.json$"),
)


def qa_language(name: str) -> str | None:
    for pattern in _LANG_PATTERNS:
        m = pattern.search(name)
        if m:
            return m.group(1)
    return None


def task_spec(name: str) -> TaskSpec:
    key = ALIASES.get(name.lower(), name.lower())
    if key in GLUE:
        return GLUE[key]
    if key == "xnli":
        return XNLI
    if key in ("squad", "xquad", "mlqa", "tydiqa", "qa"):
        return SQUAD
    if key in BUILTIN:
        return BUILTIN[key]
    known = [s.name for s in GLUE.values()] + ["XNLI", "SQuAD/XQuAD/MLQA/TyDiQA (qa)"] + list(BUILTIN)
    raise DataError(f"task {name!r} is unknown; known tasks: {', '.join(known)} (or pass --task tsv "
                    f"for a generic sentence/label TSV)")


def guess_task(path: Path) -> str:
    """The task a directory holds, from its name (GLUE's folder names) or its files."""
    name = path.name.lower()
    if ALIASES.get(name, name) in GLUE or name == "xnli":
        return name
    if name in BUILTIN:
        return name
    if any(qa_language(p.name) for p in path.glob("*.json")) or list(path.glob("*.json")):
        return "qa"
    if list(path.glob("*-en.tsv")):
        return "xnli"
    raise DataError(f"{path}: cannot tell which task this is from its name; pass --task "
                    f"(e.g. --task cola, --task xnli, --task qa, --task tsv)")


def generic_spec(train_file: Path, name: str) -> TaskSpec:
    """A user's own TSV with a header `sentence[1] [sentence2] label`; classes are the training labels."""
    text = read_text(train_file)
    header = text.split("\n", 1)[0].rstrip("\r").split("\t")
    a = "sentence" if "sentence" in header else "sentence1"
    b = "sentence2" if "sentence2" in header else None
    if "label" not in header:
        raise DataError(f"{train_file}:1: the header needs a 'label' column, found {header}")
    il = header.index("label")
    raw = {line.split("\t")[il].strip() for line in text.split("\n")[1:]
           if line.strip() and len(line.split("\t")) > il}
    labels = tuple(sorted(raw))
    return TaskSpec(name, "classification", ("accuracy",), labels, text_a=a, text_b=b)


def load_task(source: str, task: str | None = None, train_file: str | None = None,
              eval_files: list[str] | None = None, train_split: str = "train", eval_split: str = "dev",
              train_language: str = "en", max_train: int | None = None, eval_only: bool = False) -> TaskData:
    """A task from a directory in its official layout (or `--train-file/--eval-files`), or a HF name.

    XNLI and QA: fine-tune on `train_language` (`{train_split}-en.tsv`, a `train*.json`, or `train_file`),
    evaluate on every language's `{eval_split}` file: the cross-lingual zero-shot protocol. `eval_only`: the
    evaluation files alone (no training set is looked for; the caller brings one from elsewhere).
    """
    path = Path(source)
    if not path.exists() and is_hf_name(source):
        return load_hf_task(source, task, max_train)
    if not path.exists():
        raise DataError(f"{source}: no such file or directory")
    name = (task or guess_task(path)).lower()
    if name == "tsv":
        tfile = Path(train_file) if train_file else path / f"{train_split}.tsv"
        if not tfile.is_file():
            raise DataError(f"{tfile}: no such file")
        spec = generic_spec(tfile, path.name)
    else:
        spec = task_spec(name)
    if spec.kind == "qa":
        data = _load_qa_dir(path, spec, train_file, eval_files, train_split, eval_split, train_language, eval_only)
    elif spec is XNLI:
        data = _load_xnli_dir(path, spec, train_file, eval_files, train_split, eval_split, train_language,
                              eval_only)
    else:
        tfile = Path(train_file) if train_file else path / f"{train_split}.tsv"
        if not train_file and not tfile.is_file() and name in GLUE:
            raise DataError(f"{tfile}: no such file ({folder_listing(path)}); pass --train-file, or the task by its "
                            f"Hugging Face name, nyu-mll/glue:{name.replace('-', '')} (needs a network)")
        efiles = [Path(f) for f in eval_files] if eval_files else \
            [path / (f.replace("dev", eval_split, 1) if eval_split != "dev" else f) for f in spec.eval_files]
        _refuse_leaks(tfile, efiles, parallel=False)
        data = TaskData(spec, read_tsv(tfile, spec),
                        {f.stem: read_tsv(f, spec) for f in efiles}, source=str(path))
    if max_train is not None:
        data.train = data.train[:max_train]
    return data


def _refuse_leaks(tfile: Path, efiles, parallel: bool) -> None:
    """A training file that is also evaluated, or (`parallel`: XNLI's splits, XQuAD, MLQA, whose languages are
    translations of one another) one whose translations are, would score the examples it trained on."""
    efiles = [Path(f).resolve() for f in efiles]
    if tfile.resolve() in efiles:
        raise DataError(f"{tfile}: the training file is also an evaluation set; evaluate on another split")
    if parallel and efiles:
        raise DataError(f"{tfile}: the evaluation sets ({efiles[0].name}, ...) are translations of this training "
                        f"file, so every evaluated example would have been trained on. Fine-tune on another set "
                        f"(--train-file: MNLI's train.tsv for XNLI, SQuAD's train-v1.1.json for QA, as the papers "
                        f"do), or run `dietpe compare --suite xtreme`, which splits the shared data by premise and "
                        f"by article")


def _load_xnli_dir(path, spec, train_file, eval_files, train_split, eval_split, train_language,
                   eval_only: bool = False) -> TaskData:
    tfile = Path(train_file) if train_file else path / f"{train_split}-{train_language}.tsv"
    if eval_only:
        return TaskData(spec, [], _xnli_evals(spec, _xnli_eval_files(path, eval_files, eval_split)),
                        source=str(path))
    if not tfile.is_file():
        raise DataError(f"{tfile}: no such file. XNLI has no training set of its own (the papers fine-tune on "
                        f"MNLI's English train.tsv): pass --train-file, or --train-split dev --eval-split test "
                        f"where the test files carry labels (XNLI 1.0's release; XTREME's hides them: there, "
                        f"`dietpe compare --suite xtreme` splits the dev sets by premise)")
    if train_file and Path(train_file).name == "train.tsv":  # MNLI's layout
        train = read_tsv(tfile, GLUE["mnli"])
    else:
        train = read_tsv(tfile, spec)
    efiles = _xnli_eval_files(path, eval_files, eval_split)
    # one split's per-language files are translations of one another
    _refuse_leaks(tfile, efiles, parallel=not train_file and train_split == eval_split)
    return TaskData(spec, train, _xnli_evals(spec, efiles), source=str(path))


def _xnli_eval_files(path: Path, eval_files, eval_split: str) -> list[Path]:
    efiles = [Path(f) for f in eval_files] if eval_files else sorted(path.glob(f"{eval_split}-*.tsv"))
    if not efiles:
        raise DataError(f"{path}: no {eval_split}-<lang>.tsv files to evaluate on")
    return efiles


def _xnli_evals(spec, efiles: list[Path]) -> dict:
    return {f.stem.split("-", 1)[-1]: read_tsv(f, spec) for f in efiles}


def _load_qa_dir(path, spec, train_file, eval_files, train_split, eval_split, train_language,
                 eval_only: bool = False) -> TaskData:
    if path.is_file():
        path, train_file = path.parent, train_file or str(path)
    if eval_only:
        tfile = None
    elif train_file:
        tfile = Path(train_file)
    else:
        candidates = sorted(path.glob(f"*{train_split}*.json"))
        if train_split != "train":  # a language's file, e.g. TyDiQA's tydiqa.goldp.en.dev.json
            candidates = [p for p in sorted(path.glob("*.json")) if qa_language(p.name) == train_language]
        if not candidates:
            raise DataError(f"{path}: no training file (looked for *{train_split}*.json); XQuAD, MLQA and "
                            f"TyDiQA are evaluation sets: pass --train-file SQuAD's train-v1.1.json")
        tfile = candidates[0]
    train = [] if tfile is None else read_squad(tfile)
    efiles = _qa_eval_files(path, tfile, eval_files, eval_split, train_language)
    if tfile is not None:
        # XQuAD's and MLQA's languages are translations of the same questions (TyDiQA's are not)
        parallel = bool(_LANG_PATTERNS[0].search(tfile.name) or _LANG_PATTERNS[1].search(tfile.name))
        _refuse_leaks(tfile, efiles.values(), parallel and any(_LANG_PATTERNS[0].search(f.name)
                                                               or _LANG_PATTERNS[1].search(f.name)
                                                               for f in efiles.values()))
    if all(_LANG_PATTERNS[1].search(f.name) for f in efiles.values()):
        spec = MLQA  # MLQA's layout: its script's per-language normalisation scores it
    return TaskData(spec, train, {lang: read_squad(f) for lang, f in efiles.items()}, source=str(path))


def _qa_eval_files(path: Path, tfile: Path | None, eval_files, eval_split: str, train_language: str) -> dict:
    """{language: file}: the given files, else the folder's, a language's file of `eval_split` before any
    other split's (MLQA's folder holds dev- and test- files of every language)."""
    if eval_files:
        return {qa_language(Path(f).name) or Path(f).stem: Path(f) for f in eval_files}
    efiles = {}
    for p in sorted(path.glob("*.json")):
        lang = qa_language(p.name)
        if lang and p != tfile and (eval_split in p.name or "xquad" in p.name or lang != train_language):
            if lang in efiles and eval_split in efiles[lang].name and eval_split not in p.name:
                continue
            efiles[lang] = p
    if not efiles:
        raise DataError(f"{path}: no evaluation files (named like xquad.<lang>.json, "
                        f"dev-context-<lang>-question-<lang>.json or tydiqa.goldp.<lang>.dev.json)")
    return efiles


def load_hf_task(name: str, task: str | None, max_train: int | None) -> TaskData:
    """A GLUE-style task by Hugging Face name, e.g. `nyu-mll/glue:cola` (needs a network)."""
    dataset, _, config = name.partition(":")
    spec = task_spec(task or config or dataset.split("/")[-1])
    loaded = load_hf_splits(name)
    splits = _hf_eval_splits(name, loaded)
    if spec.kind == "qa":
        return TaskData(spec, _qa_rows(loaded["train"], name), {k: _qa_rows(loaded[k], name) for k in splits},
                        source=f"huggingface:{name}")
    columns = {"sentence", "sentence1", "sentence2", "question", "question1", "question2", "premise",
               "hypothesis"}

    def rows(split):
        ds = loaded[split]
        text_cols = [c for c in ds.column_names if c in columns]
        if not text_cols or "label" not in ds.column_names:
            raise DataError(f"huggingface:{name}: expected text columns and a 'label', found {ds.column_names}")
        a, b = text_cols[0], (text_cols[1] if len(text_cols) > 1 else None)
        out = []
        for i, r in enumerate(ds):
            label = r["label"]
            if spec.kind == "classification" and not 0 <= label < spec.num_labels:
                raise DataError(f"huggingface:{name}[{split}] row {i}: label {label} outside 0..{spec.num_labels - 1}")
            out.append(Example(r[a], r[b] if b else None, label, f"huggingface:{name}[{split}] row {i}"))
        return out

    train = rows("train")
    return TaskData(spec, train[:max_train] if max_train else train, {k: rows(k) for k in splits},
                    source=f"huggingface:{name}")


def _hf_eval_splits(name: str, loaded) -> list[str]:
    """Checks there is a train split; returns the labelled evaluation splits: `validation`, else every
    `validation_*` (MNLI's matched and mismatched); GLUE's test splits carry no labels."""
    if "train" not in loaded:
        raise DataError(f"huggingface:{name}: no train split (has {', '.join(loaded)})")
    splits = [s for s in loaded if s == "validation"] or sorted(s for s in loaded if s.startswith("validation"))
    if not splits:
        raise DataError(f"huggingface:{name}: no validation split to evaluate on (has {', '.join(loaded)}); pass "
                        f"a local folder with its dev file instead")
    return splits


def _qa_rows(rows, name) -> list[QAExample]:
    return [QAExample(str(r["id"]), r["question"], r["context"],
                      [{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"],
                                                                        r["answers"]["answer_start"])],
                      f"huggingface:{name} row {i}") for i, r in enumerate(rows)]
