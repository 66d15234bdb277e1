"""What a GPU run takes that a CPU run does not, checked on the CPU: the `meta` device (or the GPU with
DIET_TEST_DEVICE=cuda) takes the non-CPU branches; mocks stand in for several GPUs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dietpe import DietForMaskedLM, DietModel
from dietpe.attention import backends
from dietpe.errors import ConfigError
from dietpe.models.causal import DietForCausalLM
from dietpe.tasks import runtime
from tests.conftest import batch, tiny

ROOT = Path(__file__).resolve().parents[2]


class HostSyncs(TorchDispatchMode):
    """Counts the ops that copy a value to the host (`.item()`, `int(t)`, `bool(t)`: `_local_scalar_dense`);
    on `meta` it answers 0 in their place, so one run lists every sync instead of stopping at the first."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.seen.append(str(func))
            if args[0].device.type == "meta":
                return 0
        return func(*args, **(kwargs or {}))


TRAINED = [dict(position="absolute"), dict(position="diet-rel", segment="per-head"),
           dict(position="diet-abs", segment="per-head"), dict(position="tupe-r"), dict(position="t5"),
           dict(position="alibi"), dict(position="rotary"), dict(position="shaw"), dict(position="xlnet"),
           dict(position="kerple"), dict(position="diet-rel", segment="input", sharing="layer")]


@pytest.mark.parametrize("cfg", TRAINED, ids=lambda c: ":".join(c.values()))
def test_a_training_step_never_waits_for_the_device(cfg, probe_device):
    """Forward and backward of an MLM step with padding and segments copy nothing to the host."""
    model = DietForMaskedLM(tiny(**cfg)).to(probe_device).train()
    ids, mask, seg = batch(9, device=probe_device)
    syncs = HostSyncs()
    with syncs:
        loss = model(ids, attention_mask=mask, token_type_ids=seg, labels=ids).loss
        loss.backward()
    assert syncs.seen == [], f"{len(syncs.seen)} host syncs in a training step"


def test_a_causal_training_step_never_waits_for_the_device(probe_device):
    from dietpe import DietCausalConfig

    model = DietForCausalLM(DietCausalConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=32, position="alibi"))
    model = model.to(probe_device).train()
    ids = torch.randint(1, 50, (2, 9)).to(probe_device)
    with HostSyncs() as syncs:
        model(ids, labels=ids).loss.backward()
    assert syncs.seen == []


def test_an_inference_forward_reads_its_inputs_in_three_copies():
    """At inference the checks read values (a GPU waits for each read): the ids' range, the segments' range and
    whether anything is padded, each range's minimum and maximum in one copy (`errors.value_range`)."""
    reads = []

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("_local_scalar_dense", "aminmax", "min", "max", "nonzero", "equal"):
                reads.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    model = DietModel(tiny(position="diet-rel", segment="per-head")).eval()
    ids, mask, seg = batch(9)
    with torch.no_grad(), Reads():
        model(ids, attention_mask=mask, token_type_ids=seg)
    assert sorted(reads) == ["_local_scalar_dense", "aminmax", "aminmax"]


def test_the_cpu_still_refuses_bad_ids_in_training():
    """The checks stay where they are free: a CPU training step still names an id outside the vocabulary."""
    from dietpe.errors import InputError

    model = DietForMaskedLM(tiny()).train()
    ids = torch.full((1, 5), 50)
    with pytest.raises(InputError, match="outside the vocabulary"):
        model(ids, labels=ids)


FOLDED = [dict(position="diet-abs"), dict(position="tupe-a"), dict(position="none", segment="per-head"),
          dict(position="diet-abs", segment="per-head"), dict(position="tupe-r", segment="per-head")]


@pytest.mark.parametrize("cfg", FOLDED, ids=lambda c: ":".join(c.values()))
@pytest.mark.parametrize("pad", [0, 3])
def test_folded_widths_reach_sdpa_as_fused_kernels_need_them(cfg, pad, probe_device, monkeypatch):
    """Off the CPU every low-rank term is folded into q/k channels: the width the kernel gets is a multiple
    of 8 (the memory-efficient kernel), and without a bias v has q's width too (flash)."""
    seen = []
    real = backends.run_sdpa

    def watch(q, k, v, bias, dropout_p, scale):
        seen.append((q.shape[-1], k.shape[-1], v.shape[-1], bias is not None))
        return real(q, k, v, bias, dropout_p, scale)

    monkeypatch.setattr(backends, "run_sdpa", watch)
    model = DietModel(tiny(head_size=64, **cfg, attn_backend="sdpa")).to(probe_device).train()
    ids, mask, seg = batch(9, pad_last=pad, device=probe_device)
    model(ids, attention_mask=mask if pad else None, token_type_ids=seg).last_hidden_state.sum().backward()
    assert seen
    for q, k, v, has_bias in seen:
        assert q == k and q % backends.GPU_WIDTH_MULTIPLE == 0 and q > 64, seen
        assert v == (64 if has_bias else q), seen


def test_zero_channels_change_nothing():
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 7, 8)

    class Term:
        def factors(self):
            return torch.randn(1, 2, 5, 3), torch.randn(1, 2, 7, 3)

    term = Term()
    torch.manual_seed(1)
    q1, k1 = backends.fold_low_rank(q, k, [term], 0.5)
    torch.manual_seed(1)
    q8, k8 = backends.fold_low_rank(q, k, [term], 0.5, multiple=8)
    assert q1.shape[-1] == 11 and q8.shape[-1] == 16 and k8.shape[-1] == 16
    torch.testing.assert_close(q8 @ k8.transpose(-1, -2), q1 @ k1.transpose(-1, -2))


def test_mlm_loss_feeds_the_model_on_its_device():
    """After training on a GPU the model is there and the collator's batch on the CPU: moved before the call."""
    from dietpe.tasks.pretrain import mlm_loss

    class Seen(Exception):
        pass

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(3, device="meta"))

        def forward(self, **inputs):
            self.devices = {name: t.device.type for name, t in inputs.items()}
            raise Seen

    def collate(items):
        ids = torch.tensor([item["input_ids"] for item in items])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    probe = Probe()
    with pytest.raises(Seen):
        mlm_loss(probe, [{"input_ids": [1, 2, 3]}], collate)
    assert probe.devices == {"input_ids": "meta", "attention_mask": "meta", "labels": "meta"}


def test_one_block_mask_per_forward_whatever_the_layers(monkeypatch):
    """FlexAttention's block mask depends on the mask only: one per forward, not one per layer."""
    import warnings

    from torch.nn.attention import flex_attention as fa

    built = []
    real = fa.create_block_mask

    def count(*args, **kwargs):
        built.append(args[3:5])
        return real(*args, **kwargs)

    monkeypatch.setattr(fa, "create_block_mask", count)
    model = DietModel(tiny(position="diet-rel", segment="per-head", num_hidden_layers=3,
                           attn_backend="flex")).eval()  # per-layer terms: no LayerTerms shared
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (1, 2):
            ids, mask, seg = batch(9)
            model(ids, attention_mask=mask, token_type_ids=seg)
            assert len(built) == n
    assert built == [(9, 9), (9, 9)]


def test_fully_masked_rows_stay_finite_in_bfloat16():
    """Under bf16 autocast float32's minimum becomes -inf; a row with no key to see must not give NaN, in the
    eager reference (probabilities asked for, Shaw in training) and in sdpa."""
    ids, mask, seg = batch(8)
    mask[0] = 0  # nothing to attend to in the first example
    for cfg in (dict(attn_backend="eager"), dict(attn_backend="sdpa", position="diet-rel"), dict(position="shaw"),
                dict(attn_backend="sdpa", position="diet-abs", segment="per-head")):
        model = DietForMaskedLM(tiny(**cfg)).train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(ids, attention_mask=mask, token_type_ids=seg, labels=ids, output_attentions=True)
        assert torch.isfinite(out.logits).all(), cfg
        out.loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None), cfg


def test_fit_mask_keeps_blocked_entries_at_the_dtypes_minimum():
    mask = torch.tensor([0.0, torch.finfo(torch.float32).min])
    for dtype in (torch.bfloat16, torch.float16):
        fitted = backends.fit_mask(mask, dtype)
        assert fitted.dtype == dtype and fitted[1] == torch.finfo(dtype).min and fitted[0] == 0


# -- the training commands' device, precision, determinism and batch --------------------------------------------

def test_device_args_map_precision_to_the_trainer():
    assert runtime.trainer_device_args("cpu", "bf16") == dict(use_cpu=True, bf16=True, fp16=False,
                                                              full_determinism=False)
    assert runtime.trainer_device_args("cpu", "fp32", deterministic=True)["full_determinism"] is False
    with pytest.raises(ConfigError, match="fp16 needs CUDA"):
        runtime.trainer_device_args("cpu", "fp16")
    with pytest.raises(ConfigError, match="allowed values"):
        runtime.trainer_device_args("cpu", "fp8")
    # compiling: an inductor mode, or a backend that makes no code
    assert runtime.trainer_device_args("cpu", compile="reduce-overhead") == dict(
        use_cpu=True, bf16=False, fp16=False, full_determinism=False, torch_compile=True,
        torch_compile_backend="inductor", torch_compile_mode="reduce-overhead")
    assert runtime.trainer_device_args("cpu", compile="aot_eager")["torch_compile_backend"] == "aot_eager"
    with pytest.raises(ConfigError, match="--compile 'fast': allowed values are default, reduce-overhead"):
        runtime.trainer_device_args("cpu", compile="fast")


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without CUDA says")
def test_cuda_without_cuda_is_one_clear_error():
    with pytest.raises(ConfigError, match="CUDA is not available"):
        runtime.resolve_device("cuda")
    assert runtime.resolve_device(None).type == "cpu"


def test_determinism_on_cuda_asks_the_trainer_for_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    calls = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda flag, **kw: calls.append(flag))
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    args = runtime.trainer_device_args("cuda", "bf16", deterministic=True)
    assert args == dict(use_cpu=False, bf16=True, fp16=False, full_determinism=True)
    assert calls == [True] and os.environ["CUBLAS_WORKSPACE_CONFIG"] == runtime.CUBLAS_WORKSPACE


def test_batch_layout_counts_the_gpus_of_data_parallel(monkeypatch):
    """Without torchrun the Trainer's DataParallel multiplies the per-device batch by n_gpu."""
    assert runtime.batch_layout(64, 16, n_gpu=1) == (16, 4)
    assert runtime.batch_layout(64, 16, n_gpu=2) == (16, 2)  # 16 x 2 GPUs x 2 accumulation
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert runtime.data_parallel_devices() == 4
    assert runtime.batch_layout(64, 64) == (16, 1)
    with pytest.raises(ConfigError, match="4 GPUs"):
        runtime.batch_layout(6, 6)
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun: one GPU per process, no DataParallel
    assert runtime.data_parallel_devices() == 1 and runtime.batch_layout(64, 64) == (32, 1)


def test_lm_trains_in_bfloat16_on_the_cpu():
    from dietpe.tasks.lm import causal_config, train_lm

    config = causal_config("alibi", "toy", 40, 8, 0)
    stream = torch.randint(1, 40, (400,)).tolist()
    _, _, losses = train_lm(config, stream, 4, 4, 8, 1e-3, 0, log=lambda m: None, precision="bf16")
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))


def test_asking_for_cuda_tests_without_cuda_says_so_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env = dict(os.environ, DIET_TEST_DEVICE="cuda")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_config.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "DIET_TEST_DEVICE=cuda: CUDA is not available" in lines[0], lines


def test_pretrain_runs_in_bfloat16_and_records_it(tmp_path):
    """A short bf16 pre-training on the CPU: autocast through Trainer, a finite loss, the precision recorded."""
    import json

    from dietpe import methods
    from dietpe.data import synthetic
    from dietpe.tasks import pretrain as pt

    data = synthetic.write_builtin(tmp_path / "data", seed=0, documents=40, train=8, dev=8)
    s = dict(size="toy", vocab_size=200, max_length=24, steps=3, batch_size=8, lr=2e-3, warmup=0.1, save_steps=3,
             weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0)
    res = pt.run_pretrain(pt.PretrainJob(str(data["corpus"]), methods.parse_method("diet-rel:segment=per-head"),
                                         tmp_path / "run", pt.PretrainSettings(**s), quiet=True, report_to="none",
                                         device="cpu", precision="bf16"))
    assert res["steps"] == 3 and 0 < res["val_loss"] < 20
    settings = json.loads((tmp_path / "run" / "run_settings.json").read_text())
    assert settings["precision"] == "bf16"


def test_a_translation_training_step_never_waits_for_the_device(probe_device):
    from dietpe.models.seq2seq import DietForConditionalGeneration
    from tests.models.test_seq2seq import tiny_s2s

    model = DietForConditionalGeneration(tiny_s2s("t5")).to(probe_device).train()
    src = torch.randint(3, 40, (2, 7)).to(probe_device)
    mask = torch.ones_like(src)
    mask[1, 5:] = 0
    labels = torch.randint(3, 40, (2, 5)).to(probe_device)
    with HostSyncs() as syncs:
        model(src, mask, labels=labels).loss.backward()
    assert syncs.seen == []


def test_packed_documents_train_without_waiting_for_the_device(probe_device):
    """A 4-D mask (packed documents) is checked on the CPU, not in a GPU training step."""
    model = DietForMaskedLM(tiny(position="diet-rel")).to(probe_device).train()
    ids = torch.randint(1, 50, (2, 8)).to(probe_device)
    doc = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1]])
    keep = (doc[:, None, :, None] == doc[:, None, None, :]).to(probe_device)  # (B, 1, L, L)
    with HostSyncs() as syncs:
        model(ids, attention_mask=keep, labels=ids).loss.backward()
    assert syncs.seen == []
