"""ALBEF's VQA model: the fused question encoder plus a causal answer decoder.

ALBEF (``models/model_vqa.py``) treats VQA as answer generation: the image and question go
through the pretrained ALBEF encoders (image encoder -> text encoder -> fusion encoder), and a
BERT decoder whose every layer cross-attends to the fused question states generates the
answer. Training is weighted teacher-forced cross-entropy over each question's answers;
inference ranks a fixed candidate list (``answer_list.json``)::

    vqa = AlbefVQA.from_pretrained(albef)                            # decoder from the fusion layers
    states = vqa.encode_question(images, question_ids, question_mask)
    loss = vqa.answer_loss(states, question_mask, answer_ids, answer_mask, weights, counts)
    best = vqa.rank_answers(states, question_mask, candidate_ids, candidate_mask, k=128)

Answers are tokenised with the run's BERT tokenizer as ``[CLS] answer [SEP]`` and padded;
``weights`` and ``counts`` come from :func:`falcon_cli.data.vqa.vqa_collate` (``weights`` and
``n``). Log-probabilities and losses are computed in float32 whatever the autocast dtype.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from falcon_cli.models.albef import ALBEF
from falcon_cli.models.bert import BertLayer, MLMHead, TextEmbeddings, init_bert_weights
from falcon_cli.models.config import AlbefConfig

__all__ = ["AnswerDecoder", "AlbefVQA", "sequence_log_likelihood"]


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` upcast to float32 if it is narrower (bf16/fp16 logits); float64 stays float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def sequence_log_likelihood(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Teacher-forced log-likelihood ``[N]`` of ``ids`` [N, T] under decoder ``logits`` [N, T, V].

    Position t predicts token t + 1, so the first token ([CLS]) is never scored; padded
    targets (``mask`` 0) contribute nothing. At least float32, so bf16 logits are safe.
    """
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    token_nll = F.cross_entropy(
        _at_least_fp32(logits[:, :-1]).flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="none"
    )
    return -token_nll.view(targets.shape).sum(dim=1)


class AnswerDecoder(nn.Module):
    """ALBEF's answer decoder (a ``BertLMHeadModel`` with ``fusion_layer=0``).

    BERT embeddings, ``config.fusion_layers`` causal :class:`BertLayer` s whose cross-attention
    reads the fused question states (``text_width`` wide, padding masked), and an LM head tied to
    the decoder's own word embeddings (passed at call time, so the state dict has no aliases).
    """

    def __init__(self, config: AlbefConfig):
        super().__init__()
        self.embeddings = TextEmbeddings(config)
        self.layers = nn.ModuleList(
            BertLayer(config, cross_width=config.text_width, causal=True) for _ in range(config.fusion_layers)
        )
        self.lm_head = MLMHead(config)
        init_bert_weights(self)

    def forward(
        self,
        answer_ids: torch.Tensor,
        answer_mask: torch.Tensor,
        question_states: torch.Tensor,
        question_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Next-token logits ``[N, T, vocab]`` for ``answer_ids`` [N, T] given question states [N, L, W]."""
        x = self.embeddings(answer_ids)
        for layer in self.layers:
            x = layer(x, answer_mask, question_states, context_mask=question_mask)
        return self.lm_head(x, self.embeddings.word.weight)


class AlbefVQA(nn.Module):
    """ALBEF for VQA: ``albef`` (an :class:`ALBEF`; its ITC/ITM heads stay unused) and ``decoder``.

    Build it from a pretrained model with :meth:`from_pretrained`; ``AlbefVQA(config)`` gives a
    randomly initialised one (e.g. to load a saved VQA state dict into).
    """

    def __init__(self, config: AlbefConfig):
        super().__init__()
        self.config = config
        self.albef = ALBEF(config)
        self.decoder = AnswerDecoder(config)

    @classmethod
    def from_pretrained(cls, albef: ALBEF) -> "AlbefVQA":
        """A VQA model whose encoder is a copy of ``albef`` and whose decoder starts from its fusion layers.

        As in ALBEF's ``VQA.py``: decoder embeddings from ``albef.text_encoder.embeddings``, decoder
        layer k from fusion layer k (self-attention, cross-attention, feed-forward, norms), LM head
        from ``albef.mlm_head``. The decoder's cross-attention reads ``text_width``-wide question
        states while the fusion layers read ``vision_width``-wide image tokens: when the widths
        differ, the cross-attention key/value projections cannot be copied and keep their BERT
        initialisation (albef-tiny and albef-base have equal widths, so everything is copied).
        The result is on ``albef``'s device and dtype; ``albef`` itself is not modified.
        """
        model = cls(albef.config)
        ref = next(albef.parameters())
        model.to(device=ref.device, dtype=ref.dtype)
        model.albef.load_state_dict(albef.state_dict())
        model.decoder.embeddings.load_state_dict(albef.text_encoder.embeddings.state_dict())
        model.decoder.lm_head.load_state_dict(albef.mlm_head.state_dict())
        same_width = albef.config.vision_width == albef.config.text_width
        for source, target in zip(albef.fusion_encoder.layers, model.decoder.layers):
            state = source.state_dict()
            if not same_width:
                # Linear(vision_width -> W) cannot fill Linear(text_width -> W): keep BERT init.
                state = {k: v for k, v in state.items() if not k.startswith(("cross_attn.key.", "cross_attn.value."))}
            target.load_state_dict(state, strict=same_width)
        return model

    def encode_question(
        self, images: torch.Tensor, question_ids: torch.Tensor, question_mask: torch.Tensor
    ) -> torch.Tensor:
        """Fused question states ``[B, L, text_width]``: image encoder -> text encoder -> fusion encoder."""
        # The encoders directly, not encode_image/encode_text: the ITC projections would be
        # computed for nothing (and leave parameters without gradients in the graph).
        image_tokens = self.albef.visual_encoder.forward_features(images)
        text_tokens = self.albef.text_encoder(question_ids, question_mask)
        return self.albef.fuse(text_tokens, question_mask, image_tokens)

    def answer_loss(
        self,
        question_states: torch.Tensor,
        question_mask: torch.Tensor,
        answer_ids: torch.Tensor,
        answer_mask: torch.Tensor,
        weights: torch.Tensor,
        counts: torch.Tensor | Sequence[int],
    ) -> torch.Tensor:
        """ALBEF's VQA loss: ``sum(weights * answer NLL) / B``.

        Args:
            question_states: [B, L, W] from :meth:`encode_question`; question_mask: [B, L].
            answer_ids, answer_mask: [N, T] every question's answers, flattened in question order.
            weights: [N] answer weights; counts: [B] answers per question (sum N).

        Each answer's NLL is the sum over its tokens after [CLS] of the teacher-forced
        cross-entropy (padding ignored).
        """
        counts = torch.as_tensor(counts, device=question_states.device)
        n = answer_ids.shape[0]
        # Each question's states are repeated once per answer (output_size avoids a device sync).
        states = question_states.repeat_interleave(counts, dim=0, output_size=n)
        mask = question_mask.repeat_interleave(counts, dim=0, output_size=n)
        logits = self.decoder(answer_ids, answer_mask, states, mask)
        nll = -sequence_log_likelihood(logits, answer_ids, answer_mask)
        return (weights.to(device=nll.device, dtype=nll.dtype) * nll).sum() / question_states.shape[0]

    @torch.no_grad()
    def rank_answers(
        self,
        question_states: torch.Tensor,
        question_mask: torch.Tensor,
        answer_ids: torch.Tensor,
        answer_mask: torch.Tensor,
        k: int,
        question_chunk: int | None = None,
    ) -> torch.Tensor:
        """Index ``[B]`` (int64, into the candidate list) of each question's best candidate answer.

        ALBEF's ``rank_answer``: (1) one decoder step on [CLS] gives every candidate's
        first-token log-prob (``answer_ids[:, 1]``); (2) the top ``k`` candidates per question
        are kept (``k`` is clamped to the number of candidates); (3) each is scored by its full
        sequence log-likelihood (every token after [CLS], padding ignored); (4) argmax.
        ALBEF's code adds the first-token log-prob on top of a sequence loss that already
        contains it; here it is counted once, so the score is the true sequence likelihood
        (as in BLIP). ``question_chunk`` bounds memory: that many questions per pass
        (the [chunk * k, T, vocab] logits dominate); None: all at once.
        """
        b = question_states.shape[0]
        chunk = b if question_chunk is None else max(1, question_chunk)
        return torch.cat(
            [
                self._rank_chunk(
                    question_states[i : i + chunk], question_mask[i : i + chunk], answer_ids, answer_mask, k
                )
                for i in range(0, b, chunk)
            ]
        )

    def _rank_chunk(
        self, states: torch.Tensor, mask: torch.Tensor, answer_ids: torch.Tensor, answer_mask: torch.Tensor, k: int
    ) -> torch.Tensor:
        """:meth:`rank_answers` for one chunk of questions."""
        b, c = states.shape[0], answer_ids.shape[0]
        k = max(1, min(k, c))
        # (1) [CLS] alone: with causal self-attention its output equals position 0 of a full pass.
        start = answer_ids[:1, :1].expand(b, 1)
        first_logits = self.decoder(start, torch.ones_like(start), states, mask)[:, 0]
        first_logp = F.log_softmax(_at_least_fp32(first_logits), dim=-1).index_select(1, answer_ids[:, 1])  # [b, c]
        # (2) top-k candidates per question.
        top = first_logp.topk(k, dim=1).indices  # [b, k]
        ids = answer_ids[top].flatten(0, 1)  # [b * k, T]
        ids_mask = answer_mask[top].flatten(0, 1)
        # (3) full-sequence log-likelihood of every kept candidate, all questions in one pass.
        logits = self.decoder(ids, ids_mask, states.repeat_interleave(k, dim=0), mask.repeat_interleave(k, dim=0))
        scores = sequence_log_likelihood(logits, ids, ids_mask).view(b, k)
        # (4) best kept candidate, mapped back to the candidate list.
        return top.gather(1, scores.argmax(dim=1, keepdim=True)).squeeze(1)
