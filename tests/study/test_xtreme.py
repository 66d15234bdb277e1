"""`dietpe compare --suite xtreme`: the built-in data split (no evaluated example trained or pre-trained on),
the data folder's lookup, tasks by Hugging Face name, the per-language measures and claims, and the whole suite
on tiny multilingual data (every method, zero-shot per language, the report with verdicts)."""

import json
import random

import pytest

from dietpe.cli import main as cli
from dietpe.data import xtreme as XD
from dietpe.errors import ConfigError, DataError
from dietpe.methods import parse_method
from dietpe.study import xtreme as XS

LANGS = ("en", "de", "fr")
# three "languages" with their own words for the same things, so that every language's text differs
WORDS = {"en": "cat dog sun tree red big small runs sleeps",
         "de": "katze hund sonne baum rot gross klein rennt schlaeft",
         "fr": "chat chien soleil arbre rouge grand petit court dort"}


def sentence(rng, lang, k=5):
    return " ".join(rng.choices(WORDS[lang].split(), k=k)) + " ."


def write_xnli(folder, langs=LANGS, premises=6, split_names=("dev",), labels=True, seed=0):
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split in split_names:
        for lang in langs:
            rows = []
            for p in range(premises):
                premise = f"{lang} {split} premise {p} " + sentence(rng, lang)
                for h, label in enumerate(("neutral", "contradiction", "entailment")):
                    cells = [premise, f"{lang} {split} hypothesis {p} {h} " + sentence(rng, lang)]
                    rows.append("\t".join(cells + ([label] if labels else [])))
            (folder / f"{split}-{lang}.tsv").write_text("\n".join(rows) + "\n")
    return folder


def squad(articles, lang, seed=0, questions=2):
    rng = random.Random(seed)
    data = []
    for a in range(articles):
        paragraphs = []
        for p in range(2):
            context = f"{lang} article {a} paragraph {p} " + " ".join(sentence(rng, lang) for _ in range(2))
            qas = []
            for q in range(questions):
                answer = context.split()[4 + q]
                qas.append(dict(id=f"{a}-{p}-{q}", question=f"{lang} which word {q} ?",
                                answers=[dict(text=answer, answer_start=context.index(" " + answer + " ") + 1)]))
            paragraphs.append(dict(context=context, qas=qas))
        data.append(dict(title=f"t{a}", paragraphs=paragraphs))
    return dict(data=data, version="1.1")


def test_the_built_in_split_keeps_evaluated_examples_out_of_training_and_pre_training(tmp_path):
    shared = tmp_path / "shared"
    write_xnli(shared / "xnli", split_names=("dev",), premises=6)
    write_xnli(shared / "xnli", split_names=("test",), labels=False, premises=4, seed=1)
    (shared / "xquad").mkdir()
    for lang in ("en", "de"):
        (shared / "xquad" / f"xquad.{lang}.json").write_text(json.dumps(squad(12, lang)))
    paths = XD.write_builtin(shared, tmp_path / "out")
    assert paths["languages"] == ("de", "en", "fr")
    train = (paths["xnli"] / "train-en.tsv").read_text().splitlines()
    held = {lang: (paths["xnli"] / f"dev-{lang}.tsv").read_text().splitlines() for lang in LANGS}
    # premises 0, 1, 3, 4 trained on in English; 2 and 5 evaluated, in every language, never trained on
    assert sorted({r.split()[3] for r in train}) == ["0", "1", "3", "4"] and len(train) == 12
    assert all(sorted({r.split()[3] for r in rows}) == ["2", "5"] and len(rows) == 6 for rows in held.values())
    corpus = {lang: (paths["corpus"] / f"{lang}.txt").read_text() for lang in LANGS}
    assert all(" dev " not in text for text in corpus.values())  # pre-trained on the unlabelled test text only
    assert "fr test premise 3" in corpus["fr"] and "fr test hypothesis 3 2" in corpus["fr"]
    qa_train = json.loads((paths["xquad"] / "train-en.json").read_text())["data"]
    qa_eval = json.loads((paths["xquad"] / "xquad.de.json").read_text())["data"]
    assert [a["title"] for a in qa_train] == ["t0", "t1", "t2", "t3", "t4", "t6", "t7", "t8", "t9", "t10"]
    assert [a["title"] for a in qa_eval] == ["t5", "t11"]
    assert "de article 0 paragraph 0" in corpus["de"] and "de article 5" not in corpus["de"]


def test_the_data_folder_is_found_or_named(tmp_path, monkeypatch):
    shared = tmp_path / "work" / "shared" / "data"
    (shared / "xnli").mkdir(parents=True)
    (shared / "xquad").mkdir()
    inner = tmp_path / "work" / "wt" / "branch"
    inner.mkdir(parents=True)
    monkeypatch.chdir(inner)
    monkeypatch.delenv("DIETPE_DATA", raising=False)
    assert XD.find_data_dir(None) == shared  # shared/data above the working directory
    monkeypatch.setenv("DIETPE_DATA", str(shared))
    assert XD.find_data_dir(None) == shared
    with pytest.raises(DataError, match=r"nowhere: --data-dir lacks xnli/, xquad/"):
        XD.find_data_dir(str(tmp_path / "nowhere"))
    monkeypatch.setenv("DIETPE_DATA", str(tmp_path / "nowhere"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(XD, "__file__", str(tmp_path / "pkg" / "xtreme.py"))
    with pytest.raises(DataError, match="no data folder with xnli/ and xquad/ found .*--data-dir"):
        XD.find_data_dir(None)


def test_tasks_by_hugging_face_name_map_labels_and_tydiqa_languages(monkeypatch, tmp_path):
    import datasets

    def fake(name, split):
        if "xnli" in name:  # the Hub's ids: 0 entailment, 1 neutral, 2 contradiction; -1 unlabelled
            return datasets.Dataset.from_dict(dict(premise=["p1", "p2", "p3"], hypothesis=["h1", "h2", "h3"],
                                                   label=[0, 2, -1]))
        ids = ["finnish-1", "telugu-2", "finnish-3"] if "tydiqa" in name else ["a", "b", "c"]
        return datasets.Dataset.from_dict(dict(id=ids, question=["q?"] * 3, context=["the answer is x"] * 3,
                                               answers=[dict(text=["x"], answer_start=[14])] * 3))

    monkeypatch.setattr(XD, "load_hf_dataset", fake)
    xnli = XD.load_item(XD.TaskItem.parse("xnli"), "train", "test", "en", None)
    assert sorted(xnli.evals) == sorted(XD.XNLI_LANGUAGES) and xnli.source == "huggingface:facebook/xnli:{lang}"
    assert [e.label for e in xnli.train] == [1, 0]  # entailment, contradiction in NLI_LABELS; -1 dropped
    mlqa = XD.load_item(XD.TaskItem.parse("mlqa"), "train", "test", "en", None)
    assert mlqa.spec.name == "MLQA" and sorted(mlqa.evals) == sorted(XD.MLQA_LANGUAGES)  # MLQA's own scoring
    tydi = XD.load_item(XD.TaskItem.parse("tydiqa@my/squad"), "train", "dev", "en", None)
    assert {k: len(v) for k, v in tydi.evals.items()} == {"fi": 2, "te": 1}
    (tmp_path / "train-v1.1.json").write_text(json.dumps(squad(2, "en")))
    local = XD.load_item(XD.TaskItem.parse(f"xquad@{tmp_path / 'train-v1.1.json'}"), "train", "test", "en", None)
    assert len(local.train) == 8 and sorted(local.evals) == sorted(XD.XQUAD_LANGUAGES)  # local train, Hub evals
    with pytest.raises(ConfigError, match="'wmt' is not one of xnli, xquad, mlqa, tydiqa"):
        XD.TaskItem.parse("wmt=data")


def test_local_evaluation_sets_with_a_training_set_by_hugging_face_name(monkeypatch, tmp_path):
    """TASK=FOLDER@NAME (docs/xtreme.md): the folder's languages are evaluated, the Hub's rows train; the folder
    needs no training file of its own."""
    import datasets

    def fake(name, split):
        if "xnli" in name or "mnli" in name:
            return datasets.Dataset.from_dict(dict(premise=["p1", "p2"], hypothesis=["h1", "h2"], label=[0, 2]))
        return datasets.Dataset.from_dict(dict(id=["a", "b", "c"], question=["q?"] * 3,
                                               context=["the answer is x"] * 3,
                                               answers=[dict(text=["x"], answer_start=[14])] * 3))

    monkeypatch.setattr(XD, "load_hf_dataset", fake)
    folder = tmp_path / "xquad"
    folder.mkdir()
    for lang in ("de", "fr"):
        (folder / f"xquad.{lang}.json").write_text(json.dumps(squad(1, lang)))
    qa = XD.load_item(XD.TaskItem.parse(f"xquad={folder}@rajpurkar/squad"), "train", "dev", "en", None)
    assert len(qa.train) == 3 and sorted(qa.evals) == ["de", "fr"] and len(qa.evals["de"]) == 4
    nli = tmp_path / "xnli"
    nli.mkdir()
    for lang in ("en", "fr"):
        (nli / f"dev-{lang}.tsv").write_text("p\th\tneutral\n")
    data = XD.load_item(XD.TaskItem.parse(f"xnli={nli}@facebook/xnli:en"), "train", "dev", "en", None)
    assert [e.label for e in data.train] == [1, 0] and sorted(data.evals) == ["en", "fr"]


def unit(seed, scores: dict[str, dict[str, dict[str, float]]]):
    tasks = {}
    for task, per in scores.items():
        metrics = list(next(iter(per.values())))
        tasks[task] = dict(metrics=metrics, per_set=per, averaged={m: 0.0 for m in metrics}, runs=[])
    return dict(method="absolute", seed=seed, val_loss=3.0, curves={}, tasks=tasks)


def test_measures_average_languages_zero_shot_and_the_table():
    u = unit(0, {"XNLI": {"en": {"accuracy": 60.0}, "de": {"accuracy": 40.0}, "fr": {"accuracy": 50.0}},
                 "XQuAD": {"en": {"f1": 30.0, "exact_match": 20.0}, "de": {"f1": 10.0, "exact_match": 4.0}}})
    m = XS.measures_for("en")(u, ["XNLI", "XQuAD"])
    assert m["XNLI:de:accuracy"] == 40.0 and m["XNLI:accuracy"] == 50.0 and m["XNLI:zero-shot:accuracy"] == 45.0
    assert m["XQuAD:f1"] == 20.0 and m["XQuAD:zero-shot:exact_match"] == 4.0
    assert m["score"] == pytest.approx((50.0 + 20.0 + 12.0) / 3)  # Table 3's Avg: acc, F1, EM
    assert m["zero_shot_score"] == pytest.approx((45.0 + 10.0 + 4.0) / 3)


def test_every_claim_compares_rows_of_the_named_lists():
    rows = set(XS.method_list("xtreme-all", 8, 128))
    assert set(XS.method_list("xtreme-core", 8, 128)) <= set(XS.method_list("xtreme", 8, 128)) <= rows
    for claim in XS.xtreme_claims(8, 128):
        for c in claim.comparisons:
            assert {n for n in (c.better, c.worse, c.third) if n} <= rows, (claim.key, c)
    assert parse_method("diet-abs:sharing=layer:position_rank=16").name in XS.method_list("xtreme", 8, 128)


def test_table_3s_rows_at_the_papers_length():
    """At 512 tokens: Shaw as `papers` has it (±1024, Table 6's count), the Linformer rows "(dp=256)": k = d_p =
    256 for both, DIET-ABS-LIN's rank included."""
    rows = {parse_method(s).name for s in XS.method_list("xtreme-all", 64, 512)}
    for spec in ("shaw:shaw_max_distance=1024", "absolute:attention=linformer:linformer_k=256",
                 "diet-abs:segment=input:attention=linformer:linformer_k=256:position_rank=256"):
        assert parse_method(spec).name in rows, spec


def write_suite_data(root):
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    rng = random.Random(3)
    for lang in LANGS:
        docs = ["\n".join(sentence(rng, lang) for _ in range(3)) for _ in range(40)]
        (corpus / f"{lang}.txt").write_text("\n\n".join(docs) + "\n")
    xnli = write_xnli(root / "xnli", premises=4)
    train = (xnli / "dev-en.tsv").read_text() * 3
    (xnli / "train-en.tsv").write_text(train)
    qa = root / "qa"
    qa.mkdir()
    (qa / "train-en.json").write_text(json.dumps(squad(6, "en", seed=5)))
    for lang in ("en", "de"):
        (qa / f"xquad.{lang}.json").write_text(json.dumps(squad(2, lang, seed=6)))
    return corpus, xnli, qa


def test_the_suite_runs_every_method_zero_shot_per_language_and_states_the_claims(tmp_path):
    corpus, xnli, qa = write_suite_data(tmp_path / "data")
    out = tmp_path / "suite"
    command = ["compare", "--suite", "xtreme", "--corpus", str(corpus), "--languages", ",".join(LANGS),
               "--tasks", f"xnli={xnli}", f"xquad={qa}", "--eval-split", "dev", "--methods",
               "absolute,diet-rel", "--size", "toy", "--vocab-size", "80", "--max-length", "32",
               "--steps", "2", "--save-steps", "2", "--batch-size", "8", "--epochs", "1", "--ft-batch-size", "8",
               "--ft-max-length", "32", "--doc-stride", "8", "--lrs", "1e-3", "--pretrain-seeds", "2", "--threads",
               "1", "--jobs", "1", "-o", str(out)]
    assert cli(command) == 0
    results = json.loads((out / "results.json").read_text())
    assert [m["method"] for m in results["methods"]] == ["absolute", "diet-rel"]
    for m in results["methods"]:
        assert sorted(m["seeds"]) == ["0", "1"]
        for seed in m["seeds"].values():
            assert {f"XNLI:{lang}:accuracy" for lang in LANGS} <= set(seed)
            assert {"XQuAD:en:f1", "XQuAD:de:f1", "XQuAD:de:exact_match", "score", "zero_shot_score"} <= set(seed)
            zero = [seed[f"XNLI:{lang}:accuracy"] for lang in ("de", "fr")]
            assert seed["XNLI:zero-shot:accuracy"] == pytest.approx(sum(zero) / 2)
    report = (out / "report.md").read_text()
    assert report.index("## Claims") < report.index("## Results") < report.index("## Per language")
    assert "| Per-head position beats input position" in report and "`diet-rel − absolute`" in report
    not_run = report[report.index("**Not run**"):report.index("## Environment")]
    assert "Sharing hurts DIET-REL" in not_run and "Per-head segments" in not_run  # their rows were not run
    assert any(v in report for v in ("**supported**", "**contradicted**", "**not resolved at this budget**"))
    assert "| Method | en* | de | fr | avg | zero-shot avg |" in report  # XNLI per language, en fine-tuned on
    assert "| Method | en* | de | avg | zero-shot avg |" in report      # XQuAD
    assert "| *chance* |" in report and "| en | " in report  # chance row; the sampling table
    assert "Exponent rule q_i ∝ p_i^α, α = 0.5" in report
    seeds = (out / "seeds.csv").read_text()
    (out / "report.md").unlink()
    assert cli(command) == 0  # a rerun reuses every run and writes the same numbers
    assert (out / "seeds.csv").read_text() == seeds


def test_suite_options_are_checked_before_any_work(tmp_path, capsys):
    assert cli(["compare", "--suite", "xtreme", "--corpus", "x", "-o", str(tmp_path / "a")]) == 2
    assert "give both --corpus and --tasks" in capsys.readouterr().err
    assert cli(["compare", "--suite", "xtreme", "--builtin-size", "10", "-o", str(tmp_path / "b")]) == 2
    assert "--builtin-size does not apply to --suite xtreme" in capsys.readouterr().err
    assert cli(["compare", "--data-dir", "x", "-o", str(tmp_path / "c")]) == 2
    assert "--data-dir does not apply without --suite xtreme" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_claim_over_rows_partly_run_is_not_supported_by_the_rows_that_were():
    # the built-in core rows run three of "every per-head row over BERT's" six comparisons
    rows = []
    for spec in XS.core_methods(8):
        name = parse_method(spec).name
        rows.append(dict(method=name, head_size=8, position_rank=0,
                         seeds={k: {"score": 70.0 if name == "absolute" else 75 + k / 2, "mlm": 2.0}
                                for k in range(3)}))
    md, _ = XS.claims_section(rows, XS.xtreme_claims(8, 128))
    line = next(x for x in md.splitlines() if x.startswith("| Per-head position beats input position"))
    assert line.endswith("**not resolved at this budget (3 of 6 not run)** |")
    assert "rows not run: shaw" in line and "rows not run: t5" in line
