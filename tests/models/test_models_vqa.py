"""ALBEF VQA: causal BERT layers, decoder initialisation, answer loss and ranking against plain loops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from falcon_cli.models import create_model, resolve_model_config
from falcon_cli.models.bert import BertLayer
from falcon_cli.models.vqa import AlbefVQA

VOCAB = 50
PAD, CLS, SEP = 0, 2, 3


def _padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] seq [SEP] for each token list, right-padded -> (ids [N, T], mask [N, T])."""
    rows = [[CLS, *s, SEP] for s in seqs]
    length = max(map(len, rows))
    ids = torch.tensor([r + [PAD] * (length - len(r)) for r in rows])
    return ids, (ids != PAD).long()


def _questions(b: int = 3, length: int = 7, seed: int = 0, image_size: int = 64):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(b, 3, image_size, image_size, generator=g)
    ids = torch.randint(5, VOCAB, (b, length), generator=g)
    ids[:, 0] = CLS
    mask = torch.ones(b, length, dtype=torch.long)
    mask[1 % b, 4:] = 0  # one padded question, so the decoder's question mask matters
    ids[mask == 0] = PAD
    return images, ids, mask


# Distinct first tokens: candidates sharing one ("yes" / "yes please") tie exactly in step (1),
# and which of them top-k keeps at the boundary is unspecified.
CANDIDATES = [[7], [8, 9], [10, 11, 12], [17, 13], [14], [15, 9, 16]]


@pytest.fixture(scope="module")
def vqa() -> AlbefVQA:
    torch.manual_seed(0)
    albef = create_model("albef-tiny", vocab_size=VOCAB)
    # float64: the brute-force comparisons below must not hinge on float32 near-ties.
    return AlbefVQA.from_pretrained(albef).double().eval()


@pytest.fixture(scope="module")
def states(vqa):
    images, ids, mask = _questions()
    return vqa.encode_question(images.double(), ids, mask), mask


def _tiny_config(**overrides):
    return resolve_model_config("albef-tiny", vocab_size=VOCAB, **overrides)


# --- causal layers ----------------------------------------------------------------------------------


def test_causal_layer_ignores_the_future_and_default_layer_does_not():
    torch.manual_seed(0)
    config = _tiny_config()
    causal, bidirectional = BertLayer(config, causal=True).eval(), BertLayer(config).eval()
    x = torch.randn(2, 8, config.text_width)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    t = 4
    changed = x.clone()
    changed[:, t + 1 :] = torch.randn(2, 8 - t - 1, config.text_width)
    out, out_changed = causal(x, mask), causal(changed, mask)
    torch.testing.assert_close(out[:, : t + 1], out_changed[:, : t + 1])
    assert not torch.allclose(out[:, t + 1 :], out_changed[:, t + 1 :])
    assert not torch.allclose(bidirectional(x, mask)[:, : t + 1], bidirectional(changed, mask)[:, : t + 1])
    # padding is still masked in causal mode: changing a padded position changes nothing real
    padded = x.clone()
    padded[1, 6:] += 1.0
    torch.testing.assert_close(causal(x, mask)[1, :6], causal(padded, mask)[1, :6])
    assert sorted(k for k, _ in causal.named_parameters()) == sorted(k for k, _ in bidirectional.named_parameters())


def test_decoder_start_step_equals_first_position_of_full_pass(vqa, states):
    q, q_mask = states
    ids, mask = _padded(CANDIDATES[:3])
    full = vqa.decoder(ids, mask, q, q_mask)
    start = vqa.decoder(ids[:, :1], torch.ones_like(ids[:, :1]), q, q_mask)
    torch.testing.assert_close(full[:, 0], start[:, 0])


# --- initialisation --------------------------------------------------------------------------------


def _assert_same(a: torch.nn.Module, b: torch.nn.Module, skip: tuple[str, ...] = ()):
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for name in sa:
        if not name.startswith(skip):
            torch.testing.assert_close(sa[name], sb[name], rtol=0, atol=0, msg=name)


def test_from_pretrained_copies_the_right_weights():
    torch.manual_seed(1)
    albef = create_model("albef-tiny", vocab_size=VOCAB)
    vqa = AlbefVQA.from_pretrained(albef)
    _assert_same(vqa.albef, albef)
    _assert_same(vqa.decoder.embeddings, albef.text_encoder.embeddings)
    _assert_same(vqa.decoder.lm_head, albef.mlm_head)
    assert len(vqa.decoder.layers) == albef.config.fusion_layers
    for mine, theirs in zip(vqa.decoder.layers, albef.fusion_encoder.layers):
        assert mine.causal and not theirs.causal
        _assert_same(mine, theirs)
    # copies, not shared storage: training the VQA model leaves the pretrained model alone
    assert vqa.decoder.layers[0].ffn_in.weight.data_ptr() != albef.fusion_encoder.layers[0].ffn_in.weight.data_ptr()
    # the LM head is tied to the decoder's own embeddings
    h = torch.randn(2, albef.config.text_width)
    torch.testing.assert_close(vqa.decoder.lm_head(h, vqa.decoder.embeddings.word.weight), albef.mlm_logits(h))


def test_from_pretrained_with_unequal_widths_keeps_bert_init_for_cross_key_value():
    torch.manual_seed(2)
    albef = create_model("albef-tiny", vocab_size=VOCAB, vision_width=96, vision_heads=3, vision_layers=1)
    vqa = AlbefVQA.from_pretrained(albef)
    width = albef.config.text_width
    for mine, theirs in zip(vqa.decoder.layers, albef.fusion_encoder.layers):
        assert mine.cross_attn.key.weight.shape == (width, width)
        assert theirs.cross_attn.key.weight.shape == (width, 96)
        assert mine.cross_attn.key.weight.std().item() == pytest.approx(0.02, rel=0.2)
        _assert_same(mine, theirs, skip=("cross_attn.key.", "cross_attn.value."))


# --- loss and ranking against loops ----------------------------------------------------------------


def _answer_log_likelihood(vqa, q_state, q_mask, tokens: list[int]) -> tuple[float, float]:
    """(first-token log-prob, full log-likelihood) of one unpadded answer for one question, token by token."""
    ids = torch.tensor([[CLS, *tokens, SEP]])
    logp = F.log_softmax(vqa.decoder(ids, torch.ones_like(ids), q_state, q_mask), dim=-1)[0]
    per_token = [logp[t, ids[0, t + 1]].item() for t in range(ids.shape[1] - 1)]
    return per_token[0], sum(per_token)


def _brute_force(vqa, states) -> tuple[torch.Tensor, torch.Tensor]:
    q, q_mask = states
    first = torch.zeros(q.shape[0], len(CANDIDATES), dtype=torch.float64)
    full = torch.zeros_like(first)
    for i in range(q.shape[0]):
        for c, tokens in enumerate(CANDIDATES):
            first[i, c], full[i, c] = _answer_log_likelihood(vqa, q[i : i + 1], q_mask[i : i + 1], tokens)
    return first, full


def test_rank_answers_matches_brute_force(vqa, states):
    q, q_mask = states
    ids, mask = _padded(CANDIDATES)
    first, full = _brute_force(vqa, states)
    for k in (len(CANDIDATES), 100):
        assert torch.equal(vqa.rank_answers(q, q_mask, ids, mask, k=k), full.argmax(dim=1))
    for k in (1, 2, 3):
        keep = first.topk(k, dim=1).indices
        expected = keep.gather(1, full.gather(1, keep).argmax(dim=1, keepdim=True)).squeeze(1)
        got = vqa.rank_answers(q, q_mask, ids, mask, k=k)
        assert got.dtype == torch.int64 and torch.equal(got, expected), k
        # chunking over questions changes nothing
        assert torch.equal(vqa.rank_answers(q, q_mask, ids, mask, k=k, question_chunk=2), expected)


def test_answer_loss_matches_per_answer_loop(vqa, states):
    q, q_mask = states
    answers = [[7], [8, 9], [10, 11, 12], [14], [15, 9, 16], [7, 13]]
    counts = [2, 1, 3]
    owner = [0, 0, 1, 2, 2, 2]
    weights = torch.tensor([0.7, 0.3, 1.0, 0.5, 0.25, 0.25], dtype=torch.float64)
    ids, mask = _padded(answers)
    loss = vqa.answer_loss(q, q_mask, ids, mask, weights, counts)
    expected = (
        sum(
            -w * _answer_log_likelihood(vqa, q[i : i + 1], q_mask[i : i + 1], a)[1]
            for w, i, a in zip(weights.tolist(), owner, answers)
        )
        / q.shape[0]
    )
    assert loss.shape == ()
    assert loss.item() == pytest.approx(expected, rel=1e-9)
    # counts as a tensor work the same
    assert vqa.answer_loss(q, q_mask, ids, mask, weights, torch.tensor(counts)).item() == pytest.approx(loss.item())


def test_runs_under_bf16_autocast():
    torch.manual_seed(3)
    vqa = AlbefVQA.from_pretrained(create_model("albef-tiny", vocab_size=VOCAB)).eval()
    images, q_ids, q_mask = _questions(b=2)
    ids, mask = _padded(CANDIDATES)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q = vqa.encode_question(images, q_ids, q_mask)
        loss = vqa.answer_loss(q, q_mask, ids[:4], mask[:4], torch.ones(4), [2, 2])
        best = vqa.rank_answers(q, q_mask, ids, mask, k=3)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert best.shape == (2,) and best.dtype == torch.int64


# --- saving and training ---------------------------------------------------------------------------


def test_state_dict_round_trips_through_safetensors(tmp_path):
    torch.manual_seed(4)
    vqa = AlbefVQA.from_pretrained(create_model("albef-tiny", vocab_size=VOCAB)).eval()
    state = vqa.state_dict()
    assert len({t.data_ptr() for t in state.values()}) == len(state), "no aliased tensors"
    save_file(state, tmp_path / "vqa.safetensors")
    torch.manual_seed(5)
    fresh = AlbefVQA(vqa.config).eval()
    fresh.load_state_dict(load_file(tmp_path / "vqa.safetensors"))
    images, q_ids, q_mask = _questions(b=2)
    ids, mask = _padded(CANDIDATES[:4])
    with torch.no_grad():
        a = vqa.answer_loss(vqa.encode_question(images, q_ids, q_mask), q_mask, ids, mask, torch.ones(4), [2, 2])
        b = fresh.answer_loss(fresh.encode_question(images, q_ids, q_mask), q_mask, ids, mask, torch.ones(4), [2, 2])
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_tiny_overfit_learns_the_answers():
    torch.manual_seed(6)
    # one ViT block on 32 px images keeps the 30 CPU steps fast; the text side is full albef-tiny
    albef = create_model(
        "albef-tiny", vocab_size=VOCAB, image_size=32, vision_layers=1, hidden_dropout=0.0, attention_dropout=0.0
    )
    vqa = AlbefVQA.from_pretrained(albef).train()
    images, q_ids, q_mask = _questions(b=3, seed=6, image_size=32)
    answers = [[7], [8, 9], [10, 11, 12]]
    ids, mask = _padded(answers)
    # every question has all 3 answers; its own answer carries most of the weight
    all_ids, all_mask = ids.repeat(3, 1), mask.repeat(3, 1)
    weights = torch.full((3, 3), 0.1).fill_diagonal_(0.8).flatten()
    optimizer = torch.optim.Adam(vqa.parameters(), lr=3e-4)
    losses = []
    for _ in range(30):
        q = vqa.encode_question(images, q_ids, q_mask)
        loss = vqa.answer_loss(q, q_mask, all_ids, all_mask, weights, [3, 3, 3])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    vqa.eval()
    q = vqa.encode_question(images, q_ids, q_mask)
    for k in (1, 3):
        assert vqa.rank_answers(q, q_mask, ids, mask, k=k).tolist() == [0, 1, 2]
