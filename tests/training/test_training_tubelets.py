"""The optional 3D patch embedding of volumes (``model.patch_depth`` > 1): tubelets of consecutive slices, a patch
convolution that is a Conv3d over each tubelet, shapes and masks through a tiny encoder."""

from __future__ import annotations

import pytest
import torch


def _cfg(**kw):
    from training.config import EncoderModelConfig

    backbone = {"kind": "vit", "image_size": 16, "patch_size": 8, "hidden_size": 32, "num_layers": 1}
    backbone |= {"num_heads": 4, "intermediate_size": 64}
    return EncoderModelConfig(backbone=backbone, max_slices=5, embed_dim=8, pool_heads=4, **kw)


def test_tubelets_group_real_slices_and_repeat_the_last():
    from training.encoder import tubelets

    images = torch.arange(5, dtype=torch.float32)[None, :, None, None, None].expand(2, 5, 1, 2, 2).clone()
    images[1] += 10
    mask = torch.tensor([[True] * 5, [True] + [False] * 4])
    units, unit_mask = tubelets(images, mask, 2)
    assert units.shape == (2, 3, 2, 2, 2) and unit_mask.tolist() == [[True] * 3, [True, False, False]]
    assert units[0, :, :, 0, 0].tolist() == [[0, 1], [2, 3], [4, 4]]  # the last tubelet repeats slice 4
    assert units[1, 0, :, 0, 0].tolist() == [10, 10]  # a 2D image: one tubelet of copies of itself
    three, m3 = tubelets(images[:, :, :, :, :].repeat(1, 1, 3, 1, 1), mask, 2)  # C = 3: channel k*C + c
    assert three.shape == (2, 3, 6, 2, 2) and three[0, 1, :, 0, 0].tolist() == [2, 2, 2, 3, 3, 3]
    assert torch.equal(m3, unit_mask)


def test_3d_patch_embedding_shapes_masks_and_conv3d_equivalence():
    from training.encoder import EntityAwareEncoder, tubelets

    torch.manual_seed(0)
    enc = EntityAwareEncoder(_cfg(patch_depth=2), n_entities=3, n_families=2)
    proj = enc.tokens.backbone.vit.embeddings.patch_embeddings.projection
    assert proj.in_channels == 2 and proj.kernel_size == (8, 8)
    images = torch.rand(2, 5, 1, 16, 16)
    mask = torch.tensor([[True] * 5, [True] + [False] * 4])  # a 5-slice volume and a 2D image
    seen = []
    hook = enc.tokens.backbone.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    tok, pad = enc.tokens(images, mask)
    hook.remove()
    assert seen == [(4, 2, 16, 16)]  # 3 tubelets + 1 image through the backbone, not 6 slices
    assert tok.shape == (2, 3 * (1 + 4), 32) and pad.shape == (2, 15)
    assert not pad[0].any() and pad[1].tolist() == [False] * 5 + [True] * 10
    # the patch convolution over stacked slices is a Conv3d with kernel and stride (2, 8, 8) over the tubelet
    units, _ = tubelets(images, mask, 2)
    w3 = proj.weight.view(32, 2, 1, 8, 8).permute(0, 2, 1, 3, 4)  # (D, C, depth, p, p)
    vol = units[0].view(3, 2, 1, 16, 16).permute(0, 2, 1, 3, 4)  # (U, C, depth, H, W)
    want = torch.nn.functional.conv3d(vol, w3, proj.bias, stride=(2, 8, 8)).flatten(2)
    assert torch.allclose(proj(units[0]).flatten(2), want, atol=1e-5)
    # the encoder end to end: unit vectors, gradient to the 3D patch embedding
    z = enc(images, mask, torch.tensor([0, 2]), torch.tensor([1, 0]))
    assert z.shape == (2, 8) and torch.allclose(z.norm(dim=-1), torch.ones(2), atol=1e-5)
    z.sum().backward()
    assert proj.weight.grad is not None and proj.weight.grad.abs().sum() > 0


def test_patch_depth_needs_the_built_vit():
    from pydantic import ValidationError

    from training.config import EncoderModelConfig

    with pytest.raises(ValidationError, match="patch_depth 2 needs backbone.kind vit"):
        EncoderModelConfig(backbone={"kind": "resnet"}, patch_depth=2)
    assert _cfg().patch_depth == 1
