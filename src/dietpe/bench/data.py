"""Data benchmark: preparing a corpus into shards beside Hugging Face `datasets`, and the time to a first step.

For each size (MB of text, made by repeating a corpus's train text into `--work`, never into the repository):

* `dietpe pretrain` on a fresh cache (prepares the shards, then one step): wall time and peak memory;
* a second method on the same cache (the shards reused, then one step): wall time and peak memory;
* preparation = the difference of the two (everything else is the same work): tokens per second;
* `datasets`: `load_dataset("text")` and a batched `map` with the same fast tokenizer and process count.

Peak memory is the largest sum of PSS (proportional set size: shared pages split between the processes that
map them) over the process and its children, sampled every 0.2 s, so worker processes count once.
Every command gets the same tokenizer (trained once on the source corpus) and the same number of processes;
ratios are taken within one run. Usage:

    python -m dietpe.bench.data --source ../shared/data/wikitext-2 --sizes 30 300 1000 --work /tmp/dietpe-data
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path


def tree_pss(pid: int) -> int:
    from dietpe.extras import need

    psutil = need("psutil")
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except psutil.Error:
            pass
    return total


def measure(command: list[str], env=None, log=None) -> dict:
    """Wall seconds and peak PSS (bytes) of a command and its children."""
    start = time.time()
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    peak = [0]

    def watch():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_pss(proc.pid))
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    rc = proc.wait()
    t.join()
    seconds = time.time() - start
    if rc != 0:
        tail = Path(log).read_text()[-2000:] if log else ""
        raise SystemExit(f"{' '.join(command)} failed ({rc}):\n{tail}")
    return dict(seconds=seconds, peak=peak[0])


def make_corpus(source: Path, folder: Path, megabytes: int) -> Path:
    """`folder/train.txt` of about `megabytes` MB (the source's train text repeated) and its valid.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    train = folder / "train.txt"
    text = (source / "train.txt").read_bytes()
    want = megabytes * 1_000_000
    if not train.exists() or train.stat().st_size < want:
        with open(train, "wb") as f:
            written = 0
            while written < want:
                f.write(text)
                written += len(text)
    shutil.copy(source / "valid.txt", folder / "valid.txt")
    return folder


DATASETS_MAP = r"""
import sys, datasets
from transformers import PreTrainedTokenizerFast
path, tok, procs, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
tokenizer = PreTrainedTokenizerFast.from_pretrained(tok)
ds = datasets.load_dataset("text", data_files={"train": path}, cache_dir=cache)["train"]
out = ds.map(lambda b: {"input_ids": tokenizer(b["text"], add_special_tokens=False)["input_ids"]},
             batched=True, num_proc=procs, remove_columns=["text"], cache_file_name=cache + "/map.arrow")
print(sum(len(x) for x in out.with_format("numpy")["input_ids"]))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dietpe.bench.data", description=__doc__.splitlines()[0])
    p.add_argument("--source", default="../shared/data/wikitext-2",
                   help="a corpus folder with train.txt, repeated to each size (default: %(default)s)")
    p.add_argument("--sizes", type=int, nargs="+", default=[30, 300, 1000], help="MB of text")
    p.add_argument("--work", default="/tmp/dietpe-data-bench", help="scratch folder (corpora, caches, runs)")
    p.add_argument("--processes", type=int, default=2,
                   help="tokenizing processes, the same for dietpe and datasets (default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=1000,
                   help="WordPiece vocabulary of the tokenizer every command shares (default: %(default)s)")
    p.add_argument("--no-datasets", action="store_true", help="skip the `datasets` comparison (time)")
    p.add_argument("-o", "--output", help="write the results as JSON here too")
    args = p.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    py = sys.executable
    dietpe = [py, "-m", "dietpe.cli"]

    tok = work / "tokenizer"
    if not (tok / "tokenizer.json").is_file():
        from dietpe.data.shards import prepare
        prepared = prepare(str(args.source), vocab_size=args.vocab_size, cache_dir=work / "tok-cache",
                           processes=args.processes, log=lambda m: None)
        prepared.tokenizer.save_pretrained(tok)

    rows = []
    for mb in args.sizes:
        corpus = make_corpus(Path(args.source), work / f"corpus-{mb}", mb)
        cache = work / f"cache-{mb}"
        shutil.rmtree(cache, ignore_errors=True)
        common = [str(corpus), "--tokenizer", str(tok), "--recipe", "toy", "--steps", "1", "--max-validation",
                  "64", "--cache-dir", str(cache), "--threads", str(args.processes), "--overwrite"]
        first = measure(dietpe + ["pretrain", *common, "--method", "absolute", "-o", str(work / f"run-{mb}-a")],
                        env, work / f"first-{mb}.log")
        second = measure(dietpe + ["pretrain", *common, "--method", "diet-rel", "-o", str(work / f"run-{mb}-b")],
                         env, work / f"second-{mb}.log")
        manifest = json.loads(next((cache / "shards").glob("*/manifest.json")).read_text())
        tokens = manifest["train"]["tokens"]
        if args.no_datasets:
            hf, hf_tokens = dict(seconds=float("nan"), peak=float("nan")), 0
        else:
            hf_cache = work / f"hf-{mb}"
            shutil.rmtree(hf_cache, ignore_errors=True)
            hf_cache.mkdir()
            hf = measure([py, "-c", DATASETS_MAP, str(corpus / "train.txt"), str(tok), str(args.processes),
                          str(hf_cache)], env, work / f"datasets-{mb}.log")
            shutil.rmtree(hf_cache, ignore_errors=True)
            hf_tokens = int(Path(work / f"datasets-{mb}.log").read_text().split()[-1])
        prep_s = max(first["seconds"] - second["seconds"], 1e-9)
        row = dict(mb=mb, text_bytes=(corpus / "train.txt").stat().st_size, tokens=tokens,
                   first_s=first["seconds"], first_peak=first["peak"], second_s=second["seconds"],
                   second_peak=second["peak"], prepare_s=prep_s, prepare_tok_s=tokens / prep_s,
                   datasets_s=hf["seconds"], datasets_peak=hf["peak"], datasets_tokens=hf_tokens,
                   datasets_tok_s=hf_tokens / hf["seconds"],
                   speed_ratio=hf["seconds"] / prep_s)  # same text: the ratio of text per second
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(table(rows))
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=1))
    return 0


def table(rows) -> str:
    gb = 1 << 30
    lines = ["| text | train tokens | `dietpe pretrain` first run (prepare + 1 step) | peak | second method "
             "(shards reused) | peak | second / first | preparation tokens/s | `datasets` map tokens/s | "
             "`datasets` peak | ours / `datasets` (text/s) |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['text_bytes'] / 1e6:.0f} MB | {r['tokens'] / 1e6:.1f} M | {r['first_s']:.0f} s | "
                     f"{r['first_peak'] / gb:.2f} GB | {r['second_s']:.0f} s | {r['second_peak'] / gb:.2f} GB | "
                     f"{r['second_s'] / r['first_s']:.0%} | {r['prepare_tok_s'] / 1e3:.0f} k | "
                     f"{r['datasets_tok_s'] / 1e3:.0f} k | {r['datasets_peak'] / gb:.2f} GB | "
                     f"{r['speed_ratio']:.2f}x |")
    if len(rows) > 1:
        base = rows[0]
        for r in rows[1:]:
            lines.append(f"\npeak of `dietpe pretrain` at {r['mb']} MB / at {base['mb']} MB: "
                         f"{r['first_peak'] / base['first_peak']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    from dietpe.errors import module_main

    sys.exit(module_main(main, "python -m dietpe.bench.data"))
