"""`pretrain.runtime.compile`: the compiled encoders compute what the eager ones do and keep their names."""

from __future__ import annotations

import pytest
import torch

from falcon_cli.models.registry import create_model

pytestmark = pytest.mark.slow  # (torch.compile: `make test-all`)


def test_compiled_encoders_match_eager_and_keep_parameter_names():
    torch.manual_seed(0)
    eager = create_model("albef-tiny", vocab_size=120).eval()
    compiled = create_model("albef-tiny", vocab_size=120).eval()
    compiled.load_state_dict(eager.state_dict())
    names = list(compiled.state_dict())
    # a backend that records each graph it is given and runs it as traced (no C++ code generation)
    graphs = []

    def recording_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    compiled.compile_encoders(backend=recording_backend, dynamic=False)
    assert list(compiled.state_dict()) == names  # checkpoints are interchangeable
    images = torch.randn(3, 3, 64, 64, requires_grad=True)
    ids = torch.randint(5, 120, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    outputs = []
    for model in (eager, compiled):
        tokens, image_feat = model.encode_image(images)
        text_tokens, text_feat = model.encode_text(ids, mask)
        fused = model.fuse(text_tokens, mask, tokens)
        loss = fused.square().mean() + (image_feat * text_feat).sum()
        (grad,) = torch.autograd.grad(loss, images)
        outputs.append((fused.detach(), image_feat.detach(), text_feat.detach(), grad))
    for eager_out, compiled_out in zip(*outputs):
        torch.testing.assert_close(compiled_out, eager_out, rtol=1e-5, atol=1e-6)
    # each encoder really went through the compiler: the ViT's patch embedding, the text embeddings, the
    # fusion layers' cross-attention each appear in a traced graph
    code = "\n".join(graph.code for graph in graphs)
    assert "patch_embed" in code and "embeddings" in code and "cross_attn" in code, code[:2000]
