"""A small trained BERT for `dietpe pretrain --init` experiments (docs/causal.md, "Continued pre-training"): a
BertForMaskedLM of the bert-tiny shape trained with plain transformers on a corpus folder, saved with safetensors
and its WordPiece tokenizer.

usage: python scripts/train_tiny_bert.py OUT STEPS CORPUS_DIR VOCAB    (e.g. OUT 1200 data/corpus 1000)"""
import sys
import time

if len(sys.argv) < 5:
    sys.exit("usage: python scripts/train_tiny_bert.py OUT STEPS CORPUS_DIR VOCAB")
import torch
from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling
from dietpe.data.tokenizer import train_wordpiece
torch.set_num_threads(1); torch.manual_seed(0)
out = sys.argv[1]; steps = int(sys.argv[2]); L = 64
lines = [l.strip() for l in open(sys.argv[3] + '/train.txt') if l.strip() and not l.strip().startswith('=')]
tok = train_wordpiece(lines, vocab_size=int(sys.argv[4]))
ids = []
for enc in tok(lines, add_special_tokens=False)["input_ids"]:
    ids.extend(enc + [tok.sep_token_id])
n = L - 2
blocks = [[tok.cls_token_id] + ids[i:i + n] + [tok.sep_token_id] for i in range(0, len(ids) - n, n)]
print(len(blocks), "blocks", flush=True)
cfg = BertConfig(vocab_size=len(tok), hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512,
                 max_position_embeddings=128, pad_token_id=tok.pad_token_id)
model = BertForMaskedLM(cfg)
coll = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / (0.06 * steps)) * max(0.0, (steps - s) / steps))
g = torch.Generator().manual_seed(0); t0 = time.time()
for step in range(steps):
    idx = torch.randint(len(blocks), (32,), generator=g)
    b = coll([{"input_ids": blocks[i]} for i in idx])
    loss = model(**b).loss
    loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step(); sched.step(); opt.zero_grad()
    if step % 200 == 0: print(step, round(loss.item(), 3), round(time.time() - t0), flush=True)
model.save_pretrained(out, safe_serialization=True); tok.save_pretrained(out)
print("done", round(time.time() - t0))
