"""SigLIP's sigmoid loss (falcon_cli/objectives/sigmoid.py) against a loop and against open_clip's SigLipLoss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from falcon_cli.objectives.sigmoid import sigmoid_loss


def _features(b=5, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (F.normalize(torch.randn(b, d, generator=g), dim=-1), F.normalize(torch.randn(b, d, generator=g), dim=-1))


def _loop(image, text, scale, bias, positives=(), dropped=()):
    b = image.shape[0]
    total = 0.0
    for i in range(b):
        for j in range(b):
            if (i, j) in dropped and i != j:
                continue
            z = 1.0 if i == j or (i, j) in positives else -1.0
            logit = scale * float(image[i] @ text[j]) + bias
            total += -math.log(1 / (1 + math.exp(-z * logit)))
    return total / b


def test_sigmoid_loss_matches_a_loop_and_the_two_false_negative_treatments():
    image, text = _features()
    assert sigmoid_loss(image, text, 10.0, -10.0).item() == pytest.approx(_loop(image, text, 10.0, -10.0), rel=1e-6)
    converted = torch.zeros(5, 5, dtype=torch.bool)
    converted[0, 3] = converted[2, 1] = True
    got = sigmoid_loss(image, text, 7.0, -3.0, positive_mask=converted).item()
    assert got == pytest.approx(_loop(image, text, 7.0, -3.0, positives={(0, 3), (2, 1)}), rel=1e-6)
    dropped = converted.clone()
    dropped[4, 4] = True  # the diagonal is never dropped
    got = sigmoid_loss(image, text, 7.0, -3.0, exclude=dropped).item()
    assert got == pytest.approx(_loop(image, text, 7.0, -3.0, dropped={(0, 3), (2, 1)}), rel=1e-6)


def test_sigmoid_loss_equals_open_clips_siglip_loss_with_its_gradients():
    from open_clip.loss import SigLipLoss

    image, text = _features(6, 16, seed=1)
    ours_inputs = [
        image.clone().requires_grad_(),
        text.clone().requires_grad_(),
        torch.tensor(math.log(10.0), requires_grad=True),
        torch.tensor(-10.0, requires_grad=True),
    ]
    theirs_inputs = [t.detach().clone().requires_grad_() for t in ours_inputs]
    ours = sigmoid_loss(ours_inputs[0], ours_inputs[1], ours_inputs[2].exp(), ours_inputs[3])
    theirs = SigLipLoss()(theirs_inputs[0], theirs_inputs[1], theirs_inputs[2].exp(), theirs_inputs[3])
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    ours.backward()
    theirs.backward()
    for a, b in zip(ours_inputs, theirs_inputs):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_sigmoid_loss_is_float32_under_autocast_and_checks_shapes():
    image, text = _features()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = sigmoid_loss(image.bfloat16(), text.bfloat16(), 10.0, -10.0)
    assert loss.dtype == torch.float32
    with pytest.raises(ValueError, match="same batch size"):
        sigmoid_loss(image, text[:3], 10.0, -10.0)


def _ring_worker(rank: int, world: int, store: str, image, text, out: str):
    import torch.distributed as dist

    from falcon_cli.objectives.sigmoid import distributed_sigmoid_loss

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    b = image.shape[0] // world
    mine = slice(rank * b, (rank + 1) * b)
    x, y = image[mine].clone().requires_grad_(), text[mine].clone().requires_grad_()
    scale, bias = torch.tensor(10.0, requires_grad=True), torch.tensor(-10.0, requires_grad=True)
    loss = distributed_sigmoid_loss(x, y, scale, bias)
    loss.backward()
    torch.save(
        {"loss": loss.detach(), "image": x.grad, "text": y.grad, "scale": scale.grad, "bias": bias.grad},
        f"{out}.{rank}",
    )
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_the_ring_exchange_gives_the_global_batchs_loss_and_gradients(tmp_path, world):
    """Each rank holds B/world pairs; the mean of the ranks' losses is the global batch's sigmoid loss, and each
    rank's feature gradients are world × the global loss's (DDP averages parameter gradients over the ranks)."""
    import torch.multiprocessing as mp

    image, text = _features(6, 8, seed=3)
    out = str(tmp_path / "grads")
    mp.spawn(_ring_worker, args=(world, str(tmp_path / "store"), image, text, out), nprocs=world, join=True)
    results = [torch.load(f"{out}.{r}") for r in range(world)]
    x, y = image.clone().requires_grad_(), text.clone().requires_grad_()
    scale, bias = torch.tensor(10.0, requires_grad=True), torch.tensor(-10.0, requires_grad=True)
    reference = sigmoid_loss(x, y, scale, bias)
    reference.backward()
    assert sum(r["loss"] for r in results).item() / world == pytest.approx(reference.item(), rel=1e-5)
    b = 6 // world
    for rank, r in enumerate(results):
        assert torch.allclose(r["image"] / world, x.grad[rank * b : (rank + 1) * b], atol=1e-6)
        assert torch.allclose(r["text"] / world, y.grad[rank * b : (rank + 1) * b], atol=1e-6)
    assert sum(r["scale"] for r in results).item() / world == pytest.approx(scale.grad.item(), rel=1e-5)
    assert sum(r["bias"] for r in results).item() / world == pytest.approx(bias.grad.item(), rel=1e-5)
