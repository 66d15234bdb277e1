"""How an attached model's attention modules reach diet's one equation, whatever attention implementation the
model is set to.

Hugging Face's attention modules look their function up by the config's `_attn_implementation` through
`ALL_ATTENTION_FUNCTIONS.get_interface(name, default)`. `install` (run by the first `attach`, never by
importing dietpe) wraps that lookup: a module that carries an attached method gets diet's equation, every
other module gets exactly the function Hugging Face would have given it. The model keeps its own
implementation name, so Hugging Face's masks (`is_causal` or a block mask when nothing is padded, a dense mask
only with padding), `set_attn_implementation`, `from_pretrained(attn_implementation=...)` and
`output_attentions` keep their meaning, and the method is never dropped by a change of implementation.

A layer whose method adds nothing inside attention (`none`, input methods, `rotary` computed by the model's own
RoPE module) runs Hugging Face's own function: the native model's kernel, grouped key heads and mask. A layer
with terms runs diet's backend for the implementation: `eager` the reference (it returns the probabilities),
`flex_attention` FlexAttention with the model's block mask, `sdpa` what diet's registry serves best on the
device (`auto_backend`: on CUDA a fused backend or FlexAttention with a causal block mask, so no
(B, H, L, L) tensor is built; on the CPU torch's SDPA with one (1, H, L, L) bias and `is_causal` masks kept
as a mask shared by the layers). Flash-attention implementations cannot add logit terms: refused in one line.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from transformers.modeling_utils import AttentionInterface

from dietpe.attention.masks import CausalMask, additive
from dietpe.attention.registry import ALL_BACKENDS, resolve_backend, serving_backend
from dietpe.errors import ConfigError
from dietpe.integrations.forward import layer_terms

#: Hugging Face's implementation -> diet's backend computing the same thing ("auto": by the device)
BACKEND_OF = {"eager": "eager", "sdpa": "auto", "flex_attention": "flex", None: "auto"}
#: on CUDA, "auto" takes the first of these that is registered and serves the layer (a fused kernel, if one is
#: registered under this name, then FlexAttention), else sdpa
CUDA_PREFERENCE = ("fused", "flex")

_original_get_interface = None


def install() -> None:
    """Wrap `AttentionInterface.get_interface` once (the first `attach`)."""
    global _original_get_interface
    if _original_get_interface is not None:
        return
    _original_get_interface = AttentionInterface.get_interface

    def get_interface(self, attn_implementation, default):
        found = _original_get_interface(self, attn_implementation, default)
        return functools.partial(_dispatch, attn_implementation, found)

    AttentionInterface.get_interface = get_interface


def _dispatch(implementation, found, module, query, key, value, attention_mask, *args, **kwargs):
    attached = module.__dict__.get("_dietpe")
    if attached is None or not attached.acts_in_attention:
        return found(module, query, key, value, attention_mask, *args, **kwargs)
    return attend(attached, implementation, module, query, key, value, attention_mask, **kwargs)


def known(implementation: str | None) -> bool:
    """Whether transformers itself accepts this implementation name (its registered functions, eager, a kernel
    from the hub); an unknown name is left to transformers' own error."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return implementation in BACKEND_OF or implementation in ALL_ATTENTION_FUNCTIONS.valid_keys() \
        or (isinstance(implementation, str) and "/" in implementation)


def refusal(implementation: str | None) -> str | None:
    """Why a method with attention terms cannot run under this implementation, or None."""
    if implementation in BACKEND_OF:
        return None
    return (f"attn_implementation={implementation!r} cannot add the method's logit terms; use 'sdpa', 'eager' or "
            f"'flex_attention'")


def auto_backend(query: Tensor, value_terms: bool, dropout: float, skip: frozenset = frozenset()) -> str:
    """The backend diet's registry serves a layer with for `query`: on CUDA the first of CUDA_PREFERENCE that
    is registered, can serve it and takes this call, else what `attn_backend="auto"` picks (sdpa; Shaw's
    banded paths), past the backends that decline the call (a kernel off CUDA or under compilation)."""
    if query.device.type == "cuda":
        for name in CUDA_PREFERENCE:
            backend = ALL_BACKENDS.get(name)
            if name not in skip and backend is not None and not _declines(backend, query) and \
                    backend.refusal(value_terms=value_terms, dropout=dropout) is None:
                return name
    backend = resolve_backend("auto", value_terms=value_terms, dropout=dropout)
    while _declines(backend, query) and backend.fallback is not None:
        backend = backend.fallback
    return backend.name


def _declines(backend, query: Tensor) -> bool:
    return backend.skip is not None and backend.skip(query)


def _backend(attached, implementation, query, terms, dropout) -> tuple[str, bool]:
    """(backend name, whether it was chosen by "auto")."""
    name = attached.backend or BACKEND_OF.get(implementation)
    if name is None:
        raise ConfigError(f"attach: {refusal(implementation)}")
    value_terms = bool(terms.values)
    if name == "auto":
        return auto_backend(query, value_terms, dropout, attached.unservable), True
    if dropout > 0 and ALL_BACKENDS[name].refusal(value_terms=False, dropout=dropout):
        return "sdpa" if not value_terms else "eager", False  # flex has no dropout: training with it
    return serving_backend(name, value_terms=value_terms).name, False


def _mask(attached, mask, causal: bool, lq: int, lk: int, dtype: torch.dtype, device, flex: bool):
    """Hugging Face's mask as diet's backends take it, once per forward: None; causality alone as a
    `CausalMask` (or a causal block mask for FlexAttention); booleans as the additive mask; additive masks and
    block masks as they are. Also returns the rows with no key to attend to (booleans only), or None."""
    if mask is None:
        if not (causal and lq > 1):
            return None, None
        cache = attached.state.masks if attached.state is not None and not torch.compiler.is_compiling() else {}
        key = ("causal", lq, lk, dtype, flex)
        if key not in cache:
            cache[key] = _causal_block_mask(lq, lk, device) if flex else CausalMask(lq, dtype, device)
        return cache[key], None
    cache = attached.state.masks if attached.state is not None and not torch.compiler.is_compiling() else {}
    if not flex and _is_block_mask(mask):  # a flex model's layer served by another backend (Shaw, backend=)
        hit = cache.get("block")
        if hit is None or hit[0] is not mask:
            hit = cache["block"] = (mask, _dense(mask, lq, lk, device))
        mask = hit[1]
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        return mask, None
    hit = cache.get("bool")
    if hit is not None and hit[0] is mask and hit[1] == dtype:
        return hit[2], hit[3]
    converted, empty = additive(mask, dtype), ~mask.any(-1, keepdim=True)  # (B|1, 1, Lq, 1)
    cache["bool"] = (mask, dtype, converted, empty)
    return converted, empty


def _is_block_mask(mask) -> bool:
    return type(mask).__name__ == "BlockMask"  # FlexAttention's; imported only where one is met


def _dense(mask, lq: int, lk: int, device) -> Tensor:
    """A FlexAttention block mask as the boolean (B|1, H|1, Lq, Lk) mask it stands for, evaluated from its
    mask_mod: the other backends read dense masks."""
    from torch.nn.attention.flex_attention import create_mask

    b, h = mask.kv_num_blocks.shape[:2]
    return create_mask(mask.mask_mod, b, h, lq, lk, device=device)


def _causal_block_mask(lq: int, lk: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = lk - lq  # queries are the last lq of the lk positions
    return create_block_mask(lambda b, h, q, k: q + offset >= k, None, None, lq, lk, device=device,
                             _compile=device.type == "cuda")


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    if groups == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, groups, n, d).reshape(b, h * groups, n, d)


def _filled(attached, key: Tensor, value: Tensor, mask, causal: bool):
    """A static cache's keys, values and mask cut to its filled slots: the rest are blocked, and cut, the
    queries are the last of the keys, as the relative terms' diagonals (`Runs`) and the kernels read them. A
    sliding window's cache holds fewer slots than were seen and is left whole, as is a compiled forward's (its
    count is a tensor)."""
    state = attached.state
    seen = None if state is None else state.seen
    if not causal or not isinstance(seen, int) or key.shape[2] <= seen:
        return key, value, mask
    if mask is not None and not (isinstance(mask, Tensor) and mask.shape[-1] == key.shape[2]):
        return key, value, mask  # a mask of another kind (flex's block mask) covers every slot
    return key[:, :, :seen], value[:, :, :seen], None if mask is None else mask[..., :seen]


def attend(attached, implementation, module, query: Tensor, key: Tensor, value: Tensor, attention_mask,
           scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """Hugging Face's attention-function contract over diet's equation: q (B, H, Lq, Dh), k and v
    (B, Hkv, Lk, Dh) -> out (B, Lq, H, Dh), probabilities (B, H, Lq, Lk) or None."""
    layer = module.__dict__["_dietpe_layer"]
    lq = query.shape[2]
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", False) if causal is None else causal
    key, value, attention_mask = _filled(attached, key, value, attention_mask, causal)
    lk = key.shape[2]
    terms = layer_terms(attached, layer, lk, query.device, attached.recomputing(layer))
    name, auto = _backend(attached, implementation, query, terms, dropout)
    key = _repeat_kv(key, query.shape[1] // key.shape[1])
    value = _repeat_kv(value, query.shape[1] // value.shape[1])
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    mask, empty = _mask(attached, attention_mask, causal, lq, lk, query.dtype, query.device, name == "flex")
    try:
        out, probs = ALL_BACKENDS[name](query, key, value, terms, mask, scaling, dropout, name == "eager")
    except ConfigError:
        if not auto:
            raise
        attached.unservable = attached.unservable | {name}  # a term this backend cannot serve: sdpa from now on
        mask, empty = _mask(attached, attention_mask, causal, lq, lk, query.dtype, query.device, False)
        out, probs = ALL_BACKENDS["sdpa"](query, key, value, terms, mask, scaling, dropout, False)
        name = "sdpa"
    if empty is not None and name != "eager":  # as Hugging Face's sdpa and flex: a row with no key gives zeros
        out = out.masked_fill(empty, 0.0)
    return out.transpose(1, 2).contiguous(), probs
