"""BLIP-2 stage 1: a frozen image encoder and a Q-Former of learned queries, with ITC, ITM and ITG heads.

The Q-Former is transformers' ``Blip2QFormerModel`` (BERT layers; cross-attention to the image every
``cross_attention_frequency`` layers, for the first ``num_query_tokens`` positions only; separate
feed-forward blocks for queries and text) with ``Blip2TextEmbeddings``; transformers has no stage-1
losses (issue #34019), so the passes they need are methods here and the losses live in
:mod:`falcon_cli.objectives.qformer`. Three passes, as LAVIS's ``blip2_qformer.py``:

* queries alone, cross-attending to the image: their projected outputs are the ``[B, Q, E]`` ITC
  features (:meth:`Blip2QFormer.query_features`);
* text alone (no queries, no image): the projected [CLS] is the text's ITC feature
  (:meth:`Blip2QFormer.encode_text`);
* queries and text together: bidirectionally for ITM (:meth:`Blip2QFormer.itm_logits`, the head
  averaged over the query positions), and for ITG with a 4-D mask in which queries see only queries and
  each text token sees every query and the text up to itself (:meth:`Blip2QFormer.itg_logits`; LAVIS runs
  the text against the query pass's cached keys and values, which is the same computation).

The image encoder is frozen (BLIP-2 stage 1): no gradient, eval mode whatever the model's mode.
``ln_vision`` after it is trained, as in LAVIS. Image towers: a timm ViT (small runs), or BLIP-2's EVA
ViT-g as transformers' ``Blip2VisionModel`` (``vision: hf``), whose ``post_layernorm`` is our
``ln_vision`` (so HF BLIP-2 weights give HF's outputs).
"""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from falcon_cli.errors import FalconError
from falcon_cli.models.blip2_config import Blip2Config  # noqa: F401 (the model's config, here too)
from falcon_cli.models.similarity import image_text_similarity
from falcon_cli.models.weights import load_vision_weights
from falcon_cli.runtime.hub import HubRef, hub_hint, hub_snapshot, is_local, note_hub, note_local, prepare_hub

log = logging.getLogger("falcon")


class Blip2Encodings(NamedTuple):
    """What :meth:`Blip2QFormer.forward` returns (a tuple, so DDP handles it)."""

    image_embeds: torch.Tensor
    """[B, N, vision_width] the frozen image tokens after ``ln_vision``."""
    image_feat: torch.Tensor
    """[B, Q, embed_dim] L2-normalised float32 query features."""
    text_tokens: torch.Tensor
    """[B, L, qformer_width] the text-only pass's hidden states."""
    text_feat: torch.Tensor
    """[B, embed_dim] L2-normalised float32 text features (the projected [CLS])."""
    temperature: torch.Tensor
    """[] the clamped ITC temperature."""


class LmHead(nn.Module):
    """BERT's prediction head: dense, GELU, LayerNorm, then the decoder tied to the word embeddings (+ bias)."""

    def __init__(self, width: int, vocab_size: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(F.gelu(self.dense(hidden))), word_embeddings, self.bias)


class Blip2QFormer(nn.Module):
    """BLIP-2 stage 1 with plain parameter names: ``visual_encoder`` (frozen), ``ln_vision``, ``query_tokens``,
    ``embeddings`` (word + position), ``qformer``, ``vision_proj``, ``text_proj``, ``itm_head``, ``lm_head``
    (decoder tied to ``embeddings.word_embeddings.weight``) and ``temp``."""

    def __init__(self, config: Blip2Config):
        super().__init__()
        from transformers.models.blip_2.configuration_blip_2 import Blip2QFormerConfig
        from transformers.models.blip_2.modeling_blip_2 import Blip2QFormerModel, Blip2TextEmbeddings

        self.config = config
        self.visual_encoder = build_image_tower(config)
        self.ln_vision = nn.LayerNorm(config.vision_width, eps=1e-6 if config.vision == "hf" else 1e-5)
        qformer_config = Blip2QFormerConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.qformer_width,
            num_hidden_layers=config.qformer_layers,
            num_attention_heads=config.qformer_heads,
            intermediate_size=config.qformer_intermediate_size,
            hidden_dropout_prob=config.hidden_dropout,
            attention_probs_dropout_prob=config.attention_dropout,
            max_position_embeddings=config.max_position_embeddings,
            layer_norm_eps=config.layer_norm_eps,
            pad_token_id=config.pad_token_id,
            cross_attention_frequency=config.cross_attention_frequency,
            encoder_hidden_size=config.vision_width,
            use_qformer_text_input=True,
        )
        qformer_config._attn_implementation = "sdpa"  # fused attention; boolean 4-D masks pass through as they are
        self.query_tokens = nn.Parameter(torch.zeros(1, config.num_query_tokens, config.qformer_width))
        self.embeddings = Blip2TextEmbeddings(qformer_config)
        self.qformer = Blip2QFormerModel(qformer_config)
        self.vision_proj = nn.Linear(config.qformer_width, config.embed_dim)
        self.text_proj = nn.Linear(config.qformer_width, config.embed_dim)
        self.itm_head = nn.Linear(config.qformer_width, 2)
        self.lm_head = LmHead(config.qformer_width, config.vocab_size, config.layer_norm_eps)
        self.temp = nn.Parameter(torch.tensor(float(config.temp_init)))
        self._init_weights()
        self.vision_trainable = False
        self.visual_encoder.requires_grad_(False)

    def set_image_encoder_trainable(self, trainable: bool) -> None:
        """Train the image encoder (``True``: gradients, and train mode with the model) or freeze it (BLIP-2:
        no gradient, eval mode); the pretrain stage's ``encoders.vision_trainable_epochs`` switches it once."""
        self.vision_trainable = bool(trainable)
        self.visual_encoder.requires_grad_(self.vision_trainable)
        self.visual_encoder.train(self.training and self.vision_trainable)

    def _init_weights(self) -> None:
        """BERT's initialisation (normal 0.02, LayerNorm 1/0, biases 0) for everything outside the image tower."""
        for name, module in self.named_modules():
            if name.startswith("visual_encoder"):
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.query_tokens, std=0.02)
        nn.init.zeros_(self.lm_head.bias)

    def train(self, mode: bool = True) -> "Blip2QFormer":
        """Train mode everywhere except a frozen image encoder, which stays in eval mode."""
        super().train(mode)
        self.visual_encoder.train(mode and getattr(self, "vision_trainable", False))
        return self

    # --- temperature (ALBEF's semantics) ---------------------------------------------------------
    def temperature(self) -> torch.Tensor:
        """The ITC temperature clamped to ``[temp_min, temp_max]``, gradient passed straight through to ``temp``."""
        clamped = self.temp.clamp(self.config.temp_min, self.config.temp_max)
        return self.temp + (clamped - self.temp).detach()

    @torch.no_grad()
    def clamp_temperature_(self) -> None:
        """Clamp ``temp`` in place (LAVIS does it at the start of each forward)."""
        self.temp.clamp_(self.config.temp_min, self.config.temp_max)

    # --- passes ------------------------------------------------------------------------------------
    def image_embeddings(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` [B, 3, H, W] -> the frozen tower's tokens [B, N, vision_width] after ``ln_vision``."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.vision_trainable):
            if self.config.vision == "hf":
                tokens = self.visual_encoder(pixel_values=images).last_hidden_state
            else:
                tokens = self.visual_encoder.forward_features(images)
        return self.ln_vision(tokens)

    def _queries(self, batch: int) -> torch.Tensor:
        return self.query_tokens.expand(batch, -1, -1)

    def query_features(self, image_embeds: torch.Tensor) -> torch.Tensor:
        """The queries through the Q-Former, cross-attending to ``image_embeds``: projected, L2-normalised
        float32 ITC features [B, Q, embed_dim]."""
        hidden = self.qformer(
            query_embeds=self._queries(image_embeds.shape[0]),
            query_length=self.config.num_query_tokens,
            encoder_hidden_states=image_embeds,
        ).last_hidden_state
        return F.normalize(self.vision_proj(hidden).float(), dim=-1)

    def encode_image(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (image tokens [B, N, vision_width], query features [B, Q, embed_dim])."""
        image_embeds = self.image_embeddings(images)
        return image_embeds, self.query_features(image_embeds)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Text alone through the Q-Former -> (hidden states [B, L, width], text feature [B, embed_dim]: the
        projected, L2-normalised float32 [CLS], or mean with ``pooling: mean``)."""
        hidden = self.qformer(
            query_embeds=self.embeddings(input_ids=input_ids), query_length=0, attention_mask=attention_mask
        ).last_hidden_state
        if self.config.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            keep = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1)
        return hidden, F.normalize(self.text_proj(pooled).float(), dim=-1)

    def similarity(self, image_feat: torch.Tensor, text_feat: torch.Tensor) -> torch.Tensor:
        """ITC similarities ``[N_images, N_texts]``: each image's best query against each text."""
        return image_text_similarity(image_feat, text_feat)

    def _joint(self, image_embeds: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Queries and text in one pass, attending to each other through ``attention_mask`` (2-D: padding
        only; 4-D bool: exactly that), the queries cross-attending to ``image_embeds``."""
        embeds = self.embeddings(input_ids=input_ids, query_embeds=self._queries(input_ids.shape[0]))
        return self.qformer(
            query_embeds=embeds,
            query_length=self.config.num_query_tokens,
            attention_mask=attention_mask,
            encoder_hidden_states=image_embeds,
        ).last_hidden_state

    def itm_logits(
        self, image_embeds: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """ITM logits [P, 2] of P (image, text) pairs: queries and text attend to each other bidirectionally
        (padding masked), the head is applied to each query output and averaged over the queries (LAVIS)."""
        q = self.config.num_query_tokens
        mask = torch.cat([attention_mask.new_ones(attention_mask.shape[0], q), attention_mask], dim=1)
        hidden = self._joint(image_embeds, input_ids, mask)
        return self.itm_head(hidden[:, :q]).mean(dim=1)

    def pair_itm_logits(
        self,
        image_tokens: torch.Tensor,
        text_tokens: torch.Tensor | None,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        """:meth:`itm_logits` with ALBEF's signature (``text_tokens`` are unused: the Q-Former reads the ids)."""
        return self.itm_logits(image_tokens, input_ids, attention_mask)

    def match_logits(
        self,
        image_tokens: torch.Tensor,
        text_tokens: torch.Tensor | None,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        """ITM match logits [P] (class 1, raw): the retrieval re-ranking score."""
        return self.itm_logits(image_tokens, input_ids, attention_mask)[:, 1]

    def generation_mask(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The ITG attention mask, bool [B, 1, Q + L, Q + L] (True = may attend): queries see the queries;
        each text token sees every query and the non-padding text up to and including itself."""
        b, length = attention_mask.shape
        q = self.config.num_query_tokens
        device = attention_mask.device
        mask = torch.zeros(b, q + length, q + length, dtype=torch.bool, device=device)
        mask[:, :, :q] = True
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        mask[:, q:, q:] = causal & attention_mask.bool()[:, None, :]
        return mask[:, None]

    def itg_logits(
        self, image_embeds: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """Image-grounded text generation logits [B, L, vocab]: the caption with ``[DEC]`` in place of its
        first token, one pass under :meth:`generation_mask`; position t predicts token t + 1."""
        decoder_ids = input_ids.clone()
        decoder_ids[:, 0] = self.config.dec_id
        hidden = self._joint(image_embeds, decoder_ids, self.generation_mask(attention_mask))
        return self.lm_head(hidden[:, self.config.num_query_tokens :], self.embeddings.word_embeddings.weight)

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Blip2Encodings:
        """Clamp the temperature in place, then the image tokens, query features and text features."""
        self.clamp_temperature_()
        image_embeds, image_feat = self.encode_image(images)
        text_tokens, text_feat = self.encode_text(input_ids, attention_mask)
        return Blip2Encodings(image_embeds, image_feat, text_tokens, text_feat, self.temperature())

    # --- bookkeeping -------------------------------------------------------------------------------
    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of (distinct) parameters; ``trainable_only`` leaves the frozen image encoder out."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    @property
    def num_image_tokens(self) -> int:
        """Image tokens per image: patches plus [CLS]."""
        return (self.config.image_size // self.config.patch_size) ** 2 + 1


def build_image_tower(config: Blip2Config) -> nn.Module:
    """The image tower of ``config`` (random init): a timm ViT, or ``Blip2VisionModel`` without its final
    LayerNorm (``ln_vision`` plays that part)."""
    if config.vision == "hf":
        from transformers.models.blip_2.configuration_blip_2 import Blip2VisionConfig
        from transformers.models.blip_2.modeling_blip_2 import Blip2VisionModel

        vision_config = Blip2VisionConfig(
            hidden_size=config.vision_width,
            num_hidden_layers=config.vision_layers,
            num_attention_heads=config.vision_heads,
            image_size=config.image_size,
            patch_size=config.patch_size,
            intermediate_size=round(config.vision_width * config.vision_mlp_ratio),
        )
        vision_config._attn_implementation = "sdpa"
        tower = Blip2VisionModel(vision_config)
        tower.post_layernorm = nn.Identity()
        return tower
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=config.image_size,
        patch_size=config.patch_size,
        embed_dim=config.vision_width,
        depth=config.vision_layers,
        num_heads=config.vision_heads,
        mlp_ratio=config.vision_mlp_ratio,
        qkv_bias=True,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        num_classes=0,
    )


# --- weights -----------------------------------------------------------------------------------------


def build_blip2(config: Blip2Config) -> Blip2QFormer:
    """A :class:`Blip2QFormer` for ``config``: random init, then the weight sources it names."""
    model = Blip2QFormer(config)
    if config.vision_weights:
        if config.vision == "hf":
            load_hf_blip2(model, config.vision_weights, "vision_weights", parts=("vision",))
        else:
            load_vision_weights(model.visual_encoder, config.vision_weights)
    if config.qformer_weights:
        source = resolve_checkpoint_dir(config.qformer_weights, "qformer_weights")
        if _is_bert(source):
            load_bert_into_qformer(model, source)
        else:
            load_hf_blip2(model, config.qformer_weights, "qformer_weights", parts=("qformer",), directory=source)
    return model


def resolve_checkpoint_dir(source: str, what: str) -> Path:
    """A local directory, or a hub id (``NAME@REVISION`` pins a revision) fetched (safetensors and JSON files only)
    into the hub cache; noted for the run's manifest."""
    path = Path(source).expanduser()
    if path.is_dir():
        note_local(path, what)
        return path
    if is_local(source) or source.startswith("."):
        raise FalconError(
            f"{what} '{source}': not a directory (give a HF BLIP-2 or BERT checkpoint directory, or a hub id)"
        )
    ref = HubRef.parse(source, what)
    prepare_hub()
    try:
        directory = hub_snapshot(ref, ["*.safetensors", "*.json", "*.txt"])
    except Exception as exc:  # noqa: BLE001 - the hub's errors are many; one line says which source failed
        why = hub_hint(source) or str(exc).splitlines()[0]
        raise FalconError(f"{what} '{source}': cannot fetch it from the hub ({why}); give a local directory") from None
    note_hub(ref, what)
    return directory


def _is_bert(directory: Path) -> bool:
    config = directory / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type") == "bert"
    except (OSError, json.JSONDecodeError):
        return False


def read_checkpoint_state(directory: Path, what: str) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files of a checkpoint directory (sharded or not)."""
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FalconError(
            f"{what} '{directory}': no *.safetensors files in it (save the checkpoint with "
            "save_pretrained, which writes them)"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def _load_mapped(model: nn.Module, mapped: dict[str, torch.Tensor], what: str, source) -> None:
    """Copy ``mapped`` (our names) into ``model``, every shape checked first; one line names the first mismatch."""
    target = model.state_dict()
    for key, value in mapped.items():
        if key not in target:
            raise FalconError(f"{what} '{source}': {key} has no place in this model")
        if tuple(value.shape) != tuple(target[key].shape):
            raise FalconError(
                f"{what} '{source}': {key} is {tuple(value.shape)} in the checkpoint but "
                f"{tuple(target[key].shape)} in the model; build the model with the checkpoint's sizes"
            )
    model.load_state_dict(mapped, strict=False)


def load_hf_blip2(
    model: Blip2QFormer, source: str, what: str, *, parts: tuple[str, ...], directory: Path | None = None
) -> None:
    """Load a HF BLIP-2 checkpoint's ``vision`` tower (``vision_model.*``; its ``post_layernorm`` into
    ``ln_vision``) and/or its ``qformer`` side (``qformer.*``, ``query_tokens``, ``embeddings.*``,
    ``vision_projection``, ``text_projection``, ``itm_head``: a ``Blip2ForImageTextRetrieval`` checkpoint)."""
    directory = directory or resolve_checkpoint_dir(source, what)
    state = read_checkpoint_state(directory, what)
    mapped: dict[str, torch.Tensor] = {}
    if "vision" in parts:
        for key, value in state.items():
            if key.startswith("vision_model.post_layernorm."):
                mapped["ln_vision." + key.rsplit(".", 1)[1]] = value
            elif key.startswith("vision_model."):
                mapped["visual_encoder." + key[len("vision_model.") :]] = value
        if not mapped:
            raise FalconError(f"{what} '{source}': no vision_model.* weights in it (not a HF BLIP-2 checkpoint)")
    if "qformer" in parts:
        renames = {
            "vision_projection.": "vision_proj.",
            "text_projection.": "text_proj.",
            "itm_head.": "itm_head.",
            "qformer.": "qformer.",
            "embeddings.": "embeddings.",
        }
        found = 0
        for key, value in state.items():
            if key == "query_tokens":
                mapped[key], found = value, found + 1
            for old, new in renames.items():
                if key.startswith(old):
                    mapped[new + key[len(old) :]], found = value, found + 1
        needed = (
            "query_tokens",
            "embeddings.word_embeddings.weight",
            "vision_proj.weight",
            "text_proj.weight",
            "itm_head.weight",
        )
        missing = [n for n in needed if n not in mapped]
        if missing:
            raise FalconError(
                f"{what} '{source}': no {', '.join(missing)} in it; the Q-Former's weights come from a "
                "BLIP-2 image-text retrieval checkpoint (Blip2ForImageTextRetrieval, e.g. "
                "Salesforce/blip2-itm-vit-g) or from BERT (bert-base-uncased)"
            )
        mapped = {k: v for k, v in mapped.items() if not k.startswith("qformer.embeddings.position_ids")}
        if "embeddings.position_ids" in mapped:
            del mapped["embeddings.position_ids"]
    _load_mapped(model, mapped, what, source)


def load_bert_into_qformer(model: Blip2QFormer, directory: Path) -> None:
    """A fresh Q-Former from BERT, as BLIP-2 stage 1 (LAVIS ``init_Qformer``): embeddings and their LayerNorm,
    each layer's self-attention and feed-forward block (into both the text and the query copies), the LM
    head's transform and bias; cross-attention, queries, projections and the ITM head stay new. Word
    embeddings beyond BERT's vocabulary (``[DEC]``) keep their initialisation."""
    state = read_checkpoint_state(directory, "qformer_weights")
    state = {k.removeprefix("bert."): v for k, v in state.items()}
    config = model.config
    mapped: dict[str, torch.Tensor] = {}
    word = state.get("embeddings.word_embeddings.weight")
    if word is None:
        raise FalconError(
            f"qformer_weights '{directory}': no embeddings.word_embeddings.weight (not a BERT checkpoint)"
        )
    if word.shape[1] != config.qformer_width or word.shape[0] > config.vocab_size:
        raise FalconError(
            f"qformer_weights '{directory}': BERT's word embeddings are {tuple(word.shape)}, the "
            f"Q-Former's {config.vocab_size} x {config.qformer_width}; build it with BERT's width and at "
            "least its vocabulary"
        )
    rows = model.embeddings.word_embeddings.weight.detach().clone()
    rows[: word.shape[0]] = word
    mapped["embeddings.word_embeddings.weight"] = rows
    mapped["embeddings.position_embeddings.weight"] = state["embeddings.position_embeddings.weight"]
    mapped["qformer.layernorm.weight"] = state["embeddings.LayerNorm.weight"]
    mapped["qformer.layernorm.bias"] = state["embeddings.LayerNorm.bias"]
    layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layer."))
    if layers < config.qformer_layers:
        raise FalconError(
            f"qformer_weights '{directory}': BERT has {layers} layers, the Q-Former {config.qformer_layers}"
        )
    for i in range(config.qformer_layers):
        bert, ours = f"encoder.layer.{i}.", f"qformer.encoder.layer.{i}."
        for name in ("query", "key", "value"):
            for p in ("weight", "bias"):
                mapped[f"{ours}attention.attention.{name}.{p}"] = state[f"{bert}attention.self.{name}.{p}"]
        for p in ("weight", "bias"):
            mapped[f"{ours}attention.output.dense.{p}"] = state[f"{bert}attention.output.dense.{p}"]
            mapped[f"{ours}attention.output.LayerNorm.{p}"] = state[f"{bert}attention.output.LayerNorm.{p}"]
            for suffix in ("", "_query"):
                mapped[f"{ours}intermediate{suffix}.dense.{p}"] = state[f"{bert}intermediate.dense.{p}"]
                mapped[f"{ours}output{suffix}.dense.{p}"] = state[f"{bert}output.dense.{p}"]
                mapped[f"{ours}output{suffix}.LayerNorm.{p}"] = state[f"{bert}output.LayerNorm.{p}"]
    head = "cls.predictions."
    if f"{head}transform.dense.weight" in state:
        for p in ("weight", "bias"):
            mapped[f"lm_head.dense.{p}"] = state[f"{head}transform.dense.{p}"]
            mapped[f"lm_head.norm.{p}"] = state[f"{head}transform.LayerNorm.{p}"]
        bias = model.lm_head.bias.detach().clone()
        bias[: word.shape[0]] = state[f"{head}bias"]
        mapped["lm_head.bias"] = bias
    _load_mapped(model, mapped, "qformer_weights", directory)


__all__ = ["Blip2Config", "Blip2Encodings", "Blip2QFormer", "build_blip2", "load_bert_into_qformer", "load_hf_blip2"]
