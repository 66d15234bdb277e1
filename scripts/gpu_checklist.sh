#!/usr/bin/env bash
# The GPU checklist of docs/gpu.md in one go; every output goes under OUT (default gpu-checklist-<UTC time>).
#
#   scripts/gpu_checklist.sh [OUT] [STEP ...]      steps: env preflight tests flex bench pretrain determinism
#                                                  (and, when named, xtreme: the cross-lingual suite, docs/xtreme.md)
#
# Without a GPU it runs what needs none (environment, the CPU/meta preflight tests), then stops in one line.
# Each step writes OUT/<step>.txt (and its own files); OUT/summary.txt lists what ran and its exit status.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu-checklist-$(date -u +%Y%m%dT%H%M%SZ)}
shift || true
STEPS=${*:-env preflight tests flex bench pretrain determinism}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
PY=${PYTHON:-python}

step() {  # step NAME COMMAND...: run, keep its output, record its status
    local name=$1; shift
    echo "[gpu_checklist] $name" >&2
    local start=$SECONDS
    "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "$name rc=$rc $((SECONDS - start))s" >> "$OUT/summary.txt"
    [ $rc -eq 0 ] || echo "[gpu_checklist] $name failed (rc $rc): see $OUT/$name.txt" >&2
}

wants() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }

if wants env; then
    step env bash -c "$PY - <<'EOF'
import platform, torch, transformers
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)
print('python', platform.python_version(), platform.machine())
print('cuda available', torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print('device', p.name, f'{p.total_memory / 2**30:.1f} GiB', f'capability {p.major}.{p.minor}',
          'count', torch.cuda.device_count())
EOF
nvidia-smi || true"
fi
if wants preflight; then  # the GPU paths as the CPU and the meta device see them
    step preflight $PY -m pytest -q -p no:cacheprovider tests/attention/test_gpu_paths.py tests/bench/test_cost.py
fi

if ! $PY -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    left=$(for s in $STEPS; do case $s in env|preflight) ;; *) printf '%s ' "$s";; esac; done)
    echo "gpu_checklist: CUDA is not available on this machine; the remaining steps (${left% }) need a GPU; outputs so far in $OUT" >&2
    exit 3
fi

if wants tests; then  # backend, reference, flex (head size 16, backward), compile and pipeline tests on the GPU
    step tests env DIET_TEST_DEVICE=cuda $PY -m pytest -q -p no:cacheprovider tests/attention \
        tests/positions/test_references.py tests/models/test_compile.py tests/tasks/test_pipeline.py
fi
if wants flex; then  # flex forward and backward against eager at bert-small, 512 tokens: errors and times
    step flex $PY - <<'EOF'
import time, torch
from dietpe import DietConfig, DietModel
torch.manual_seed(0)
ids = torch.randint(1, 30000, (4, 512), device="cuda")
mask = torch.ones_like(ids); mask[-1, 400:] = 0
seg = torch.zeros_like(ids); seg[:, 256:] = 1
print("| method | max abs Δ out | max rel Δ grad (position params) | eager ms | sdpa ms | flex ms (fwd+bwd) |")
print("|---|--:|--:|--:|--:|--:|")
for position, segment in (("diet-rel", "per-head"), ("t5", "none"), ("alibi", "none"), ("kerple", "none"),
                          ("diet-abs", "per-head"), ("tupe-r", "none"), ("fire", "none")):
    models, outs, grads, ms = {}, {}, {}, {}
    for backend in ("eager", "sdpa", "flex"):
        torch.manual_seed(0)
        cfg = DietConfig.from_preset("bert-small", position=position, segment=segment, attn_backend=backend,
                                     attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
        model = DietModel(cfg).cuda().train()
        for i in range(4):
            if i == 3:
                torch.cuda.synchronize(); start = time.perf_counter()
            model.zero_grad()
            out = model(ids, mask, seg).last_hidden_state
            out.float().square().mean().backward()
        torch.cuda.synchronize(); ms[backend] = (time.perf_counter() - start) * 1e3
        outs[backend] = out.detach()
        grads[backend] = {n: p.grad for n, p in model.named_parameters() if n.startswith("positions") and p.grad is not None}
    d_out = (outs["flex"] - outs["eager"]).abs().max().item()
    d_grad = max(((grads["flex"][n] - g).abs().max() / g.abs().max().clamp_min(1e-12)).item()
                 for n, g in grads["eager"].items()) if grads["eager"] else float("nan")
    print(f"| {position}{'+seg' if segment == 'per-head' else ''} | {d_out:.1e} | {d_grad:.1e} | {ms['eager']:.1f} "
          f"| {ms['sdpa']:.1f} | {ms['flex']:.1f} |")
EOF
fi
if wants bench; then  # dietpe bench on CUDA beside BertModel and T5EncoderModel, fp32 (TF32) and bf16
    step bench_fp32 dietpe bench --device cuda --peers --shapes bert-small,bert-base --lengths 128,512 \
        --markdown "$OUT/bench_fp32.md" --json "$OUT/bench_fp32.json"
    step bench_bf16 dietpe bench --device cuda --precision bf16 --peers --shapes bert-base --lengths 512,2048 \
        --batch 8,2 --no-memory --long --long-length 8192 --markdown "$OUT/bench_bf16.md" --json "$OUT/bench_bf16.json"
fi
if wants pretrain || wants determinism; then
    $PY -c "from dietpe.data.synthetic import write_builtin; write_builtin('$OUT/data', seed=0)" > /dev/null
fi
PRE="--recipe cpu --steps 300 --batch-size 64 --device-batch-size 64 --threads 4"
if wants pretrain; then  # a short bf16 pre-training: it ends, writes its results, and its loss is finite
    step pretrain_bf16 dietpe pretrain "$OUT/data/corpus" --method diet-rel:segment=per-head --device cuda \
        --precision bf16 $PRE -o "$OUT/pretrain_bf16"
    step pretrain_fp32 dietpe pretrain "$OUT/data/corpus" --method diet-rel:segment=per-head --device cuda \
        --precision fp32 $PRE -o "$OUT/pretrain_fp32"
fi
if wants determinism; then  # two deterministic runs: the same bits? and two runs without the switch
    for run in a b; do
        step "det_$run" dietpe pretrain "$OUT/data/corpus" --method t5 --device cuda --deterministic $PRE \
            -o "$OUT/det_$run"
        step "nondet_$run" dietpe pretrain "$OUT/data/corpus" --method t5 --device cuda --no-deterministic $PRE \
            -o "$OUT/nondet_$run"
    done
    step determinism $PY - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
from safetensors.torch import load_file
out = Path(sys.argv[1])
for kind in ("det", "nondet"):
    a, b = (json.loads((out / f"{kind}_{r}" / "pretrain_results.json").read_text()) for r in "ab")
    wa, wb = (load_file(out / f"{kind}_{r}" / "model" / "model.safetensors") for r in "ab")
    same = all((wa[k] == wb[k]).all().item() for k in wa)
    print(f"{kind}: val_loss {a['val_loss']!r} vs {b['val_loss']!r}; weights identical: {same}")
EOF
fi
if wants xtreme; then  # the built-in cross-lingual suite with 8x the pre-training (docs/xtreme.md): 2 rows x 3 seeds
    step xtreme dietpe compare --suite xtreme --device cuda --jobs 1 --threads 4 --methods absolute,diet-rel \
        --steps 2000 --save-steps 500 --cache-dir "$OUT/cache" -o "$OUT/xtreme"
fi
echo "[gpu_checklist] done: $OUT/summary.txt" >&2
cat "$OUT/summary.txt"
