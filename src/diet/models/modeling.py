"""diet Transformer encoders as Hugging Face models, in BERT's block layout (Devlin et al. 2019):

    h_0 = LayerNorm(token + input position + input segment)          (input terms, if the method has them)
    a   = LayerNorm(h + Dropout(W_O · Attention(h; LayerTerms_l)))    (qk, logit and value terms per layer)
    h'  = LayerNorm(a + Dropout(W_2 · GELU(W_1 a)))

The position encoding builds every layer's terms once per forward from positions (and segments) alone and
passes them down; layers never look at the method's name.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers import initialization as hf_init
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
)

from diet.attention.layer import MultiHeadAttention
from diet.config import DietConfig
from diet.errors import InputError
from diet.positions.encoding import PositionEncoding
from diet.positions.method import PositionMethod
from diet.positions.segments import InputSegments


def padding_mask(attention_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """(B, Lk) 1 = keep, 0 = pad  ->  additive (B, 1, 1, Lk), or None when nothing is padded."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return ((1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min)


class DietPreTrainedModel(PreTrainedModel):
    config_class = DietConfig
    config: DietConfig
    base_model_prefix = "diet"
    supports_gradient_checkpointing = False
    _no_split_modules = ["DietLayer"]
    # our losses are means over the batch: Trainer must scale them for accumulation and DDP itself
    accepts_loss_kwargs = False

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, (PositionMethod, InputSegments)):
            module.reset_parameters(std)
        elif isinstance(module, MultiHeadAttention) and module.proj_k is not None:
            hf_init.normal_(module.proj_k, std=1.0 / module.proj_k.shape[0])
            hf_init.normal_(module.proj_v, std=1.0 / module.proj_v.shape[0])
        elif isinstance(module, DietLMHead):
            hf_init.zeros_(module.bias)


class DietEmbeddings(nn.Module):
    """Token embeddings plus whatever the position encoding adds at the input."""

    def __init__(self, config: DietConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, extra: Tensor | None) -> Tensor:
        x = self.word_embeddings(input_ids)
        if extra is not None:
            x = x + extra.to(x.dtype)
        return self.dropout(self.LayerNorm(x))


class DietLayer(nn.Module):
    def __init__(self, config: DietConfig):
        super().__init__()
        self.attention = MultiHeadAttention(config, linformer=config.attention == "linformer")
        self.attention_output = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden, terms, mask, key_padding, need_probs):
        attn, probs, _ = self.attention(hidden, terms, mask, key_padding=key_padding, need_probs=need_probs)
        hidden = self.attention_norm(hidden + self.dropout(self.attention_output(attn)))
        ffn = self.output(self.act(self.intermediate(hidden)))
        return self.output_norm(hidden + self.dropout(ffn)), probs


class DietModel(DietPreTrainedModel):
    """The encoder: embeddings, position encoding, and the stack of layers; optional BERT pooler."""

    def __init__(self, config: DietConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = DietEmbeddings(config)
        self.positions = PositionEncoding(config)
        self.layers = nn.ModuleList(DietLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def _check_inputs(self, input_ids: Tensor, token_type_ids: Tensor | None) -> None:
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            raise InputError(f"token id {lo if lo < 0 else hi} is outside the vocabulary "
                             f"[0, {self.config.vocab_size - 1}] (vocab_size={self.config.vocab_size})")
        self.positions.check(input_ids.shape[1], token_type_ids)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPooling:
        self._check_inputs(input_ids, token_type_ids)
        length = input_ids.shape[1]
        pos = torch.arange(length, device=input_ids.device)  # (L,)
        if position_ids is None:
            position_ids = pos[None]
        if token_type_ids is None and self.positions.num_segments:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.embeddings(input_ids, self.positions.embed(position_ids, token_type_ids))
        # position-only terms are built here, once per forward, and handed to every layer
        ctx = self.positions.context(pos, pos, token_type_ids)
        mask = padding_mask(attention_mask, hidden.dtype)
        need_probs = bool(output_attentions)
        all_hidden, all_probs = [hidden] if output_hidden_states else None, [] if need_probs else None
        for i, layer in enumerate(self.layers):
            hidden, probs = layer(hidden, self.positions.layer_terms(ctx, i), mask, attention_mask, need_probs)
            if need_probs:
                all_probs.append(probs)
            if output_hidden_states:
                all_hidden.append(hidden)
        pooled = torch.tanh(self.pooler(hidden[:, 0])) if self.pooler is not None else None
        return BaseModelOutputWithPooling(
            last_hidden_state=hidden, pooler_output=pooled,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            attentions=tuple(all_probs) if all_probs is not None else None)


class DietLMHead(nn.Module):
    """BERT's MLM head: transform, then a decoder tied to the word embeddings."""

    def __init__(self, config: DietConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.LayerNorm(self.act(self.dense(hidden)))) + self.bias


class DietForMaskedLM(DietPreTrainedModel):
    _tied_weights_keys = {"lm_head.decoder.weight": "diet.embeddings.word_embeddings.weight"}

    def __init__(self, config: DietConfig):
        super().__init__(config)
        self.diet = DietModel(config, add_pooling_layer=False)
        self.lm_head = DietLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, value):
        self.lm_head.decoder = value

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs) -> MaskedLMOutput:
        out = self.diet(input_ids, attention_mask, token_type_ids, position_ids, output_attentions,
                        output_hidden_states)
        logits = self.lm_head(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1),
                                               ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


class DietForSequenceClassification(DietPreTrainedModel):
    """[CLS] pooled output -> classifier. num_labels == 1: regression (MSE), as BERT does for STS-B."""

    def __init__(self, config: DietConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.diet = DietModel(config)
        drop = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(drop)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None,
                **kwargs) -> SequenceClassifierOutput:
        out = self.diet(input_ids, attention_mask, token_type_ids, position_ids, output_attentions,
                        output_hidden_states)
        logits = self.classifier(self.dropout(out.pooler_output))
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = nn.functional.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                if labels.dtype.is_floating_point or int(labels.min()) < 0 or int(labels.max()) >= self.num_labels:
                    raise InputError(f"classification labels must be integers in [0, {self.num_labels - 1}] "
                                     f"(num_labels={self.num_labels})")
                loss = nn.functional.cross_entropy(logits.float(), labels.view(-1))
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        attentions=out.attentions)


class DietForQuestionAnswering(DietPreTrainedModel):
    """Span extraction: a start and an end logit per token (BERT's SQuAD head)."""

    def __init__(self, config: DietConfig):
        super().__init__(config)
        self.diet = DietModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, start_positions=None,
                end_positions=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                **kwargs) -> QuestionAnsweringModelOutput:
        out = self.diet(input_ids, attention_mask, token_type_ids, position_ids, output_attentions,
                        output_hidden_states)
        start, end = self.qa_outputs(out.last_hidden_state).unbind(-1)  # (B, L) each
        loss = None
        if start_positions is not None and end_positions is not None:
            n = start.shape[1]  # positions outside the sequence are ignored, as in BERT
            loss = (nn.functional.cross_entropy(start.float(), start_positions.clamp(0, n), ignore_index=n)
                    + nn.functional.cross_entropy(end.float(), end_positions.clamp(0, n), ignore_index=n)) / 2
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start, end_logits=end,
                                            hidden_states=out.hidden_states, attentions=out.attentions)
