"""Masked accuracy of a BERT checkpoint and of diet runs on one fixed masking of a corpus's valid.txt (256 blocks
of 64 tokens; docs/causal.md, "Continued pre-training"). A path ending in `bert` is read as transformers' BERT.

usage: python scripts/masked_accuracy.py CORPUS_DIR TOKENIZER_DIR MODEL [MODEL ...]"""
import sys

if len(sys.argv) < 4:
    sys.exit("usage: python scripts/masked_accuracy.py CORPUS_DIR TOKENIZER_DIR MODEL [MODEL ...]")
import torch
from transformers import BertForMaskedLM, DataCollatorForLanguageModeling
from dietpe import DietForMaskedLM
from dietpe.data.tokenizer import load_tokenizer
torch.set_num_threads(1)
tok = load_tokenizer(sys.argv[2]); L = 64; n = L - 2
lines = [l.strip() for l in open(sys.argv[1] + '/valid.txt') if l.strip() and not l.strip().startswith('=')]
ids = []
for enc in tok(lines[:600], add_special_tokens=False)["input_ids"]:
    ids.extend(enc + [tok.sep_token_id])
blocks = [[tok.cls_token_id] + ids[i:i + n] + [tok.sep_token_id] for i in range(0, len(ids) - n, n)][:256]
torch.manual_seed(123)
batch = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)([{"input_ids": b} for b in blocks])
for path in sys.argv[3:]:
    m = (BertForMaskedLM if path.rstrip('/').endswith('bert') else DietForMaskedLM).from_pretrained(path).eval()
    with torch.no_grad():
        logits = m(input_ids=batch["input_ids"]).logits
    sel = batch["labels"] != -100
    acc = (logits.argmax(-1)[sel] == batch["labels"][sel]).float().mean().item()
    print(f"{path}: masked accuracy {acc:.3f} over {int(sel.sum())} tokens", flush=True)
