"""BERT parts of ALBEF, built from plain torch modules.

transformers 5 only allows BERT cross-attention in decoder (causal) mode; ALBEF's fusion
layers need bidirectional self-attention plus cross-attention to image tokens, so the
layers are written here and BERT weights are mapped onto them
(:func:`falcon_cli.models.weights.load_bert_weights`). Post-LN as in BERT:
``x = LayerNorm(x + Dropout(Block(x)))``.

Padding masks are ``[B, L]`` with 1 (or True) for a real token and 0 for padding.
Nothing in a forward branches on tensor values, so the modules trace and compile.

Two optional extras serve the downstream models: ``causal=True`` layers run left-to-right
self-attention (the VQA answer decoder), and a cross-attention built with ``shared_kv=True``
owns no key/value projections and borrows a partner's at call time (the NLVR2 layer pairs),
so shared weights exist once in the state dict.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from falcon_cli.models.config import AlbefConfig


def padding_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An additive attention bias ``[B, 1, 1, L]`` from a ``[B, L]`` padding mask (1 = attend)."""
    keep = mask.to(dtype)[:, None, None, :]
    return (1.0 - keep) * torch.finfo(dtype).min


def causal_padding_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An additive bias ``[B, 1, L, L]`` from a ``[B, L]`` padding mask: query t sees key s iff s <= t and s is real.

    One bias for both constraints, because SDPA takes ``is_causal`` or ``attn_mask`` but not both.
    """
    length = mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
    allowed = causal & mask.bool()[:, None, None, :]
    # finfo.min rather than -inf: a fully masked row (a padded query) then stays finite instead of NaN.
    return torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill(~allowed, torch.finfo(dtype).min)


class Attention(nn.Module):
    """Multi-head attention of ``x`` over ``context`` (self-attention when ``context is x``).

    Parameter names follow BERT: ``query``, ``key``, ``value`` and the output projection ``out``
    (BERT's ``attention.output.dense``). ``key``/``value`` read ``kv_width``-wide context, so
    cross-attention can read image tokens of another width.

    With ``shared_kv=True`` the module has no ``key``/``value`` of its own (they are None) and
    :meth:`forward` must be given a partner's as ``kv``: the weights are shared by construction,
    so the state dict holds each tensor once (safetensors refuses aliased tensors).
    """

    def __init__(self, width: int, heads: int, kv_width: int, dropout: float, *, shared_kv: bool = False):
        super().__init__()
        self.heads = heads
        self.head_dim = width // heads
        self.dropout = dropout
        self.query = nn.Linear(width, width)
        self.key: nn.Linear | None = None if shared_kv else nn.Linear(kv_width, width)
        self.value: nn.Linear | None = None if shared_kv else nn.Linear(kv_width, width)
        self.out = nn.Linear(width, width)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        *,
        causal: bool = False,
        kv: tuple[nn.Module, nn.Module] | None = None,
    ) -> torch.Tensor:
        """``x`` [B, Lq, W] attends to ``context`` [B, Lk, W_kv]; ``key_mask`` [B, Lk] masks padded keys.

        ``causal`` (self-attention only, Lq == Lk) also hides keys after each query.
        ``kv`` (key, value) projections replace the module's own (required when built with ``shared_kv``).
        """
        key, value = (self.key, self.value) if kv is None else kv
        if key is None or value is None:
            raise ValueError("this Attention was built with shared_kv=True: pass the partner's (key, value) as kv")
        b, lq, width = x.shape
        q = self.query(x).view(b, lq, self.heads, self.head_dim).transpose(1, 2)
        k = key(context).view(b, -1, self.heads, self.head_dim).transpose(1, 2)
        v = value(context).view(b, -1, self.heads, self.head_dim).transpose(1, 2)
        if causal:
            mask = key_mask if key_mask is not None else torch.ones(b, lq, dtype=torch.bool, device=x.device)
            bias = causal_padding_bias(mask, q.dtype)
        else:
            bias = None if key_mask is None else padding_bias(key_mask, q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=self.dropout if self.training else 0.0)
        return self.out(out.transpose(1, 2).reshape(b, lq, width))


class BertLayer(nn.Module):
    """One BERT layer: bidirectional self-attention, optional cross-attention, feed-forward; post-LN.

    With ``cross_width`` set it is an ALBEF fusion layer: after self-attention over the text
    (padding mask only, no causal mask) the text cross-attends to every image token.

    ``causal=True`` makes the self-attention left-to-right (combined with the padding mask),
    as in a BERT decoder. ``shared_cross_kv=True`` builds the cross-attention without key/value
    projections; :meth:`forward` then needs a partner layer's as ``cross_kv``. Neither option
    adds or renames parameters of the default layer.
    """

    def __init__(
        self,
        config: AlbefConfig,
        cross_width: int | None = None,
        *,
        causal: bool = False,
        shared_cross_kv: bool = False,
    ):
        super().__init__()
        width, heads, eps = config.text_width, config.text_heads, config.layer_norm_eps
        self.causal = causal
        self.self_attn = Attention(width, heads, width, config.attention_dropout)
        self.self_attn_norm = nn.LayerNorm(width, eps=eps)
        self.cross_attn: Attention | None = None
        self.cross_attn_norm: nn.LayerNorm | None = None
        if cross_width is not None:
            self.cross_attn = Attention(width, heads, cross_width, config.attention_dropout, shared_kv=shared_cross_kv)
            self.cross_attn_norm = nn.LayerNorm(width, eps=eps)
        self.ffn_in = nn.Linear(width, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, width)
        self.ffn_norm = nn.LayerNorm(width, eps=eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor,
        image_tokens: torch.Tensor | None = None,
        *,
        context_mask: torch.Tensor | None = None,
        cross_kv: tuple[nn.Module, nn.Module] | None = None,
    ) -> torch.Tensor:
        """``x`` [B, L, W] with padding mask [B, L]; ``image_tokens`` [B, Lc, W_c] is the cross-attention context.

        ``context_mask`` [B, Lc] masks padded context tokens (e.g. a question read by the VQA
        decoder; None: all real, like ALBEF's image tokens). ``cross_kv`` supplies borrowed
        cross-attention key/value projections (``shared_cross_kv`` layers).
        """
        x = self.self_attn_norm(x + self.dropout(self.self_attn(x, x, attention_mask, causal=self.causal)))
        if self.cross_attn is not None:
            # Image tokens are never padded (ALBEF's image attention mask is all ones, context_mask None);
            # a question read by the VQA decoder is, so its mask is passed.
            x = self.cross_attn_norm(x + self.dropout(self.cross_attn(x, image_tokens, context_mask, kv=cross_kv)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))


class TextEmbeddings(nn.Module):
    """BERT embeddings: word + absolute position + token type 0, then LayerNorm and dropout."""

    def __init__(self, config: AlbefConfig):
        super().__init__()
        width = config.text_width
        self.word = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, width)
        self.token_type = nn.Embedding(config.type_vocab_size, width)
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        x = self.word(input_ids) + self.position.weight[:length] + self.token_type.weight[0]
        return self.dropout(self.norm(x))


class TextEncoder(nn.Module):
    """The text-only encoder: embeddings and the first ``text_layers`` BERT layers."""

    def __init__(self, config: AlbefConfig):
        super().__init__()
        self.embeddings = TextEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.text_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, attention_mask)
        return x


class FusionEncoder(nn.Module):
    """The fusion encoder: ``fusion_layers`` BERT layers with cross-attention to image tokens."""

    def __init__(self, config: AlbefConfig):
        super().__init__()
        self.layers = nn.ModuleList(
            BertLayer(config, cross_width=config.vision_width) for _ in range(config.fusion_layers)
        )

    def forward(
        self, text_tokens: torch.Tensor, attention_mask: torch.Tensor, image_tokens: torch.Tensor
    ) -> torch.Tensor:
        x = text_tokens
        for layer in self.layers:
            x = layer(x, attention_mask, image_tokens)
        return x


class MLMHead(nn.Module):
    """BERT's MLM head: dense + GELU + LayerNorm, then a decoder tied to the word embeddings, plus a bias.

    The decoder weight is not a parameter of this module: :meth:`forward` takes the word-embedding
    matrix, so the tie holds by construction and the state dict has no shared tensors.
    """

    def __init__(self, config: AlbefConfig):
        super().__init__()
        self.dense = nn.Linear(config.text_width, config.text_width)
        self.norm = nn.LayerNorm(config.text_width, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(F.gelu(self.dense(hidden))), word_embeddings, self.bias)


@torch.no_grad()
def init_bert_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT's initialisation, applied to every submodule: normal(0, std) weights, zero biases, unit LayerNorms."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            m.weight.normal_(0.0, std)
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, nn.Embedding):
            m.weight.normal_(0.0, std)
            if m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            m.weight.fill_(1.0)
            m.bias.zero_()
        elif isinstance(m, MLMHead):
            m.bias.zero_()
