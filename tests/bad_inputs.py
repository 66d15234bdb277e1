"""The catalogue of bad inputs to the `dietpe` command line and its data readers.

Each case is a command line over tiny generated data (a corpus, three tasks, a pre-trained model, a translation
model, parallel files and many broken files), run in this process through `dietpe.cli.main` with stderr captured at
the file-descriptor level. A case is classified as

* clear:     exit code 2 and stderr is one line `dietpe <cmd>: error: ...` that names every expected piece (the
             option and its value and the limit, or the file and line); argparse's usage block is tolerated
             here (the tests in tests/test_cli_errors.py require the single line);
* unclear:   the command failed without a traceback, but the message misses a piece or is buried in other output;
* traceback: an exception escaped `main` (the console script would print a Python traceback);
* silent:    the command accepted the input: exit code 0, or it reached training / benchmarking / analysis /
             decoding (those are stubbed out to raise, so the catalogue stays fast).

    python tests/bad_inputs.py                  # print the table and the counts
    python tests/bad_inputs.py --markdown FILE  # also write the table as Markdown rows
    PYTHONPATH=/tmp/old/src python tests/bad_inputs.py --json before.json   # another version of diet
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

# -- the data -------------------------------------------------------------------------------------------------

SQUAD_CONTEXT = "the cat sat on the mat near the old river and the dog ran to the tall tree by the road ."


def _squad(question="where did the cat sit ?", answer="the mat", start=None):
    start = SQUAD_CONTEXT.index(answer) if start is None else start
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": SQUAD_CONTEXT, "qas": [
        {"id": f"q{i}", "question": question, "answers": [{"text": answer, "answer_start": start}]}
        for i in range(12)]}]}]}


def make_fixtures(root: str | Path) -> dict[str, str]:
    """Write every file the catalogue needs under `root`; returns name -> path for the command templates."""
    import torch

    from dietpe import DietConfig, DietForMaskedLM
    from dietpe.data import synthetic
    from dietpe.data.parallel import train_joint_bpe
    from dietpe.data.tokenizer import train_wordpiece
    from dietpe.models.seq2seq import DietForConditionalGeneration, DietSeq2SeqConfig

    root = Path(root)
    torch.manual_seed(0)
    paths = synthetic.write_builtin(root / "data", seed=0, documents=40, train=24, dev=12)
    f: dict[str, Path] = {"root": root, "corpus": paths["corpus"], "order": paths["order"],
                          "pairorder": paths["pair-order"]}
    bad = root / "bad"
    bad.mkdir()

    # a pre-trained model in a `dietpe pretrain` run folder (run/model), and broken copies of it
    text = (paths["corpus"] / "train.txt").read_text(encoding="utf-8").split("\n")
    tok = train_wordpiece([t for t in text if t], vocab_size=200, min_frequency=1)
    cfg = DietConfig.from_preset("bert-tiny", position="absolute", vocab_size=len(tok), max_position_embeddings=32,
                                 hidden_size=16, num_attention_heads=2, intermediate_size=32, num_hidden_layers=1)
    model_dir = root / "run" / "model"
    DietForMaskedLM(cfg).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    f["run"], f["model"] = root / "run", model_dir
    f["truncated"] = root / "truncated"
    shutil.copytree(model_dir, f["truncated"])
    weights = f["truncated"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    f["badconfig"] = root / "badconfig"
    shutil.copytree(model_dir, f["badconfig"])
    (f["badconfig"] / "config.json").write_text('{"model_type": "diet",\n  "position": \n', encoding="utf-8")
    f["bomconfig"], f["listconfig"] = root / "bomconfig", root / "listconfig"
    for name in ("bomconfig", "listconfig"):
        shutil.copytree(model_dir, f[name])
    text = (model_dir / "config.json").read_text(encoding="utf-8")
    (f["bomconfig"] / "config.json").write_text("\ufeff" + text, encoding="utf-8")
    (f["listconfig"] / "config.json").write_text("[1]\n", encoding="utf-8")
    f["noweights"] = root / "noweights"
    shutil.copytree(model_dir, f["noweights"])
    (f["noweights"] / "model.safetensors").unlink()
    from safetensors.torch import load_file, save_file

    f["lackweight"], f["resized"] = root / "lackweight", root / "resized"
    for name in ("lackweight", "resized"):
        shutil.copytree(model_dir, f[name])
    held = load_file(str(model_dir / "model.safetensors"))
    del held["diet.layers.0.attention.query.weight"]
    save_file(held, str(f["lackweight"] / "model.safetensors"), metadata={"format": "pt"})
    (f["resized"] / "config.json").write_text(text.replace('"intermediate_size": 32', '"intermediate_size": 48'),
                                              encoding="utf-8")
    f["notmodel"] = root / "notmodel"
    f["notmodel"].mkdir()
    (f["notmodel"] / "readme.txt").write_text("nothing here\n")

    # parallel text and a tiny translation model
    para = root / "para"
    para.mkdir()
    src = [f"w{i} w{i + 1} w{i + 2}" for i in range(30)]
    tgt = [f"v{i} v{i + 1} v{i + 2}" for i in range(30)]
    for split, rows in (("train", slice(0, 24)), ("val", slice(24, 30))):
        (para / f"{split}.de").write_text("\n".join(src[rows]) + "\n", encoding="utf-8")
        (para / f"{split}.en").write_text("\n".join(tgt[rows]) + "\n", encoding="utf-8")
    f["para"] = para
    jt = train_joint_bpe(src + tgt, vocab_size=60, min_frequency=1)
    mt_cfg = DietSeq2SeqConfig.from_preset("transformer-tiny", vocab_size=len(jt), hidden_size=16,
                                           num_attention_heads=2, intermediate_size=32, num_hidden_layers=1,
                                           num_decoder_layers=1, position="absolute", max_position_embeddings=16)
    f["mt"] = root / "mt"
    DietForConditionalGeneration(mt_cfg).save_pretrained(f["mt"] / "final")
    jt.save_pretrained(f["mt"] / "final")
    f["mt_truncated"] = root / "mt_truncated"
    shutil.copytree(f["mt"], f["mt_truncated"])
    w = f["mt_truncated"] / "final" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])

    # broken corpus files
    def write(name: str, data: bytes | str) -> Path:
        p = bad / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        return p

    long_text = "".join(f"the cat number {i} sat on the mat .\n" for i in range(3000))  # past a read chunk
    f["utf8_txt"] = write("corpus_utf8.txt", long_text.encode() + b"the caf\xe9 was open .\nmore text .\n")
    f["utf8_jsonl"] = write("corpus_utf8.jsonl", b'{"text": "a cat ."}\n{"text": "caf\xe9 ."}\n')
    f["utf8_tsvc"] = write("corpus_utf8.tsv", b"text\na cat .\nthe caf\xe9 .\n")
    f["empty_txt"] = write("empty.txt", "")
    f["blank_txt"] = write("blank.txt", "\n\n  \n")
    f["onedoc_txt"] = write("onedoc.txt", "one lonely document . it has two sentences .\n")
    f["badjson_jsonl"] = write("bad.jsonl", '{"text": "a cat ."}\n{"text": "a dog .",\n')
    f["notext_jsonl"] = write("notext.jsonl", '{"text": "a cat ."}\n{"body": "a dog ."}\n')
    f["list_jsonl"] = write("list.jsonl", '["a cat ."]\n')
    f["nocol_tsv"] = write("nocol.tsv", "body\nthe cat .\n")
    f["short_tsv"] = write("short.tsv", "id\ttext\n1\tthe cat .\n2\n")
    f["tab_tsv"] = write("tab.tsv", "id\ttext\tlabel\n1\tthe cat .\tA\n2\tbirds\tfly\tB\n")
    f["emptydir"] = bad / "emptydir"
    f["emptydir"].mkdir()
    f["otherdir"] = bad / "otherdir"
    write("otherdir/notes.md", "# notes\n")
    f["ambiguous"] = bad / "ambiguous"
    write("ambiguous/a.train.txt", "x .\n")
    write("ambiguous/b.train.txt", "y .\n")
    f["binary"] = write("weights.bin", bytes(range(256)) * 4)
    f["tokfile"] = write("tokenizer.json", '{"not": "a tokenizer"}')
    f["nospecial_tok"] = root / "nospecial_tok"
    from tokenizers import Tokenizer, models, pre_tokenizers
    t = Tokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    f["nospecial_tok"].mkdir()
    t.save(str(f["nospecial_tok"] / "tokenizer.json"))

    # broken task files
    def task(name: str, train: bytes | str, dev: bytes | str | None = None) -> Path:
        write(f"{name}/train.tsv", train)
        write(f"{name}/dev.tsv", dev if dev is not None else "sentence\tlabel\nok .\tanimal-first\n")
        return bad / name

    ok_rows = "".join(f"the cat {i} .\tanimal-first\n" for i in range(20))
    f["task_utf8"] = task("utf8/order", ("sentence\tlabel\n" + ok_rows).encode() + b"the caf\xe9 .\tfruit-first\n")
    f["task_utf8_dev"] = task("utf8dev/order", "sentence\tlabel\n" + ok_rows,
                              b"sentence\tlabel\nok .\tanimal-first\nthe caf\xe9 .\tfruit-first\n")
    f["task_label"] = task("label/order", "sentence\tlabel\n" + ok_rows + "the fig .\tsideways\n")
    f["task_cols"] = task("cols/order", "sentence\tlabel\n" + ok_rows + "only one column\n")
    f["task_header"] = task("header/order", "text\tlabel\n" + ok_rows)
    f["task_empty"] = task("empty/order", "")
    f["task_blank_sentence"] = task("blanksent/order", "sentence\tlabel\n" + ok_rows + " \tfruit-first\n")
    f["task_nodev"] = bad / "nodev" / "order"
    write("nodev/order/train.tsv", "sentence\tlabel\n" + ok_rows)
    f["task_unknown"] = bad / "mystery"
    write("mystery/train.tsv", "sentence\tlabel\n" + ok_rows)
    f["stsb_range"] = bad / "STS-B"
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    write("STS-B/train.tsv", head + "0\tg\tf\t2012\t0\tn\tn\tA man.\tA person.\t7.5\n")
    write("STS-B/dev.tsv", head + "0\tg\tf\t2012\t0\tn\tn\tA cat.\tA dog.\t1.0\n")
    f["stsb_nan"] = bad / "nan" / "STS-B"
    write("nan/STS-B/train.tsv", head + "0\tg\tf\t2012\t0\tn\tn\tA man.\tA person.\tabout four\n")
    write("nan/STS-B/dev.tsv", head + "0\tg\tf\t2012\t0\tn\tn\tA cat.\tA dog.\t1.0\n")
    f["tsv_nolabel"] = bad / "generic"
    write("generic/train.tsv", "sentence\tscore\nthe cat .\t1\n")
    write("generic/dev.tsv", "sentence\tscore\nthe cat .\t1\n")
    f["xnli_notrain"] = bad / "xnli"
    write("xnli/test-en.tsv", "a .\tb .\tneutral\n")
    f["xnli_dev"] = bad / "xnli_dev" / "xnli"  # one split's languages: translations of one another
    for lang in ("en", "de"):
        write(f"xnli_dev/xnli/dev-{lang}.tsv", "a .\tb .\tneutral\n" * 12)

    # SQuAD JSON of the wrong shape (and invalid UTF-8 / JSON)
    def squad(name: str, doc) -> Path:
        write(f"{name}/dev-en.json", json.dumps(_squad()))
        write(f"{name}/train.json", doc if isinstance(doc, (bytes, str)) else json.dumps(doc))
        return bad / name

    good = _squad()
    f["qa"] = squad("qa_ok", good)
    f["qa_list"] = squad("qa_list", [good])
    f["qa_nodata"] = squad("qa_nodata", {"version": "1.1"})
    f["qa_article_list"] = squad("qa_article_list", {"data": [["not", "an", "article"]]})
    f["qa_paragraphs_str"] = squad("qa_paragraphs_str", {"data": [{"paragraphs": "text"}]})
    f["qa_para_list"] = squad("qa_para_list", {"data": [{"paragraphs": [["context"]]}]})
    f["qa_qas_dict"] = squad("qa_qas_dict", {"data": [{"paragraphs": [{"context": "c", "qas": {"id": 1}}]}]})
    f["qa_qa_str"] = squad("qa_qa_str", {"data": [{"paragraphs": [{"context": "c", "qas": ["q"]}]}]})
    f["qa_answers_dict"] = squad("qa_answers_dict", {"data": [{"paragraphs": [{"context": "c", "qas": [
        {"id": "1", "question": "q", "answers": {"text": "c", "answer_start": 0}}]}]}]})
    f["qa_answer_str"] = squad("qa_answer_str", {"data": [{"paragraphs": [{"context": "c", "qas": [
        {"id": "1", "question": "q", "answers": ["c"]}]}]}]})
    f["qa_start_str"] = squad("qa_start_str", {"data": [{"paragraphs": [{"context": "c", "qas": [
        {"id": "1", "question": "q", "answers": [{"text": "c", "answer_start": "0"}]}]}]}]})
    f["qa_mismatch"] = squad("qa_mismatch", _squad(answer="the mat", start=3))
    f["qa_utf8"] = squad("qa_utf8", b'{"version": "1.1",\n "data": [\n {"title": "caf\xe9"}]}\n')
    f["qa_badjson"] = squad("qa_badjson", '{"version": "1.1",\n "data": [\n')
    f["qa_longq"] = squad("qa_longq", _squad(question=" ".join(["where"] * 40) + " ?"))
    f["qa_noq"] = squad("qa_noq", {"data": [{"paragraphs": [{"context": "c", "qas": []}]}]})
    f["qa_blank"] = squad("qa_blank", _squad(answer="", start=0))
    twice = _squad()
    twice["data"][0]["paragraphs"][0]["qas"][5]["id"] = "q2"
    f["qa_dupid"] = squad("qa_dupid", twice)

    # broken parallel files
    def pair(name: str, de: bytes | str, en: bytes | str) -> Path:
        d = bad / name
        write(f"{name}/train.de", de)
        write(f"{name}/train.en", en)
        write(f"{name}/val.de", "w1 w2\n")
        write(f"{name}/val.en", "v1 v2\n")
        return d

    lines = "".join(f"w{i} w{i + 1}\n" for i in range(10))
    f["pair_utf8"] = pair("pair_utf8", lines.encode() + b"w1 caf\xe9\n", lines + "v1 v2\n")
    f["pair_count"] = pair("pair_count", lines, lines + "v1 v2\n")
    f["pair_empty"] = pair("pair_empty", "", "")
    f["pair_noval"] = bad / "pair_noval"
    write("pair_noval/train.de", lines)
    write("pair_noval/train.en", lines)
    f["src_utf8"] = write("src_utf8.de", b"w1 w2\nw3 \xff w4\n")
    f["src_empty"] = write("src_empty.de", "")
    f["src_blankline"] = write("src_blank.de", "w1 w2\n\nw3\n")
    f["ref_short"] = write("ref_short.en", "v1 v2\n")

    # BOM-prefixed files and other layouts (read correctly; used by the tests, not the catalogue)
    f["analysis_text"] = write("analysis.txt", "".join(f"the cat {i} sat on the mat near the dog .\n"
                                                       for i in range(40)))
    # output folders: one that exists with work in it, a file, a read-only one with an unfinished checkpoint
    f["existing"] = root / "existing"
    (f["existing"] / "checkpoint-2").mkdir(parents=True)
    (f["existing"] / "keep.txt").write_text("earlier work\n")
    (f["existing"] / "checkpoint-2" / "model.safetensors").write_bytes(b"\0" * 8)
    f["afile"] = write("afile.txt", "I am a file\n")
    f["readonly"] = root / "readonly"
    (f["readonly"] / "checkpoint-4").mkdir(parents=True)
    (f["readonly"] / "checkpoint-4" / "model.safetensors").write_bytes(b"\0" * 8)
    return {k: str(v) for k, v in f.items()}


# -- the cases ------------------------------------------------------------------------------------------------

PRE = ("pretrain {corpus} -o {out} --threads 1 --recipe toy --vocab-size 200 --max-length 24 --steps 2 "
       "--batch-size 4 --device-batch-size 4 --save-steps 2")
FT = ("finetune {model} {order} -o {out} --threads 1 --ft-recipe toy --seeds 1 --epochs 1 --ft-batch-size 8 "
      "--ft-max-length 24 --lrs 1e-3")
CMP = ("compare --corpus {corpus} --tasks {order} -o {out} --threads 1 --jobs 1 --methods absolute --recipe toy "
       "--ft-recipe toy --vocab-size 200 --max-length 24 --steps 2 --batch-size 4 --device-batch-size 4 --seeds 1 "
       "--ft-batch-size 8 --ft-max-length 24 --lrs 1e-3")
TT = ("translate train --data {para} --source de --target en --output-dir {out} --threads 1 --vocab-size 60 "
      "--max-length 32 --batch-size 8 --max-steps 2 --size transformer-tiny "
      "--method sinusoidal:hidden_size=16:num_attention_heads=2:intermediate_size=32")
TE = ("translate eval {mt} --source {para}/val.de --reference {para}/val.en --output {out}/hyp.txt --threads 1 "
      "--beams 2 --batch-size 4")
BENCH = ("bench --shapes bert-tiny --lengths 16 --repeats 1 --warmup 0 --threads 1 --no-memory --methods diet-rel "
         "--modes infer")
AN = "analyze {model} --data {analysis_text} -o {out} --batch-size 2 --length 16"


@dataclass(frozen=True)
class Case:
    id: str
    argv: str                   # a template over the fixture paths, {out} a fresh folder per case
    needles: tuple[str, ...]    # what a clear message names (case-insensitive), templates too
    patch: str | None = None    # "readonly" (writes under {readonly} refused) or "diskfull" (writes under {out})
    writes: bool = False        # the failure comes after writing started: {out} may exist
    stub: bool = True           # stop at the start of the real work (False: run it, e.g. to meet a full disk)

    @property
    def command(self) -> str:
        words = self.argv.split()
        if words[0] == "translate":
            return " ".join(words[:2])
        return words[0] if words[0] in ("pretrain", "prepare", "finetune", "compare", "bench", "analyze") else "dietpe"


CASES: list[Case] = []


def case(id: str, argv: str, *needles: str, patch: str | None = None, writes: bool = False,
         stub: bool = True) -> None:
    assert all(c.id != id for c in CASES), id
    CASES.append(Case(id, argv, needles, patch, writes, stub))


def options(prefix: str, base: str, table: list[tuple[str, str, tuple[str, ...]]]) -> None:
    """Cases `base OPTION VALUE`, each expected to name the option, the value and the words of the limit."""
    for option, value, limit in table:
        case(f"{prefix} {option} {value}".strip(), f"{base} {option} {value}", option, value, *limit)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


POS = ("positive|>= 1|at least 1",)
NONNEG = (">= 0|non-negative|at least 0",)
FRACTION = ("[0, 1)",)

# -- pretrain: numbers ------------------------------------------------------------------------------------
options("pretrain", PRE, [
    ("--steps", "0", POS), ("--steps", "-5", POS), ("--steps", "ten", ("int",)), ("--steps", "1.5", ("int",)),
    ("--batch-size", "0", POS), ("--batch-size", "-4", POS),
    ("--device-batch-size", "0", POS), ("--device-batch-size", "-1", POS),
    ("--max-length", "0", (">= 3",)), ("--max-length", "-1", (">= 3",)), ("--max-length", "2", (">= 3",)),
    ("--vocab-size", "0", (">= 6",)), ("--vocab-size", "-1", (">= 6",)),
    ("--save-steps", "0", POS), ("--save-steps", "-2", POS),
    ("--max-documents", "0", POS), ("--max-documents", "-1", POS),
    ("--max-validation", "0", POS), ("--max-validation", "-3", POS),
    ("--lr", "0", POS), ("--lr", "-1", POS), ("--lr", "nan", POS), ("--lr", "inf", ("finite",)),
    ("--warmup", "-0.1", FRACTION), ("--warmup", "1", FRACTION), ("--warmup", "nan", FRACTION),
    ("--seed", "-1", NONNEG), ("--seed", "99999999999", ("2**32",)),
    ("--threads", "0", POS), ("--threads", "-2", POS),
])
case("pretrain --vocab-size 3", f"{PRE} --vocab-size 3", "--vocab-size", "3", "special tokens")
case("pretrain --batch-size 6 --device-batch-size 4", f"{PRE} --batch-size 6 --device-batch-size 4",
     "batch size 6", "--device-batch-size")
case("pretrain --size nope", f"{PRE} --size nope", "--size", "nope", "bert-base")
case("pretrain --recipe nope", f"{PRE} --recipe nope", "--recipe", "nope", "paper")
# -- pretrain: methods ------------------------------------------------------------------------------------
for spec, needles in [
    ("rope", ("rope", "absolute")), ("absolute:foo=1", ("foo", "position_rank")),
    ("absolute:segment=middle", ("middle", "per-head")), ("absolute:sharing", ("sharing", "key=value")),
    ("diet-abs:position_rank=0", ("position_rank", "0")), (":segment=input", ("position=''",)),
    ("absolute:vocab_size=10", ("vocab_size", "--vocab-size")),
    ("absolute:max_position_embeddings=8", ("max_position_embeddings", "--max-length")),
    ("absolute:pad_token_id=3", ("pad_token_id", "tokenizer")),
    ("absolute:hidden_size=127", ("hidden_size=127", "num_attention_heads")),
    ("absolute:hidden_dropout_prob=2", ("hidden_dropout_prob", "2")),
    ("linformer-typo:attention=linformer", ("linformer-typo",)),
    ("shaw:attention=linformer", ("shaw", "linformer")),
]:
    case(f"pretrain --method {spec}", f"{PRE} --method {spec}", *needles)
# -- pretrain: files --------------------------------------------------------------------------------------
PRE_NO_CORPUS = PRE.replace("pretrain {corpus} ", "pretrain ")
for name, source, needles in [
    ("missing corpus", "{root}/nope.txt", ("nope.txt", "no such")),
    ("empty corpus folder", "{emptydir}", ("emptydir", "train")),
    ("corpus folder without text", "{otherdir}", ("otherdir", "notes.md")),
    ("two train files", "{ambiguous}", ("a.train.txt", "b.train.txt")),
    ("empty corpus file", "{empty_txt}", ("empty.txt", "empty")),
    ("blank corpus file", "{blank_txt}", ("blank.txt", "empty")),
    ("one-document corpus", "{onedoc_txt}", ("onedoc.txt", "--validation")),
    ("invalid UTF-8 .txt", "{utf8_txt}", ("corpus_utf8.txt:3001", "UTF-8")),
    ("invalid UTF-8 .jsonl", "{utf8_jsonl}", ("corpus_utf8.jsonl:2", "UTF-8")),
    ("invalid UTF-8 .tsv", "{utf8_tsvc}", ("corpus_utf8.tsv:3", "UTF-8")),
    ("bad JSON line", "{badjson_jsonl}", ("bad.jsonl:2", "JSON")),
    ("JSON line without text", "{notext_jsonl}", ("notext.jsonl:2", "'text'")),
    ("JSON line not an object", "{list_jsonl}", ("list.jsonl:1", "object")),
    ("TSV without text column", "{nocol_tsv}", ("nocol.tsv:1", "'text'")),
    ("TSV short row", "{short_tsv}", ("short.tsv:3", "columns")),
    ("TSV row with a tab inside its text", "{tab_tsv}", ("tab.tsv:3", "a tab inside a text")),
    ("binary corpus", "{binary}", ("weights.bin:2", "UTF-8")),
]:
    case(f"pretrain {name}", PRE_NO_CORPUS.replace("pretrain ", f"pretrain {source} ", 1), *needles)
case("pretrain --validation missing", f"{PRE} --validation {{root}}/nope.txt", "nope.txt", "no such")
case("pretrain --validation invalid UTF-8", f"{PRE} --validation {{utf8_txt}}", "corpus_utf8.txt:3001", "UTF-8")
PRE_TOK = PRE.replace(" --vocab-size 200", "")  # a given tokenizer sets the vocabulary
case("pretrain --tokenizer missing", f"{PRE_TOK} --tokenizer {{root}}/nope", "nope", "tokenizer")
case("pretrain --tokenizer not a tokenizer", f"{PRE_TOK} --tokenizer {{tokfile}}", "tokenizer.json",
     "not a tokenizers")
case("pretrain --tokenizer without special tokens", f"{PRE_TOK} --tokenizer {{nospecial_tok}}", "[CLS]", "special")
case("pretrain --vocab-size with --tokenizer", f"{PRE} --tokenizer {{model}}", "--vocab-size", "does not apply",
     "--tokenizer")
# -- pretrain: output folder ------------------------------------------------------------------------------
case("pretrain -o a file", PRE.replace("-o {out}", "-o {afile}"), "afile.txt", "not a folder")
case("pretrain -o under a file", PRE.replace("-o {out}", "-o {afile}/run"), "afile.txt", "not a folder")
case("pretrain -o read-only folder", PRE.replace("-o {out}", "-o {readonly}"), "readonly", "cannot write",
     patch="readonly")
case("pretrain --overwrite with a bad corpus", PRE_NO_CORPUS.replace("pretrain ", "pretrain {utf8_txt} ", 1)
     .replace("-o {out}", "-o {existing}") + " --overwrite", "corpus_utf8.txt:3001", "UTF-8")

# -- prepare (corpus into shards) -------------------------------------------------------------------------
PREP = "prepare {corpus} --cache-dir {out} --vocab-size 200 --max-length 24 --processes 1"
options("prepare", PREP, [
    ("--max-length", "2", (">= 3|at least 3",)),
    ("--processes", "0", POS), ("--processes", "100000", ("at most",)),
    ("--tokenizer-sample", "0", POS),
    ("--packing", "nope", ("full-sentences", "documents")),
])
case("prepare missing corpus", PREP.replace("{corpus}", "{root}/nope.txt"), "nope.txt", "no such")
case("prepare invalid UTF-8 .txt", PREP.replace("{corpus}", "{utf8_txt}"), "corpus_utf8.txt:3001", "UTF-8")
case("prepare bad JSON line", PREP.replace("{corpus}", "{badjson_jsonl}"), "bad.jsonl:2", "JSON")
case("prepare one-document corpus", PREP.replace("{corpus}", "{onedoc_txt}"), "onedoc.txt", "--validation")
case("prepare --cache-dir a file", PREP.replace("--cache-dir {out}", "--cache-dir {afile}"), "afile.txt",
     "not a folder")
case("prepare --tokenizer missing", f"{PREP} --tokenizer {{root}}/nope", "nope", "tokenizer")
case("pretrain --packing nope", f"{PRE} --packing nope", "--packing", "nope", "documents")
case("pretrain --cache-dir a file", f"{PRE} --cache-dir {{afile}}", "afile.txt", "not a folder")

# -- finetune ---------------------------------------------------------------------------------------------
options("finetune", FT, [
    ("--seeds", "0", POS), ("--seeds", "-1", POS), ("--epochs", "0", POS), ("--epochs", "-1", POS),
    ("--epochs", "nan", POS), ("--ft-batch-size", "0", POS), ("--ft-batch-size", "-8", POS),
    ("--ft-max-length", "0", (">= 5",)), ("--ft-max-length", "-1", (">= 5",)),
    ("--ft-max-length", "2", (">= 5",)),
    ("--eval-steps", "0", POS), ("--eval-steps", "-1", POS), ("--max-train", "0", POS), ("--max-train", "-1", POS),
    ("--max-eval", "0", POS), ("--max-eval", "-1", POS), ("--doc-stride", "-1", NONNEG),
    ("--threads", "0", POS),
])
case("finetune --lrs empty", f"{FT} --lrs ,", "--lrs", "','")
case("finetune --lrs text", f"{FT} --lrs fast", "--lrs", "fast")
case("finetune --lrs 0", f"{FT} --lrs 0", "--lrs", "0", "positive")
case("finetune --lrs twice", f"{FT} --lrs 1e-3,0.001", "--lrs", "0.001", "twice")
case("finetune --lrs negative", f"{FT} --lrs 1e-3,-1e-3", "--lrs", "-0.001", "positive")
case("finetune --lrs nan", f"{FT} --lrs nan", "--lrs", "nan", "positive")
case("finetune --ft-max-length beyond the table", f"{FT} --ft-max-length 64", "max_length=64",
     "max_position_embeddings=32")
case("finetune --ft-recipe nope", f"{FT} --ft-recipe nope", "--ft-recipe", "nope", "paper")
case("finetune --task-name nope", f"{FT} --task-name nope", "nope", "CoLA")
case("finetune batch larger than the data", f"{FT} --ft-batch-size 64", "24 training examples", "64")
case("finetune --doc-stride >= room", f"{FT.replace('{order}', '{qa}')} --doc-stride 24",
     "--doc-stride 24", "--ft-max-length 24")
case("finetune --doc-stride = room", f"{FT.replace('{order}', '{qa}')} --doc-stride 14", "--doc-stride 14",
     "--ft-max-length 24")
case("finetune question longer than the window", f"{FT.replace('{order}', '{qa_longq}')} --doc-stride 4",
     "train.json", "data[0].paragraphs[0].qas[0]", "--ft-max-length 24")
for name, model, needles in [
    ("missing model", "{root}/nope", ("nope", "no such")),
    ("folder without a model", "{notmodel}", ("notmodel", "config.json")),
    ("model is a file", "{afile}", ("afile.txt", "config.json")),
    ("truncated safetensors", "{truncated}", ("truncated/model.safetensors", "truncated")),
    ("invalid config.json", "{badconfig}", ("badconfig/config.json:3", "JSON")),
    ("model without weights", "{noweights}", ("noweights", "model.safetensors")),
    ("model lacking a weight", "{lackweight}", ("lackweight", "lack diet.layers.0.attention.query.weight")),
    ("config.json resized", "{resized}", ("resized", "diet.layers.0.intermediate.weight at [32, 16]", "[48, 16]")),
    ("config.json with a byte-order mark", "{bomconfig}", ("bomconfig/config.json", "byte-order mark")),
    ("config.json not an object", "{listconfig}", ("listconfig/config.json", "not an object")),
]:
    case(f"finetune {name}", FT.replace("{model}", model, 1), *needles)
for name, task, needles in [
    ("missing task", "{root}/nope", ("nope", "no such")),
    ("unknown task folder", "{task_unknown}", ("mystery", "--task")),
    ("invalid UTF-8 TSV", "{task_utf8}", ("train.tsv:22", "UTF-8")),
    ("invalid UTF-8 dev TSV", "{task_utf8_dev}", ("dev.tsv:3", "UTF-8")),
    ("unknown label", "{task_label}", ("train.tsv:22", "sideways", "animal-first")),
    ("too few columns", "{task_cols}", ("train.tsv:22", "columns")),
    ("header lacks a column", "{task_header}", ("train.tsv:1", "'sentence'")),
    ("empty TSV", "{task_empty}", ("train.tsv", "header")),
    ("blank sentence", "{task_blank_sentence}", ("train.tsv:22", "empty sentence")),
    ("no dev file", "{task_nodev}", ("dev.tsv", "no such")),
    ("STS-B score out of range", "{stsb_range}", ("train.tsv:2", "7.5", "[0.0, 5.0]")),
    ("STS-B score not a number", "{stsb_nan}", ("train.tsv:2", "about four")),
    ("XNLI without a training file", "{xnli_notrain}", ("train-en.tsv", "--train-file")),
    ("SQuAD root a list", "{qa_list}", ("train.json", "'data'")),
    ("SQuAD without data", "{qa_nodata}", ("train.json", "'data'")),
    ("SQuAD article a list", "{qa_article_list}", ("train.json", "data[0]", "object")),
    ("SQuAD paragraphs a string", "{qa_paragraphs_str}", ("train.json", "data[0].paragraphs", "list")),
    ("SQuAD paragraph a list", "{qa_para_list}", ("train.json", "data[0].paragraphs[0]", "object")),
    ("SQuAD qas an object", "{qa_qas_dict}", ("train.json", "data[0].paragraphs[0].qas", "list")),
    ("SQuAD question a string", "{qa_qa_str}", ("train.json", "qas[0]", "object")),
    ("SQuAD answers an object", "{qa_answers_dict}", ("train.json", "qas[0].answers", "list")),
    ("SQuAD answer a string", "{qa_answer_str}", ("train.json", "qas[0]", "answer")),
    ("SQuAD answer_start a string", "{qa_start_str}", ("train.json", "qas[0]", "answer_start")),
    ("SQuAD answer not at its start", "{qa_mismatch}", ("train.json", "qas[0]", "answer_start=3")),
    ("SQuAD invalid UTF-8", "{qa_utf8}", ("train.json:3", "UTF-8")),
    ("SQuAD invalid JSON", "{qa_badjson}", ("train.json:3", "JSON")),
    ("SQuAD without questions", "{qa_noq}", ("train.json", "no questions")),
    ("SQuAD blank answer", "{qa_blank}", ("train.json", "qas[0].answers[0]", "non-blank")),
    ("SQuAD question id twice", "{qa_dupid}", ("train.json", "qas[5]", "'q2'", "unique")),
]:
    case(f"finetune {name}", FT.replace("{order}", task, 1), *needles)
case("finetune --train-file missing", f"{FT} --train-file {{root}}/nope.tsv", "nope.tsv", "no such")
case("finetune --eval-files missing", f"{FT} --eval-files {{root}}/nope.tsv", "nope.tsv", "no such")
case("finetune --train-split nope", f"{FT} --train-split nope", "nope.tsv", "no such")
case("finetune on the evaluated set", f"{FT} --train-split dev", "dev.tsv", "also an evaluation set")
case("finetune XNLI on translations of the evaluated sets", FT.replace("{order}", "{xnli_dev}", 1)
     + " --train-split dev --eval-files {xnli_dev}/dev-de.tsv", "dev-en.tsv", "translations")
case("finetune --train-split beside --train-file", f"{FT} --train-file {{order}}/train.tsv --train-split dev",
     "--train-split", "--train-file")
case("finetune --eval-split beside --eval-files", f"{FT} --eval-files {{order}}/dev.tsv --eval-split test",
     "--eval-split", "--eval-files")
case("finetune --train-language on a GLUE-style task", f"{FT} --train-language de", "--train-language", "XNLI")
case("finetune --task-name tsv without label", FT.replace("{order}", "{tsv_nolabel}") + " --task-name tsv",
     "train.tsv:1", "'label'")
case("finetune -o a file", FT.replace("-o {out}", "-o {afile}"), "afile.txt", "not a folder")
case("finetune -o under a file", FT.replace("-o {out}", "-o {afile}/ft"), "afile.txt", "not a folder")
case("finetune -o read-only folder", FT.replace("-o {out}", "-o {readonly}"), "readonly", "cannot write",
     patch="readonly")

# -- compare ----------------------------------------------------------------------------------------------
options("compare", CMP, [
    ("--steps", "0", POS), ("--batch-size", "0", POS), ("--device-batch-size", "0", POS),
    ("--max-length", "0", (">= 3",)), ("--vocab-size", "0", (">= 6",)), ("--save-steps", "0", POS), ("--max-documents", "0", POS), ("--seeds", "0", POS),
    ("--epochs", "0", POS), ("--ft-batch-size", "0", POS), ("--ft-max-length", "0", (">= 5",)), ("--jobs", "0", POS),
    ("--jobs", "-1", POS), ("--builtin-size", "0", POS), ("--builtin-size", "-10", POS), ("--threads", "0", POS),
    ("--max-validation", "0", POS), ("--max-train", "0", POS), ("--lr", "0", POS), ("--warmup", "2", FRACTION),
])
case("compare --methods empty", f"{CMP} --methods ,", "no methods", "--methods")
# class: an empty list where one is required runs nothing and says so (never the default list)
case("compare --methods ''", f"{CMP} --methods ''", "no methods", "--methods")
case("compare --methods unknown", f"{CMP} --methods absolute,rope", "rope", "absolute")
case("compare --methods twice", f"{CMP} --methods absolute,absolute", "absolute", "twice")
case("compare --methods vocab_size", f"{CMP} --methods absolute:vocab_size=10", "vocab_size", "--vocab-size")
case("compare --methods hidden_size odd", f"{CMP} --methods absolute:hidden_size=127", "hidden_size=127",
     "num_attention_heads")
case("compare --tasks without --corpus", CMP.replace("--corpus {corpus} ", ""), "--corpus", "--tasks")
case("compare --tasks unknown name", CMP.replace("--tasks {order}", "--tasks {order}=nope"), "nope", "CoLA")
case("compare --tasks twice", CMP.replace("--tasks {order}", "--tasks {order} {order}"), "order", "twice")
case("compare --tasks missing", CMP.replace("--tasks {order}", "--tasks {root}/nope"), "nope", "no such")
case("compare --tasks invalid UTF-8", CMP.replace("--tasks {order}", "--tasks {task_utf8}"), "train.tsv:22",
     "UTF-8")
case("compare --corpus invalid UTF-8", CMP.replace("--corpus {corpus}", "--corpus {utf8_txt}"),
     "corpus_utf8.txt:3001", "UTF-8")
case("compare --corpus missing", CMP.replace("--corpus {corpus}", "--corpus {root}/nope.txt"), "nope.txt",
     "no such")
case("compare --ft-max-length over --max-length", f"{CMP} --ft-max-length 48", "48", "24")
case("compare -o a file", CMP.replace("-o {out}", "-o {afile}"), "afile.txt", "not a folder")
case("compare -o under a file", CMP.replace("-o {out}", "-o {afile}/cmp"), "afile.txt", "not a folder")
case("compare -o read-only folder", CMP.replace("-o {out}", "-o {readonly}"), "readonly", "cannot write",
     patch="readonly")
case("compare disk full", "compare -o {out} --threads 1 --jobs 1 --builtin-size 40 --methods absolute", "{out}",
     "no space left", "kept", patch="diskfull", writes=True)

# -- translate train ----------------------------------------------------------------------------------------
options("translate train", TT, [
    ("--vocab-size", "0", (">= 5",)), ("--vocab-size", "-1", (">= 5",)), ("--max-length", "0", (">= 2",)),
    ("--max-length", "-1", (">= 2",)), ("--batch-size", "0", POS), ("--batch-size", "-1", POS), ("--grad-accum", "0", POS),
    ("--lr", "0", POS), ("--lr", "-1", POS), ("--warmup-steps", "-1", NONNEG),
    ("--label-smoothing", "-0.1", FRACTION), ("--label-smoothing", "1", FRACTION),
    ("--dropout", "-0.1", FRACTION), ("--dropout", "1.5", FRACTION), ("--max-grad-norm", "-1", NONNEG),
    ("--epochs", "0", POS), ("--epochs", "-1", POS), ("--max-steps", "0", POS), ("--max-steps", "-1", POS),
    ("--eval-steps", "0", POS), ("--save-steps", "0", POS), ("--save-total-limit", "1", (">= 2",)),
    ("--logging-steps", "0", POS), ("--max-train-pairs", "0", POS), ("--max-valid-pairs", "0", POS),
    ("--threads", "0", POS), ("--threads", "-1", POS), ("--seed", "-1", NONNEG),
])
case("translate train --vocab-size 3", f"{TT} --vocab-size 3", "--vocab-size", "3", "special tokens")
case("translate train --method field not key=value", f"{TT} --method sinusoidal:hidden_size", "hidden_size",
     "key=value")
case("translate train --method unknown field", f"{TT} --method sinusoidal:colour=red", "colour",
     "DietSeq2SeqConfig")
case("translate train --method bad value", f"{TT} --method sinusoidal:hidden_size=16:num_attention_heads=3",
     "hidden_size=16", "num_attention_heads=3")
case("translate train --method tokenizer field", f"{TT} --method sinusoidal:vocab_size=9", "vocab_size",
     "--vocab-size")
case("translate train --position nope", f"{TT} --position rope", "rope", "absolute")
case("translate train --size nope", f"{TT} --size huge", "--size", "huge", "transformer-base")
case("translate train --bad-lines nope", f"{TT} --bad-lines maybe", "--bad-lines", "maybe", "skip")
case("translate train --data missing", TT.replace("--data {para}", "--data {root}/nope"), "nope", "train")
case("translate train --data without --source", TT.replace("--source de ", ""), "--data", "--source")
case("translate train no data", "translate train --output-dir {out}", "--data", "--train-source")
case("translate train no validation file", TT.replace("{para}", "{pair_noval}"), "val.de", "pair_noval")
case("translate train invalid UTF-8", TT.replace("{para}", "{pair_utf8}"), "train.de:11", "UTF-8")
case("translate train line counts differ", TT.replace("{para}", "{pair_count}"), "10 lines", "11")
case("translate train empty files", TT.replace("{para}", "{pair_empty}"), "train.de", "empty")
case("translate train --train-source missing", "translate train --train-source {root}/nope.de --train-target "
     "{para}/train.en --valid-source {para}/val.de --valid-target {para}/val.en --output-dir {out}",
     "nope.de", "no such")
case("translate train --output-dir a file", TT.replace("--output-dir {out}", "--output-dir {afile}"), "afile.txt",
     "not a folder")
case("translate train --output-dir under a file", TT.replace("--output-dir {out}", "--output-dir {afile}/mt"),
     "afile.txt", "not a folder")
case("translate train --output-dir read-only", TT.replace("--output-dir {out}", "--output-dir {readonly}"),
     "readonly", "cannot write", patch="readonly")
case("translate train disk full", TT, "{out}", "no space left", "kept", patch="diskfull", writes=True)

# -- translate eval -------------------------------------------------------------------------------------------
options("translate eval", TE, [
    ("--beams", "0", POS), ("--beams", "-1", POS), ("--batch-size", "0", POS), ("--batch-size", "-1", POS),
    ("--max-new-tokens", "0", POS), ("--max-new-tokens", "-1", POS), ("--limit", "0", POS), ("--limit", "-1", POS),
    ("--length-penalty", "nan", ("finite",)), ("--threads", "0", POS),
])
case("translate eval --max-new-tokens beyond the table", f"{TE} --max-new-tokens 99", "99",
     "max_position_embeddings=16")
case("translate eval missing model", TE.replace("{mt}", "{root}/nope", 1), "nope", "translation model")
case("translate eval not a model", TE.replace("{mt}", "{notmodel}", 1), "notmodel", "config.json")
case("translate eval truncated safetensors", TE.replace("{mt}", "{mt_truncated}", 1),
     "final/model.safetensors", "truncated")
case("translate eval --source missing", TE.replace("--source {para}/val.de", "--source {root}/nope.de"),
     "nope.de", "no such")
case("translate eval --source invalid UTF-8", TE.replace("--source {para}/val.de", "--source {src_utf8}")
     .replace(" --reference {para}/val.en", ""), "src_utf8.de:2", "UTF-8")
case("translate eval --source empty", TE.replace("--source {para}/val.de", "--source {src_empty}")
     .replace(" --reference {para}/val.en", ""), "src_empty.de", "empty")
case("translate eval --source blank line", TE.replace("--source {para}/val.de", "--source {src_blankline}")
     .replace(" --reference {para}/val.en", ""), "src_blank.de:2", "empty line")
case("translate eval --reference shorter", TE.replace("--reference {para}/val.en", "--reference {ref_short}"),
     "ref_short.en", "has 1")
case("translate eval --output a folder", TE.replace("--output {out}/hyp.txt", "--output {existing}"),
     "existing", "a folder")
case("translate eval --output under a file", TE.replace("--output {out}/hyp.txt", "--output {afile}/hyp.txt"),
     "afile.txt", "not a folder")
case("translate eval --report under a file", f"{TE} --report {{afile}}/r.json", "afile.txt", "not a folder")

# -- bench ------------------------------------------------------------------------------------------------
options("bench", BENCH, [
    ("--repeats", "0", POS), ("--repeats", "-1", POS), ("--warmup", "-1", NONNEG), ("--threads", "0", POS),
    ("--long-length", "0", POS), ("--long-length", "-1", POS),
])
case("bench --lengths 0", f"{BENCH} --lengths 0", "--lengths", "'0'", "positive")
case("bench --backends flex training on the CPU", f"{BENCH} --backends sdpa,flex --modes train", "--backends flex",
     "--modes infer")
case("bench --lengths text", f"{BENCH} --lengths long", "--lengths", "long", "integers")
case("bench --lengths empty", f"{BENCH} --lengths ,", "--lengths", "','")
case("bench --batch 0", f"{BENCH} --batch 0", "--batch", "'0'", "positive")
case("bench --batch count", f"{BENCH} --batch 1,2", "--batch", "2 sizes", "1 lengths")
case("bench --batch beyond memory", f"{BENCH} --batch 10000000", "--batch 10000000", "GiB available", "lower --batch")
case("bench --methods nope", f"{BENCH} --methods rope", "rope", "absolute")
case("bench --methods empty", f"{BENCH} --methods ,", "--methods", "','")
case("bench --modes nope", f"{BENCH} --modes fly", "--modes", "fly", "infer")
case("bench --shapes nope", f"{BENCH} --shapes bert-huge", "bert-huge", "bert-base")
case("bench --long-methods absolute", f"{BENCH} --long --long-methods absolute", "--long-methods", "absolute",
     "diet-rel")
case("bench --long-length without --long", f"{BENCH} --long-length 4096", "--long-length", "without --long")
case("bench --methods twice", f"{BENCH} --methods diet-rel,t5,diet-rel", "--methods", "diet-rel", "more than once")
case("bench --lengths twice", f"{BENCH} --lengths 16,16", "--lengths", "'16,16'", "more than once")
case("bench --json under a file", f"{BENCH} --json {{afile}}/b.json", "afile.txt", "not a folder")
case("bench --markdown a folder", f"{BENCH} --markdown {{existing}}", "existing", "a folder")

# -- device and precision (every command that runs a model) -------------------------------------------------
for _name, _base in (("pretrain", PRE), ("finetune", FT), ("compare", CMP), ("translate train", TT),
                     ("translate eval", TE), ("bench", BENCH), ("analyze", AN)):
    case(f"{_name} --device gpu", f"{_base} --device gpu", "--device", "gpu", "cuda")
    if _name not in ("translate eval", "analyze"):
        case(f"{_name} --precision fp8", f"{_base} --precision fp8", "--precision", "fp8", "bf16")
    if _name in ("pretrain", "finetune", "translate train", "bench"):
        case(f"{_name} --compile nope", f"{_base} --compile fast", "--compile", "fast", "reduce-overhead")
    if not _cuda_available():  # what a machine without CUDA says
        case(f"{_name} --device cuda", f"{_base} --device cuda", "--device cuda", "CUDA is not available")
case("pretrain --precision fp16 on the CPU", f"{PRE} --device cpu --precision fp16", "fp16", "CUDA")

# -- a size far beyond memory: refused before any work, naming the estimate and what is available ----------
_HUGE_BATCH = "--batch-size 1000000 --device-batch-size 1000000"
case("pretrain batch beyond memory", f"{PRE} {_HUGE_BATCH}".replace("--batch-size 4 --device-batch-size 4 ", ""),
     "needs about", "GiB available", "--ignore-memory-check")
case("pretrain length beyond memory", PRE.replace("--max-length 24", "--max-length 1000000") + " --method diet-rel",
     "needs about", "GiB available", "1000000 tokens")
case("compare batch beyond memory", f"{CMP} {_HUGE_BATCH}".replace("--batch-size 4 --device-batch-size 4 ", ""),
     "needs about", "GiB available", "--ignore-memory-check")

# -- an option that does not apply to the task at hand: refused, naming the option and why ---------------
case("pretrain --tokenizer-sample with --tokenizer", f"{PRE} --tokenizer {{model}} --tokenizer-sample 5",
     "--tokenizer-sample", "does not apply", "--tokenizer")
case("pretrain --tokenizer-sample with --init", f"{PRE} --init {{model}}/model --tokenizer-sample 5",
     "--tokenizer-sample", "does not apply", "--init")
case("pretrain --size with --init", f"{PRE} --init {{model}}/model --size bert-mini", "--size", "does not apply",
     "--init")
case("prepare --tokenizer-sample with --tokenizer", f"{PREP} --tokenizer {{model}} --tokenizer-sample 5"
     .replace("--vocab-size 200 ", ""), "--tokenizer-sample", "does not apply", "--tokenizer")
case("prepare --vocab-size with --tokenizer", f"{PREP} --tokenizer {{model}}", "--vocab-size",
     "does not apply", "--tokenizer")
case("compare --tokenizer-sample with --tokenizer", f"{CMP} --tokenizer {{model}} --tokenizer-sample 5",
     "--tokenizer-sample", "does not apply", "--tokenizer")
case("compare --builtin-size with --corpus", f"{CMP} --builtin-size 40", "--builtin-size", "does not apply",
     "--corpus")
case("compare --train-language on the built-in tasks", "compare -o {out} --threads 1 --jobs 1 --train-language de",
     "--train-language", "does not apply", "built-in")
case("finetune --doc-stride on a classification task", f"{FT} --doc-stride 8", "--doc-stride", "does not apply",
     "QA")
case("compare --doc-stride without a QA task", f"{CMP} --doc-stride 8", "--doc-stride", "does not apply", "QA")
case("compare --doc-stride no window has room for", f"{CMP.replace('{order}', '{qa}=qa')} --doc-stride 20",
     "--doc-stride 20", "less than 20", "--ft-max-length 24")
case("translate train --train-source with --data", f"{TT} --train-source {{para}}/train.de", "--train-source",
     "does not apply", "--data")

# -- tokenizers, multilingual corpora, the cross-lingual suite, translation data -------------------------
XT = "compare --suite xtreme -o {out} --threads 1 --jobs 1"
case("pretrain --vocab-size beyond 120k", f"{PRE} --vocab-size 120001", "--vocab-size", "120001", "120,000")
case("pretrain --tokenizer-type nope", f"{PRE} --tokenizer-type sentencepiece", "--tokenizer-type",
     "sentencepiece", "unigram")
case("pretrain --special-tokens not role=name", f"{PRE} --special-tokens cls", "'cls'", "role=name")
case("pretrain --tokenizer-type with --tokenizer", f"{PRE} --tokenizer {{model}} --tokenizer-type unigram",
     "--tokenizer-type", "does not apply", "--tokenizer")
case("pretrain --languages without a corpus per language", f"{PRE} --languages en,xx", "no corpus for language",
     "'en'")
case("pretrain --language-alpha without --languages", f"{PRE} --language-alpha 0.5", "--language-alpha",
     "--languages")
case("compare --suite xtreme --corpus without --tasks", f"{XT} --corpus {{corpus}}", "--corpus", "--tasks")
case("compare --suite xtreme unknown task", f"{XT} --corpus {{corpus}} --languages en --tasks wmt",
     "'wmt'", "xnli, xquad")
case("compare --suite xtreme --data-dir missing", f"{XT} --data-dir {{root}}/nope", "nope", "xnli/")
case("compare --data-dir without --suite", f"{CMP} --data-dir {{root}}", "--data-dir", "does not apply")
case("translate train --batch-tokens with --batch-size", f"{TT} --batch-tokens 256", "--batch-size",
     "--batch-tokens", "not both")
case("translate train --batch-tokens below --max-length", TT.replace("--batch-size 8 ", "") + " --batch-tokens 16",
     "--batch-tokens 16", "--max-length 32")
case("translate eval --length-penalty-form nope", f"{TE} --length-penalty-form t2t", "--length-penalty-form",
     "t2t", "gnmt")
case("translate prepare --pair not L1-L2", "translate prepare -o {out} --pair german --train {para}/train.de "
     "{para}/train.en", "--pair", "german", "L1-L2")
case("translate prepare files that do not align", "translate prepare -o {out} --pair de-en --train "
     "{para}/train.de {pair_count}/train.en", "train.de has", "lines|sentences", "align")
case("translate prepare --pair with the built-in Multi30k", "translate prepare -o {out} --pair xx-yy "
     "--data-dir {root}", "--pair", "Multi30k")
case("translate prepare --dataset with files", "translate prepare -o {out} --dataset wmt/wmt18 --pair de-en "
     "--train {para}/train.de {para}/train.en", "--dataset", "not both")

# -- analyze ----------------------------------------------------------------------------------------------
options("analyze", AN, [
    ("--length", "0", (">= 3",)), ("--length", "-1", (">= 3",)), ("--length", "2", (">= 3",)), ("--batch-size", "0", POS),
    ("--batch-size", "-1", POS), ("--rtol", "-1", ("(0, 1)",)), ("--rtol", "nan", ("(0, 1)",)),
    ("--rtol", "2", ("(0, 1)",)), ("--seed", "-1", NONNEG),
])
case("analyze missing checkpoint", AN.replace("{model}", "{root}/nope", 1), "nope", "no such")
case("analyze not a checkpoint", AN.replace("{model}", "{notmodel}", 1), "notmodel", "config.json")
case("analyze truncated safetensors", AN.replace("{model}", "{truncated}", 1), "truncated/model.safetensors",
     "truncated")
case("analyze invalid config.json", AN.replace("{model}", "{badconfig}", 1), "badconfig/config.json:3", "JSON")
case("analyze --data missing", AN.replace("{analysis_text}", "{root}/nope.txt"), "nope.txt", "no such")
case("analyze --data invalid UTF-8", AN.replace("{analysis_text}", "{utf8_txt}"), "corpus_utf8.txt:3001", "UTF-8")
case("analyze --data empty", AN.replace("{analysis_text}", "{empty_txt}"), "empty.txt", "no text")
case("analyze --tokenizer missing", f"{AN} --tokenizer {{root}}/nope", "nope", "tokenizer")
case("analyze -o a file", AN.replace("-o {out}", "-o {afile}"), "afile.txt", "not a folder")
case("analyze -o under a file", AN.replace("-o {out}", "-o {afile}/an"), "afile.txt", "not a folder")
case("analyze -o read-only", AN.replace("-o {out}", "-o {readonly}"), "readonly", "cannot write",
     patch="readonly")
case("analyze disk full", AN, "{out}", "no space left", "kept", patch="diskfull", writes=True, stub=False)

# -- the top level ----------------------------------------------------------------------------------------
case("unknown command", "train {corpus}", "train", "pretrain")
case("pretrain unknown option", f"{PRE} --stepz 3", "--stepz")
case("pretrain without a corpus", "pretrain", "corpus")
case("translate eval without --source", "translate eval {mt}", "--source")


# -- running a case ---------------------------------------------------------------------------------------

class Reached(Exception):
    """Raised by the stubs: the command accepted its input and started the real work."""


@contextlib.contextmanager
def stubs():
    """Stop every command at the start of its real work (training, timing, analysis, decoding)."""
    from unittest import mock

    import importlib

    import transformers

    analysis_report = importlib.import_module("dietpe.analysis.report")  # the package exports a function `report`
    bench_cost = importlib.import_module("dietpe.bench.cost")
    translate = importlib.import_module("dietpe.tasks.translate")

    def reach(what):
        def stop(*a, **k):
            raise Reached(what)
        return stop

    with mock.patch.object(transformers.Trainer, "train", reach("training")), \
            mock.patch.object(bench_cost, "measure", reach("benchmark")), \
            mock.patch.object(bench_cost, "measure_long", reach("benchmark")), \
            mock.patch.object(analysis_report, "analyze", reach("analysis")), \
            mock.patch.object(translate, "translate", reach("decoding")):
        yield


def _under(path, folder: str) -> bool:
    try:
        p = os.path.abspath(os.fspath(path))
    except TypeError:
        return False
    return p == folder or p.startswith(folder + os.sep)


@contextlib.contextmanager
def refused_writes(folder: str, code: int):
    """Every write, file creation, removal or folder creation under `folder` fails with OSError(code)."""
    import builtins
    from unittest import mock

    folder = os.path.abspath(folder)
    real_open, real_os_open = builtins.open, os.open
    real = {name: getattr(os, name) for name in ("mkdir", "makedirs", "unlink", "remove", "rmdir", "rename",
                                                 "replace")}

    def fail(path):
        raise OSError(code, os.strerror(code), os.fspath(path))

    def fake_open(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+") and _under(file, folder):
            fail(file)
        return real_open(file, mode, *a, **k)

    def fake_os_open(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and _under(path, folder):
            fail(path)
        return real_os_open(path, flags, *a, **k)

    def guard(name):
        def wrapper(path, *a, **k):
            # a read-only folder refuses everything; a full disk still lets you create folders and remove files
            if code != errno.ENOSPC and _under(path, folder):
                fail(path)
            return real[name](path, *a, **k)
        return wrapper

    patches = [mock.patch.object(builtins, "open", fake_open), mock.patch.object(io, "open", fake_open),
               mock.patch.object(os, "open", fake_os_open)]
    patches += [mock.patch.object(os, name, guard(name)) for name in real]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield


@contextlib.contextmanager
def captured_stderr():
    """Everything written to stderr (Python's and file descriptor 2: Rust, C, logging handlers)."""
    box: dict[str, str] = {}
    sys.stderr.flush()
    saved_fd, saved_obj = os.dup(2), sys.stderr
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        sys.stderr = open(2, "w", closefd=False, encoding="utf-8", errors="replace")
        try:
            yield box
        finally:
            sys.stderr.flush()
            sys.stderr = saved_obj
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            tmp.seek(0)
            box["err"] = tmp.read().decode("utf-8", "replace")


@dataclass
class Result:
    case: Case
    argv: list[str]
    rc: int | None
    stderr: str
    outcome: str          # clear / unclear / traceback / silent
    detail: str           # the message (or the exception, or what was reached)
    changed: list[str]    # files created, removed or modified outside the case's own output
    seconds: float


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if os.path.basename(dirpath) == "outs":
            dirnames[:] = []
            continue
        for name in filenames + [d + "/" for d in dirnames]:
            p = os.path.join(dirpath, name.rstrip("/"))
            st = os.stat(p)
            out[p + ("/" if name.endswith("/") else "")] = (st.st_size if name[-1] != "/" else 0,
                                                            st.st_mtime_ns if name[-1] != "/" else 0)
    return out


USAGE = re.compile(r"^(usage: |\s)")
ERROR = re.compile(r"^dietpe( [\w-]+)*: error: ")


def classify(rc, err: str, needles: list[str]) -> tuple[str, str]:
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if ERROR.match(line)]
    others = [line for line in lines if not ERROR.match(line) and not USAGE.match(line)]
    if rc == 0:
        return "silent", "exit code 0"
    message = errors[-1] if errors else (lines[-1] if lines else "")
    missing = [n for n in needles if not any(alt.lower() in message.lower() for alt in n.split("|"))]
    if rc == 2 and len(errors) == 1 and not others and not missing:
        return "clear", message
    why = (f"exit {rc}" if rc != 2 else "") + (f"; other output: {others[0][:80]!r}" if others else "") + \
          (f"; does not name {missing}" if missing else "")
    return "unclear", f"{message} [{why.strip('; ')}]"


def run_case(c: Case, paths: dict[str, str], outs: Path) -> Result:
    import torch

    from dietpe.cli import main

    out = outs / re.sub(r"[^\w.-]+", "_", c.id)
    fmt = dict(paths, out=str(out))
    argv = shlex.split(c.argv.format(**fmt))
    needles = [n.format(**fmt) for n in c.needles]
    root = Path(paths["root"])
    before = snapshot(root)
    rc, exc, reached = None, None, None
    start = time.perf_counter()
    with captured_stderr() as box, contextlib.redirect_stdout(io.StringIO()), contextlib.ExitStack() as st:
        if c.stub:
            st.enter_context(stubs())
        if c.patch == "readonly":
            st.enter_context(refused_writes(paths["readonly"], errno.EACCES))
        elif c.patch == "diskfull":
            st.enter_context(refused_writes(str(out), errno.ENOSPC))
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Reached as e:
            reached = str(e)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # what the console script would print as a traceback (Rust panics too)
            exc = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()[-1]
    seconds = time.perf_counter() - start
    torch.set_num_threads(1)
    err = box["err"]
    if exc is not None:
        outcome, detail = "traceback", exc
    elif reached:
        outcome, detail = "silent", f"accepted: reached {reached}"
    else:
        outcome, detail = classify(rc, err, needles)
    after = snapshot(root)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p)
                     and not (p.endswith("/") and p[:-1] in (paths["readonly"],)))
    if out.exists() and not c.writes and outcome != "silent":
        changed.append(f"{out} (created)")
    if out.exists():
        shutil.rmtree(out, ignore_errors=True)
    if changed:
        restore(paths)  # so that a version which damages fixtures does not change the next cases' inputs
    return Result(c, argv, rc, err, outcome, detail, changed, seconds)


def restore(paths: dict[str, str]) -> None:
    """Put the output-folder fixtures back as make_fixtures wrote them."""
    existing, readonly = Path(paths["existing"]), Path(paths["readonly"])
    (existing / "checkpoint-2").mkdir(parents=True, exist_ok=True)
    (existing / "keep.txt").write_text("earlier work\n")
    (existing / "checkpoint-2" / "model.safetensors").write_bytes(b"\0" * 8)
    (readonly / "checkpoint-4").mkdir(parents=True, exist_ok=True)
    (readonly / "checkpoint-4" / "model.safetensors").write_bytes(b"\0" * 8)


def run_all(root: str | Path, cases: list[Case] | None = None, log=None) -> list[Result]:
    root = Path(root)
    paths = make_fixtures(root / "fixtures")
    outs = Path(paths["root"]) / "outs"
    outs.mkdir()
    cwd = os.getcwd()
    os.chdir(outs)  # default output folders land here, not in the checkout
    try:
        results = []
        for c in cases or CASES:
            r = run_case(c, paths, outs)
            if log:
                log(r)
            results.append(r)
        return results
    finally:
        os.chdir(cwd)


OUTCOMES = ("clear", "unclear", "traceback", "silent")


def counts(results: list[Result]) -> dict[str, int]:
    return {k: sum(r.outcome == k for r in results) for k in OUTCOMES}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write every result as JSON here")
    p.add_argument("--only", help="run only cases whose id contains this text")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--markdown", help="write the table (input, command, message; a before column with --before)")
    p.add_argument("--before", help="the --json of a run on the old version, for --markdown")
    a = p.parse_args(argv)
    cases = [c for c in CASES if not a.only or a.only in c.id]

    def log(r: Result) -> None:
        mark = {"clear": ".", "unclear": "?", "traceback": "T", "silent": "S"}[r.outcome]
        if a.verbose or r.outcome != "clear" or r.changed:
            print(f"{mark} {r.case.id} [{r.seconds:.2f}s]: {r.detail}" + (f" CHANGED {r.changed}" if r.changed
                                                                           else ""), flush=True)

    import dietpe
    print(f"dietpe from {dietpe.__file__}; {len(cases)} cases", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = run_all(tmp, cases, log)
    c = counts(results)
    print(" / ".join(f"{k} {v}" for k, v in c.items()), f"(of {len(results)})")
    rows = [dict(id=r.case.id, command=r.case.command, outcome=r.outcome, detail=r.detail.replace(tmp, "…"))
            for r in results]
    if a.markdown:
        before = {row["id"]: row for row in json.loads(Path(a.before).read_text())} if a.before else {}
        Path(a.markdown).write_text(markdown(rows, before), encoding="utf-8")
    if a.json:
        Path(a.json).write_text(json.dumps([dict(id=r.case.id, command=r.case.command, outcome=r.outcome,
                                                 detail=r.detail.replace(tmp, "…"), rc=r.rc,
                                                 changed=[x.replace(tmp, "…") for x in r.changed],
                                                 seconds=round(r.seconds, 3)) for r in results], indent=1))
    return 0


def _cell(text: str, width: int) -> str:
    text = re.sub(r"/tmp/tmp\w+/fixtures", "…", text).replace("|", "\\|").replace("`", "'")
    return text if len(text) <= width else text[: width - 1] + "…"


def markdown(rows: list[dict], before: dict[str, dict]) -> str:
    """The catalogue as a Markdown table: input, command, the message now, and with `before` (another
    version's --json) what that version did."""
    head = ["#", "input", "command"] + (["before"] if before else []) + ["message"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, row in enumerate(rows, 1):
        message = row["detail"].split(": error: ", 1)[-1]
        now = f"{row['outcome']}: {_cell(message, 150)}" if row["outcome"] == "clear" else \
            f"**{row['outcome']}**: {_cell(row['detail'], 150)}"
        cells = [str(i), _cell(row["id"], 60), row["command"]]
        if before:
            old = before.get(row["id"])
            cells.append(f"**{old['outcome']}**: {_cell(old['detail'], 110)}" if old else "(not run)")
        lines.append("| " + " | ".join(cells + [now]) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
