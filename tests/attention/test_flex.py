"""FlexAttention as it is meant to be used: every logit term a score_mod (or folded into q/k), padding and
causality a block mask, and no (Lq, Lk) bias built for relative, distance or segment terms. Forward only
on the CPU (its backward needs CUDA: DIET_TEST_DEVICE=cuda runs these tests there, backward included, with
head size 16, flex's smallest on a GPU)."""

import itertools
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from dietpe import DietModel
from dietpe.attention import backends
from dietpe.config import POSITIONS, SEGMENTS
from dietpe.errors import ConfigError
from dietpe.models.seq2seq import DietForConditionalGeneration
from tests.conftest import batch, head_size_for, tiny
from tests.models.test_seq2seq import source, tiny_s2s

L = 11  # no other size here is 11 (TUPE's folded rank is 10), so (..., 11, 11) can only be a query-key term


def _valid(**kw):
    try:
        tiny(**kw)
        return True
    except ConfigError:
        return False


MATRIX = [dict(position=p, segment=s, sharing=h, attention=a)
          for p, s, h, a in itertools.product(POSITIONS, SEGMENTS, ("none", "layer"), ("full", "linformer"))
          if p != "shaw" and _valid(position=p, segment=s, sharing=h, attention=a)]
PER_EXAMPLE = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6], [9, 4, 2, 0, 1, 3, 5, 7, 9, 11, 20]])


def _pair(device="cpu", **cfg):
    size = head_size_for(device)
    ref = DietModel(tiny(size, **cfg, attn_backend="eager")).eval()
    with torch.no_grad():  # position terms large enough that a wrong one shows
        for p in ref.positions.parameters():
            p.copy_(torch.randn_like(p))
    flex = DietModel(tiny(size, **cfg, attn_backend="flex")).eval()
    flex.load_state_dict(ref.state_dict())
    return ref.to(device), flex.to(device)


class PairwiseTensors(TorchDispatchMode):
    """Records every float tensor of shape (..., Lq, Lk) an op returns while `active`."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.dim() >= 2 \
                    and tuple(t.shape[-2:]) == (L, L):
                self.seen.append((str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("cfg", MATRIX, ids=lambda c: ":".join(c.values()))
def test_flex_matches_eager_and_builds_no_query_key_tensor(cfg, monkeypatch, device):
    ref, flex = _pair(device, **cfg)
    ids, mask, seg = batch(L, device=device)
    position_ids = None if cfg["attention"] == "linformer" else PER_EXAMPLE.to(device)
    recorder = PairwiseTensors()
    real = backends.run_flex

    def kernel_unwatched(*args):  # the kernel's own scores are its business (fused on CUDA)
        with _disable_current_modes():
            return real(*args)

    monkeypatch.setattr(backends, "run_flex", kernel_unwatched)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex warns that it runs unfused outside torch.compile on CPU
        want = ref(ids, mask, seg, position_ids=position_ids).last_hidden_state
        with recorder:
            got = flex(ids, mask, seg, position_ids=position_ids).last_hidden_state
    torch.testing.assert_close(got, want, atol=3e-5, rtol=1e-4)
    assert recorder.seen == [], f"flex built query-key tensors: {recorder.seen}"


def test_flex_serves_a_causal_decoder_through_its_block_mask():
    cfg = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref = DietForConditionalGeneration(tiny_s2s("t5", attn_backend="eager", **cfg)).eval()
    flex = DietForConditionalGeneration(tiny_s2s("t5", attn_backend="flex", **cfg)).eval()
    flex.load_state_dict(ref.state_dict())
    src, mask = source()
    target = torch.randint(3, 40, (3, 6))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(flex(src, mask, decoder_input_ids=target).logits,
                                   ref(src, mask, decoder_input_ids=target).logits, atol=3e-5, rtol=1e-4)


def test_every_term_offers_a_score_mod_or_factors():
    """What flex_plan refuses never occurs for a valid config: each method's terms can be served."""
    for cfg in MATRIX:
        model = DietModel(tiny(**cfg))
        pos = torch.arange(L)
        seg = torch.zeros(1, L, dtype=torch.long)
        ctx = model.positions.context(pos, pos, seg, starts=(0, 0))
        terms = model.positions.layer_terms(ctx, 0)
        mods, fold = backends.flex_plan(terms, torch.zeros(1, 2, L, 8))
        assert len(mods) + len(fold) == len(terms.logits)


LEARNED = [dict(position="diet-rel", segment="per-head", sharing="none", attention="full"),
           dict(position="t5", segment="per-head", sharing="layer", attention="full"),
           dict(position="kerple", segment="none", sharing="none", attention="full"),
           dict(position="diet-abs", segment="per-head", sharing="none", attention="full"),
           dict(position="tupe-r", segment="none", sharing="none", attention="full")]


@pytest.mark.parametrize("cfg", LEARNED, ids=lambda c: ":".join(c.values()))
def test_flex_backward_gives_the_references_gradients_of_learned_tables(cfg, device):
    """On CUDA the gradients of the tables a score_mod reads (DIET-REL's R, T5's buckets, KERPLE's r,
    segments' Ŝ) and of folded factors equal the eager reference's; on the CPU flex refuses to train."""
    ref, flex = _pair(device, **cfg)
    ids, mask, seg = batch(L, device=device)
    if device.type != "cuda":
        with pytest.raises(ConfigError, match="backward needs CUDA"):
            flex(ids, mask, seg)
        return
    grads = []
    projection = torch.randn(L, ref.config.hidden_size, device=device)  # a loss whose gradients are not ~0
    for model in (ref, flex):
        model.train()
        (model(ids, mask, seg).last_hidden_state * projection).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if n.startswith("positions")})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-4, rtol=1e-3, msg=name)


# Twelve configurations, every kind of score_mod (tables over offsets, distances, FIRE, segments, XLNet's
# query-times-offset, folded factors), with other head counts, layer counts and lengths, in one process.
CONFIGURATIONS = [dict(position="diet-rel", segment="per-head"), dict(position="t5", num_attention_heads=4),
                  dict(position="alibi"), dict(position="kerple", num_hidden_layers=3),
                  dict(position="fire"), dict(position="tupe-r", num_attention_heads=4),
                  dict(position="xlnet"), dict(position="diet-abs", segment="per-head"),
                  dict(position="diet-rel", sharing="layer", num_attention_heads=4),
                  dict(position="t5", segment="per-head", num_hidden_layers=3),
                  dict(position="alibi", num_attention_heads=4), dict(position="fire", num_attention_heads=4)]


def test_one_compiled_kernel_per_kind_serves_every_layer_and_configuration(device, monkeypatch):
    """Compiled flex (inductor on CUDA; dynamo with its eager backend on the CPU, which makes the same
    guards and recompiles) serves twelve configurations in one process with the recompile limit's error
    switched on: score_mods are module-level functions whose tensors are inputs, so the layers of a model, and
    models of one kind, share a kernel. On CUDA the backward too, against eager, with a loss with real
    gradients."""
    monkeypatch.setattr(backends, "_FLEX_KERNELS", {})
    if device.type != "cuda":
        real = backends.compiled_flex
        monkeypatch.setattr(backends, "flex_compiled", lambda q: True)
        monkeypatch.setattr(backends, "compiled_flex", lambda kind: real(kind, backend="eager"))
    torch._dynamo.reset()
    calls = 0
    for n, cfg in enumerate(CONFIGURATIONS):
        heads = cfg.get("num_attention_heads", 2)
        size = head_size_for(device)
        ref, flex = _pair(device, **{**cfg, "hidden_size": heads * size})
        length = 9 + n % 3
        ids, mask, seg = batch(length, device=device)
        position_ids = PER_EXAMPLE[:, :length].to(device) if n % 3 == 0 else None
        calls += flex.config.num_hidden_layers
        if device.type != "cuda":
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = flex(ids, mask, seg, position_ids=position_ids).last_hidden_state
                want = ref(ids, mask, seg, position_ids=position_ids).last_hidden_state
            torch.testing.assert_close(got, want, atol=3e-5, rtol=1e-4, msg=str(cfg))
            continue
        projection = torch.randn(length, heads * size, device=device)
        grads, outs = [], []
        for model in (ref, flex):
            model.train()
            out = model(ids, mask, seg, position_ids=position_ids).last_hidden_state
            (out * projection).sum().backward()
            outs.append(out.detach())
            grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
        torch.testing.assert_close(outs[1], outs[0], atol=3e-5, rtol=1e-4, msg=str(cfg))
        for name, g in grads[0].items():
            torch.testing.assert_close(grads[1][name], g, atol=1e-4, rtol=1e-3, msg=f"{cfg}: {name}")
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    graphs = {backends.flex_kind_name(kind): len(_debug_get_cache_entry_list(fn._torchdynamo_orig_callable.__code__))
              for kind, fn in backends._FLEX_KERNELS.items()}
    # a kind compiles its first shapes static, then once more with dynamic shapes (and per input rank:
    # positions per example): a few graphs per kind, never one per layer or model
    assert len(graphs) == 8 and max(graphs.values()) <= 3 and sum(graphs.values()) < calls, (graphs, calls)


def test_wide_heads_get_flex_tiles_that_fit_a_gpu_and_ordinary_ones_flex_own_choice():
    """Rows wider than FLEX_ROW_BYTES in the kernel's tiles (a power of two of channels) get small tiles."""
    assert backends.flex_kernel_options(64, torch.float32) is None
    assert backends.flex_kernel_options(128, torch.float32) is None  # 512 bytes: flex's defaults compiled
    assert backends.flex_kernel_options(130, torch.bfloat16) is None  # 256 channels in the tiles, 512 bytes
    small = backends.flex_kernel_options(130, torch.float32)  # TUPE's fold: 256 channels, 1 KiB a row
    assert small == backends.FLEX_SMALL_TILES and small is not backends.FLEX_SMALL_TILES
    assert backends.flex_kernel_options(257, torch.bfloat16) == backends.FLEX_SMALL_TILES
