"""The dual encoder on open_clip: the caption loss and decoder against references, padding, the sigmoid loss's
false-negative treatments against loops, the objective's parts, and weights from open_clip files and directories."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from falcon_cli.errors import FalconError
from falcon_cli.models.registry import create_model
from falcon_cli.objectives.captioning import caption_loss
from falcon_cli.objectives.dual import DualObjective
from falcon_cli.objectives.false_negatives import Diht, Glofnd, Mafa, PlainItc, Srcl, StepContext
from falcon_cli.objectives.qformer import itg_loss
from falcon_cli.objectives.sigmoid import sigmoid_loss


def tiny(**overrides):
    torch.manual_seed(0)
    return create_model("dual-tiny", vocab_size=50, **overrides).eval()


def captions(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (4, 7), generator=g)
    ids[:, 0] = 2
    lengths = [7, 5, 3, 6]
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, n - 1], mask[i, :n] = 3, 1
        ids[i, n:] = 0
    return ids, mask


def test_caption_loss_against_a_token_by_token_reference():
    g = torch.Generator().manual_seed(1)
    ids, mask = captions()
    logits = torch.randn(4, 7, 50, generator=g)
    for smoothing in (0.0, 0.1):
        terms, per_caption = [], []
        for b in range(4):
            mine = []
            for t in range(6):
                if mask[b, t + 1]:
                    logp = F.log_softmax(logits[b, t], -1)
                    mine.append(-(1 - smoothing) * logp[ids[b, t + 1]] - smoothing * logp.mean())
            terms += mine
            per_caption.append(torch.stack(mine).mean())
        assert caption_loss(logits, ids, mask, label_smoothing=smoothing) == pytest.approx(
            float(torch.stack(terms).mean()), rel=1e-5
        )
        assert torch.allclose(
            caption_loss(logits, ids, mask, label_smoothing=smoothing, per_sample=True),
            torch.stack(per_caption),
            rtol=1e-5,
        )
    assert itg_loss(logits, ids, mask) == caption_loss(logits, ids, mask, label_smoothing=0.1), (
        "BLIP-2's ITG is the same loss"
    )


def test_the_decoder_is_causal_and_reads_the_image():
    model = tiny()
    ids, _ = captions()
    images = torch.randn(4, 3, 48, 48)
    tokens, _ = model.encode_image(images)
    logits = model.caption_logits(tokens, ids)
    changed = ids.clone()
    changed[:, 4:] = 7
    assert torch.allclose(model.caption_logits(tokens, changed)[:, :4], logits[:, :4], atol=1e-5), "no peeking ahead"
    assert not torch.allclose(model.caption_logits(tokens.flip(0), ids), logits, atol=1e-3), "grounded in the image"


def test_text_features_do_not_depend_on_padding():
    ids, mask = captions()
    for pool in ("first", "last"):
        model = tiny(text_pool=pool)
        _, short = model.encode_text(ids, mask)
        longer = F.pad(ids, (0, 9))
        _, padded = model.encode_text(longer, F.pad(mask, (0, 9)))
        assert torch.allclose(short, padded, atol=1e-5), pool
        assert torch.allclose(short.norm(dim=-1), torch.ones(4), atol=1e-5)


def reference_sigmoid(image, text, t, b, labels, weights):
    total = 0.0
    for i in range(len(image)):
        for j in range(len(text)):
            logit = t * float(image[i] @ text[j]) + b
            total += weights[i][j] * -math.log(1 / (1 + math.exp(-labels[i][j] * logit)))
    return total / len(image)


def features(n=6, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=g), dim=-1), F.normalize(torch.randn(n, d, generator=g), dim=-1)


def test_sigmoid_treatments_of_each_method_against_loops():
    image, text = features()
    n, t, b = 6, torch.tensor(10.0), torch.tensor(-3.0)
    eye = [[1.0 if i == j else -1.0 for j in range(n)] for i in range(n)]
    ones = [[1.0] * n for _ in range(n)]
    context = StepContext(torch.arange(n), epoch=2, step=5, total_steps=10)
    # plain
    assert float(PlainItc().sigmoid(image, text, t, b, context)) == pytest.approx(
        reference_sigmoid(image, text, 10, -3, eye, ones), rel=1e-5
    )
    # DiHT: each negative weighted by the mean of its two anchors' (N - 1) softmax_{j != i}(beta t s)
    beta = 0.5
    s = (image @ text.t()).tolist()

    def row_weights(matrix, i):
        others = [math.exp(beta * 10 * matrix[i][j]) for j in range(n) if j != i]
        return {j: (n - 1) * math.exp(beta * 10 * matrix[i][j]) / sum(others) for j in range(n) if j != i}

    st = [list(col) for col in zip(*s)]
    weights = [
        [1.0 if i == j else (row_weights(s, i)[j] + row_weights(st, j)[i]) / 2 for j in range(n)] for i in range(n)
    ]
    got = Diht(beta=beta).sigmoid(image, text, t, b, context)
    assert float(got) == pytest.approx(reference_sigmoid(image, text, 10, -3, eye, weights), rel=1e-5)
    # SRCL: the same with (N - 1) softmax(-delta cos_mix), aux features of the pairs
    aux_i, aux_t = features(seed=3)
    srcl = Srcl(lambda ids: (aux_i[ids], aux_t[ids]), delta=2.0, until=1.0)
    mix = 1 - 5 / 10
    mixed = (mix * (aux_i @ aux_t.t()) + (1 - mix) * (image @ text.t())).tolist()
    mixed_t = [list(col) for col in zip(*mixed)]

    def srcl_row(matrix, i):
        others = [math.exp(-2.0 * matrix[i][j]) for j in range(n) if j != i]
        return {j: (n - 1) * math.exp(-2.0 * matrix[i][j]) / sum(others) for j in range(n) if j != i}

    weights = [
        [1.0 if i == j else (srcl_row(mixed, i)[j] + srcl_row(mixed_t, j)[i]) / 2 for j in range(n)] for i in range(n)
    ]
    assert float(srcl.sigmoid(image, text, t, b, context)) == pytest.approx(
        reference_sigmoid(image, text, 10, -3, eye, weights), rel=1e-5
    )


def test_mafa_converts_and_glofnd_drops_in_the_sigmoid_loss():
    image, text = features()
    text[2] = image[0]  # caption 2 describes image 0: a false negative the judge confirms
    n, t, b = 6, torch.tensor(10.0), torch.tensor(-3.0)
    context = StepContext(torch.arange(n), epoch=1)
    judge = lambda image_ids, text_ids, epoch: ((image_ids == 0) & (text_ids == 2)).float()  # noqa: E731
    mafa = Mafa(judge, high=0.8, low=0.5)
    loss = mafa.sigmoid(image, text, t, b, context)
    assert mafa.flagged[0][0, 2] and int(mafa.flagged[0].sum()) == 1
    labels = [[1.0 if i == j or (i, j) == (0, 2) else -1.0 for j in range(n)] for i in range(n)]
    assert float(loss) == pytest.approx(reference_sigmoid(image, text, 10, -3, labels, [[1.0] * n] * n), rel=1e-5)

    glofnd = Glofnd(list(range(n)), alpha=0.2, lr=0.5, start_epoch=1)
    loss = glofnd.sigmoid(image, text, t, b, context)
    dropped = glofnd.flagged[0]
    assert dropped[0, 2] and not dropped.diagonal().any()
    weights = [[0.0 if dropped[i, j] else 1.0 for j in range(n)] for i in range(n)]
    eye = [[1.0 if i == j else -1.0 for j in range(n)] for i in range(n)]
    assert float(loss) == pytest.approx(reference_sigmoid(image, text, 10, -3, eye, weights), rel=1e-5)
    assert torch.allclose(loss, sigmoid_loss(image, text, t, b, exclude=dropped))


def test_the_objective_sums_its_parts_and_measures_them_on_the_same_inputs():
    model = tiny()
    objective = DualObjective(model, caption_weight=0.5)
    ids, mask = captions()
    images = torch.randn(4, 3, 48, 48)
    out = objective(images, ids, mask)
    assert float(out.loss.detach()) == pytest.approx(float(out.itc + 0.5 * out.caption), rel=1e-6)
    measured = objective.measure(images, ids, mask, parts=("itc", "caption", "alignment"))
    assert float(measured["itc"]) == pytest.approx(float(out.itc), rel=1e-5)
    assert float(measured["caption"]) == pytest.approx(float(out.caption), rel=1e-5)
    per = objective.measure(images, ids, mask, parts=("caption",), per_pair=True)["caption"]
    assert per.shape == (4,)
    reused = objective.measure(images, ids, mask, parts=("caption",), image=objective.image_state(out))
    assert float(reused["caption"]) == pytest.approx(float(out.caption), rel=1e-5)
    out.loss.backward()
    assert model.clip.logit_scale.grad is not None and model.clip.logit_bias.grad is not None, "t and b are learned"
    assert all(p.grad is not None for p in model.decoder.parameters()), "the caption loss trains the decoder"

    softmax = DualObjective(tiny(contrastive="softmax", logit_scale_init=1 / 0.07))
    out = softmax(images, ids, mask)
    from falcon_cli.objectives.itc import itc_grit

    expected = itc_grit(
        out.image_feat, out.text_feat, softmax.model.temperature(), consistency_weight=0.0, stop_gradient=False
    )
    assert float(out.itc) == pytest.approx(float(expected.loss.detach()), rel=1e-5), "CLIP's InfoNCE"


def test_a_model_without_a_decoder_says_so_in_one_line():
    model = tiny(decoder_layers=0)
    with pytest.raises(FalconError, match="no captioning decoder"):
        model.caption_logits(torch.zeros(1, 4, 96), torch.zeros(1, 3, dtype=torch.long))


def test_siglip_statistics_renormalise_inside_the_model():
    model = tiny(image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
    from falcon_cli.data.transforms import CLIP_MEAN, CLIP_STD

    raw = torch.rand(2, 3, 48, 48)
    clip_normalised = (raw - torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)) / torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    _, ours = model.encode_image(clip_normalised)
    from falcon_cli.models.dual import open_clip_image

    _, direct = open_clip_image(model.clip, (raw - 0.5) / 0.5)
    assert torch.allclose(ours, direct, atol=1e-5)


OPEN_CLIP_TINY = {
    "embed_dim": 32,
    "init_logit_bias": -10,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {
        "context_length": 16,
        "vocab_size": 100,
        "width": 64,
        "heads": 2,
        "layers": 1,
        "no_causal_mask": True,
        "pool_type": "last",
    },
}


@pytest.fixture
def open_clip_files(tmp_path):
    """A tiny open_clip architecture registered with open_clip, its weights as a checkpoint file and as a
    ``local-dir:`` directory (open_clip_config.json + open_clip_model.safetensors)."""
    import open_clip
    from safetensors.torch import save_file

    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "falcon-test-tiny.json").write_text(json.dumps(OPEN_CLIP_TINY))
    open_clip.add_model_config(configs)
    torch.manual_seed(3)
    reference = open_clip.create_model("falcon-test-tiny")
    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    torch.save(state, tmp_path / "weights.pt")
    directory = tmp_path / "local"
    directory.mkdir()
    (directory / "open_clip_config.json").write_text(json.dumps({"model_cfg": OPEN_CLIP_TINY, "preprocess_cfg": {}}))
    save_file(state, str(directory / "open_clip_model.safetensors"))
    return reference, tmp_path / "weights.pt", directory


def test_weights_from_an_open_clip_file_and_a_local_directory(open_clip_files):
    reference, file, directory = open_clip_files
    common = dict(image_size=32, context_length=16, embed_dim=32, text_pool="last", vocab_size=100, decoder_layers=0)
    for source in (
        {"open_clip_model": "falcon-test-tiny", "open_clip_weights": str(file)},
        {"open_clip_model": f"local-dir:{directory}"},
    ):
        model = create_model("dual-tiny", **common, **source)
        for key, value in reference.state_dict().items():
            assert torch.equal(model.clip.state_dict()[key], value), (source, key)
        assert float(model.logit_bias()) == pytest.approx(-10.0), "open_clip's own SigLIP bias"


def test_a_named_model_whose_sizes_differ_from_its_config_is_refused(open_clip_files):
    with pytest.raises(FalconError, match="embed_dim is 32"):
        create_model("dual-tiny", open_clip_model="falcon-test-tiny", image_size=32, context_length=16, embed_dim=64)
    with pytest.raises(FalconError, match="unknown open_clip model"):
        create_model("dual-tiny", open_clip_model="ViT-B-16-SigLIPP")


OPEN_CLIP_TINY_COCA = {
    "embed_dim": 32,
    "vision_cfg": {
        "image_size": 32,
        "layers": 1,
        "width": 64,
        "head_width": 32,
        "patch_size": 8,
        "attentional_pool": True,
        "attn_pooler_heads": 2,
        "attn_pooler_queries": 6,
        "output_tokens": True,
    },
    "text_cfg": {
        "context_length": 16,
        "vocab_size": 100,
        "width": 32,
        "heads": 2,
        "layers": 1,
        "embed_cls": True,
        "output_tokens": True,
    },
    # the decoder reads the pooler's embed_dim-wide image tokens and the text tower's tokens
    "multimodal_cfg": {
        "context_length": 16,
        "vocab_size": 100,
        "width": 32,
        "heads": 2,
        "layers": 1,
        "attn_pooler_heads": 2,
    },
    "custom_text": True,
}


@pytest.fixture
def coca_directory(tmp_path):
    """A tiny open_clip CoCa and a ``local-dir:`` directory holding it."""
    import open_clip
    from safetensors.torch import save_file

    from falcon_cli.models.dual import init_multimodal_transformer

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "falcon-test-coca.json").write_text(json.dumps(OPEN_CLIP_TINY_COCA))
    open_clip.add_model_config(tmp_path / "configs")
    torch.manual_seed(4)
    reference = open_clip.create_model("falcon-test-coca").eval()
    init_multimodal_transformer(reference.text_decoder)  # open_clip leaves its projection uninitialised
    directory = tmp_path / "coca"
    directory.mkdir()
    (directory / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": OPEN_CLIP_TINY_COCA, "preprocess_cfg": {}})
    )
    save_file(
        {k: v.contiguous() for k, v in reference.state_dict().items()}, str(directory / "open_clip_model.safetensors")
    )
    return reference, directory


def test_a_coca_trains_with_its_own_decoder_as_open_clip_defines_it(coca_directory):
    """A CoCa's contrastive and caption losses equal open_clip's CoCaLoss on open_clip's own forward, for captions
    from a tokenizer that pads with end-of-text (Hugging Face's CLIP) rather than open_clip's 0."""
    from open_clip.loss import CoCaLoss

    from falcon_cli.models.dual import open_clip_image

    reference, directory = coca_directory
    sot, eot = 97, 98
    model = create_model(
        "dual-tiny",
        open_clip_model=f"local-dir:{directory}",
        image_size=32,
        context_length=16,
        embed_dim=32,
        vocab_size=100,
        decoder_layers=0,
        contrastive="softmax",
        logit_scale_init=1 / 0.07,
        pad_token_id=eot,
    ).eval()
    assert model.coca and model.has_decoder and model.config.is_coca and model.config.has_decoder
    g = torch.Generator().manual_seed(5)
    lengths = [9, 4, 6, 3]
    ids = torch.full((4, 9), eot)  # padded with end-of-text, as Hugging Face's CLIP tokenizer pads
    mask = torch.zeros_like(ids)
    open_clip_ids = torch.zeros(4, 16, dtype=torch.long)  # open_clip's tokenizer: 0-padded to the context
    for i, n in enumerate(lengths):
        caption = torch.cat([torch.tensor([sot]), torch.randint(1, 96, (n - 2,), generator=g), torch.tensor([eot])])
        ids[i, :n], mask[i, :n], open_clip_ids[i, :n] = caption, 1, caption
    images = torch.randn(4, 3, 32, 32, generator=g)

    out = DualObjective(model, caption_weight=2.0)(images, ids, mask)
    with torch.no_grad():
        expected = reference(images, open_clip_ids)
        contrastive, caption = CoCaLoss(caption_loss_weight=1.0, clip_loss_weight=1.0, pad_id=0)(
            expected["image_features"],
            expected["text_features"],
            expected["logits"],
            expected["labels"],
            expected["logit_scale"],
        )
    assert torch.allclose(out.image_feat, expected["image_features"], atol=1e-5)
    assert torch.allclose(out.text_feat, expected["text_features"], atol=1e-5), "re-padded as open_clip pads"
    assert float(out.itc) == pytest.approx(float(contrastive), rel=1e-5)
    assert float(out.caption) == pytest.approx(float(caption), rel=1e-5)
    assert float(out.loss.detach()) == pytest.approx(float(contrastive + 2 * caption), rel=1e-5)
    # the same features through the path falcon embed reads, and from a shorter batch padding
    assert torch.allclose(open_clip_image(model.clip, images)[1], out.image_feat, atol=1e-6)
    assert torch.allclose(model.encode_text(ids[1:2, :4], mask[1:2, :4])[1], out.text_feat[1:2], atol=1e-5)
    # the reward re-measures the same losses; the caption loss reaches the text tower through CoCa's decoder
    measured = DualObjective(model).measure(images, ids, mask, parts=("caption",))
    assert float(measured["caption"]) == pytest.approx(float(caption), rel=1e-5)
    text_only = DualObjective(model).measure(images, ids, mask, parts=("itc",))
    assert float(text_only["itc"]) == pytest.approx(float(contrastive), rel=1e-5)
    logits = model.caption_logits(model.encode_image(images)[0], model.caption_text(ids, mask))
    caption_loss(logits, ids, mask).backward()
    assert model.clip.text.token_embedding.weight.grad is not None, "CoCa's decoder reads the text tower"


def test_a_coca_refuses_a_second_decoder_and_is_recognised_before_it_is_built(coca_directory):
    from falcon_cli.models.dual import DualConfig

    _, directory = coca_directory
    for _ in range(3):  # from scratch, its decoder is initialised (open_clip leaves uninitialised memory)
        scratch = create_model(
            "dual-tiny",
            open_clip_model="falcon-test-coca",
            image_size=32,
            context_length=16,
            embed_dim=32,
            vocab_size=100,
            decoder_layers=0,
            contrastive="softmax",
        )
        projection = scratch.clip.text_decoder.text_projection
        assert torch.isfinite(projection).all() and float(projection.std()) == pytest.approx(32**-0.5, rel=0.2)
    with pytest.raises(ValueError, match="has its own captioning decoder"):
        DualConfig(open_clip_model=f"local-dir:{directory}", decoder_layers=2)
    assert DualConfig(open_clip_model="coca_ViT-B-32", decoder_layers=0).has_decoder
    assert not DualConfig(open_clip_model="ViT-B-16", decoder_layers=0).has_decoder


def test_a_checkpoint_round_trip_rebuilds_the_same_model(tmp_path):
    from falcon_cli.models.registry import model_from_weights
    from falcon_cli.models.weights import save_weights

    model = tiny()
    save_weights(model, tmp_path / "model.safetensors")
    again = model_from_weights(tmp_path / "model.safetensors").eval()
    ids, mask = captions()
    images = torch.randn(2, 3, 48, 48)
    assert torch.equal(model.encode_image(images)[1], again.encode_image(images)[1])
    assert torch.equal(model.encode_text(ids, mask)[1], again.encode_text(ids, mask)[1])


def test_reading_the_model_registry_imports_no_torchvision():
    """Every command validates its recipe first, which reads every model config (dual ones too): that must not pull
    in torchvision (a second of start-up on every command, through torch._dynamo)."""
    import subprocess
    import sys

    code = (
        "import sys; from falcon_cli.models.registry import get_model_config; get_model_config('dual-tiny'); "
        "print('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
