"""PBSD: its loss against a loop, the teacher without gradient, ROI pooling, boxes and cuts."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torchvision.ops import roi_align

import solo_ext.methods.pbsd as pbsd_module
from solo_ext.commands.pretrain import parse_cfg, run
from solo_ext.host import METHODS
from solo_ext.host.standalone.backbones import build_backbone
from solo_ext.losses.pbsd import pbsd_loss
from solo_ext.modules.feature_maps import feature_map
from solo_ext.modules.patches import crop_boxes, roi_pool, sample_boxes


def pbsd_reference(student, teacher, keys, queue, queue_labels, t):
    """Eq. 11-14 per box in float64: CE(softmax(teacher set / t), softmax(student set / t))."""
    boxes = student.size(0) // keys.size(0)
    members = [queue[j].double() for j in range(queue.size(0)) if queue_labels[j] != -1]
    total = 0.0
    for n in range(student.size(0)):
        key = keys[n // boxes].double()
        s, c = student[n].double(), teacher[n].double()
        t_logits = [float(c @ key) / t] + [float(c @ m) / t for m in members]
        s_logits = [float(s @ key) / t] + [float(s @ m) / t for m in members]
        t_z = sum(math.exp(v) for v in t_logits)
        s_lse = math.log(sum(math.exp(v) for v in s_logits))
        total += -sum(math.exp(tv) / t_z * (sv - s_lse) for tv, sv in zip(t_logits, s_logits))
    return total / student.size(0)


def _unit(n, d, gen):
    return F.normalize(torch.randn(n, d, generator=gen), dim=1)


@pytest.mark.parametrize("b,boxes,k_size,t", [(2, 5, 8, 0.07), (3, 1, 0, 0.2), (4, 3, 20, 0.5)])
def test_loss_matches_loop_and_teacher_gets_no_gradient(b, boxes, k_size, t):
    gen = torch.Generator().manual_seed(b + k_size)
    student = _unit(b * boxes, 16, gen).requires_grad_()
    teacher = _unit(b * boxes, 16, gen).requires_grad_()
    keys, queue = _unit(b, 16, gen), _unit(k_size, 16, gen)
    queue_labels = torch.randint(-1, 3, (k_size,), generator=gen)
    loss = pbsd_loss(student, teacher, keys, queue, queue_labels, t)
    assert loss.item() == pytest.approx(
        pbsd_reference(student, teacher, keys, queue, queue_labels, t), rel=1e-5
    )
    loss.backward()
    assert teacher.grad is None
    # with an empty queue the set is k_i alone: the loss is 0 and so is the student's gradient
    assert (student.grad.abs().sum() > 0) == (queue_labels != -1).any()


def test_student_gradient_matches_a_differentiable_loop():
    """d loss / d student against autograd through the per-box equation in float64."""
    gen = torch.Generator().manual_seed(5)
    student = _unit(6, 8, gen).double().requires_grad_()
    teacher, keys, queue = _unit(6, 8, gen), _unit(2, 8, gen), _unit(12, 8, gen)
    queue_labels = torch.randint(-1, 3, (12,), generator=gen)
    members = queue[queue_labels != -1].double()
    ref = 0.0
    for n in range(6):
        key = keys[n // 3].double()
        s_logits = torch.cat([(student[n] @ key)[None], members @ student[n]]) / 0.1
        t_logits = torch.cat([(teacher[n].double() @ key)[None], members @ teacher[n].double()])
        ref = ref - (torch.softmax(t_logits / 0.1, 0) * torch.log_softmax(s_logits, 0)).sum()
    (want,) = torch.autograd.grad(ref / 6, student)
    (got,) = torch.autograd.grad(
        pbsd_loss(student, teacher, keys, queue, queue_labels, 0.1), student
    )
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)


def test_loss_is_minimal_when_student_equals_teacher():
    gen = torch.Generator().manual_seed(0)
    teacher, keys, queue = _unit(6, 8, gen), _unit(2, 8, gen), _unit(10, 8, gen)
    labels = torch.zeros(10, dtype=torch.long)
    at_teacher = pbsd_loss(teacher, teacher, keys, queue, labels, 0.2)
    for _ in range(5):  # cross-entropy >= entropy, with equality at the teacher
        other = _unit(6, 8, gen)
        assert pbsd_loss(other, teacher, keys, queue, labels, 0.2) > at_teacher


def test_teacher_pooling_is_the_published_roi_align():
    """ResNet-50's 7x7 map of a 224 px crop: roi_align(map, boxes, (2, 2), 1/32) with
    torchvision's defaults, then the mean of the 2x2 bins (as the published code calls it)."""
    gen = torch.Generator().manual_seed(0)
    fmap = torch.randn(2, 16, 7, 7, generator=gen)
    boxes = sample_boxes(2, 5, 224, 224, generator=gen).round()  # integer boxes, as published
    rois = [boxes[i] for i in range(2)]  # roi_align's list form: one [L, 4] per image
    want = roi_align(fmap, rois, (2, 2), 1 / 32).mean(dim=(2, 3))
    torch.testing.assert_close(roi_pool(fmap, boxes, image_size=224), want)
    # and not the pixel-aligned variant solo-ext used before
    shifted = roi_align(fmap, rois, (2, 2), 1 / 32, sampling_ratio=2, aligned=True)
    assert not torch.allclose(roi_pool(fmap, boxes, 224), shifted.mean(dim=(2, 3)))


def test_boxes_inside_the_crop_with_the_asked_area_and_ratio():
    gen = torch.Generator().manual_seed(0)
    boxes = sample_boxes(64, 5, 48, 40, (0.05, 0.6), (3 / 4, 4 / 3), generator=gen)
    x1, y1, x2, y2 = boxes.unbind(-1)
    assert boxes.shape == (64, 5, 4)
    assert (x1 >= 0).all() and (y1 >= 0).all() and (x2 <= 40).all() and (y2 <= 48).all()
    area = (x2 - x1) * (y2 - y1) / (48 * 40)
    ratio = (x2 - x1) / (y2 - y1)
    assert area.min() >= 0.05 - 1e-4 and area.max() <= 0.6 + 1e-4
    assert ratio.min() >= 3 / 4 - 1e-4 and ratio.max() <= 4 / 3 + 1e-4


def test_cut_crops_equal_crop_then_resize():
    images = torch.randn(2, 3, 32, 32)
    boxes = torch.tensor([[[4.0, 2.0, 20.0, 26.0]], [[0.0, 0.0, 32.0, 32.0]]])
    crops = crop_boxes(images, boxes, size=8)
    for i, (x1, y1, x2, y2) in enumerate(boxes[:, 0].long().tolist()):
        direct = F.interpolate(
            images[i : i + 1, :, y1:y2, x1:x2], size=(8, 8), mode="bilinear", align_corners=False
        )
        torch.testing.assert_close(crops[i : i + 1], direct, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "name,kwargs,grid",
    [
        # synthetic_lt is a 32 px dataset: the small-image stem by default (solo-learn's
        # 3x3 conv with padding 2 makes the input 34 px, so the map is 5x5)
        ("resnet18", {}, 5),
        ("resnet18", {"small_image_stem": False}, 1),
        ("cifar_resnet32", {}, 8),
        ("vit_tiny", {"img_size": 32, "patch_size": 8, "dynamic_img_size": True}, 4),
    ],
)
def test_feature_map_and_pooled_features(name, kwargs, grid):
    backbone = build_backbone(name, "pbsd", "synthetic_lt", kwargs).eval()
    x = torch.randn(2, 3, 32, 32)
    fmap, pooled = feature_map(backbone, x)
    assert fmap.shape[-2:] == (grid, grid) and fmap.shape[:2] == pooled.shape
    torch.testing.assert_close(pooled, backbone(x), rtol=1e-4, atol=1e-5)


def test_pbsd_weight_zero_trains_like_dscl(make_cfg):
    # two steps: the queue is empty at the first, so PBSD only has a set to compare at the second
    common = {"checkpoint.enabled": False, "limit_train_batches": 2, "limit_val_batches": 0}
    dscl = run(make_cfg("dscl", **common))["metrics"]
    # patches cut on the device: the loader gives both runs the same crops (PBSD's own views
    # draw their random numbers in another order)
    kwargs = {"method_kwargs.pbsd_weight": 0.0, "method_kwargs.patch_source": "device"}
    pbsd = run(make_cfg("pbsd", **common, **kwargs))["metrics"]
    assert pbsd["train_dscl_loss"] == pytest.approx(dscl["train_dscl_loss"], rel=1e-5)
    assert pbsd["train_distillation_loss"] > 0  # computed (and logged) even at weight 0
    # PBSD's own loss: DSCL's plus 0 x the distillation
    assert pbsd["train_pbsd_loss"] == pytest.approx(dscl["train_dscl_loss"], rel=1e-5)


def pbsd_batch(boxes: list[float] | None = None) -> list:
    """8 images' two crops and labels; with ``boxes``, the loader's 5 patches of 9 px there."""
    gen = torch.Generator().manual_seed(0)
    crops = [torch.randn(8, 3, 32, 32, generator=gen) for _ in range(2)]
    if boxes is not None:
        crops += [torch.randn(8, 5, 3, 9, 9, generator=gen), torch.tensor([boxes]).repeat(8, 5, 1)]
    return [torch.arange(8), crops, torch.randint(0, 4, (8,), generator=gen)]


def test_loader_without_patches_falls_back_to_the_device_once(make_cfg, monkeypatch):
    """A loader that cannot make PBSD's views (solo-learn's DALI) gives two crops: the patches
    are then cut and augmented on the device, and the run says so once."""
    cfg = parse_cfg(make_cfg("pbsd"))
    assert cfg.method_kwargs.patch_source == "loader"
    model = METHODS["pbsd"](cfg)
    batch = pbsd_batch()
    # (Lightning's logger does not propagate to the root when it was imported before any
    # handler existed, so the message is caught where it is sent, not through caplog)
    told: list[str] = []
    monkeypatch.setattr(pbsd_module, "rank_zero_info", told.append)
    for _ in range(2):
        loss = model.training_step(batch, 0)
        model.write_queues()
    assert torch.isfinite(loss)
    assert len(told) == 1 and told[0].startswith("pbsd: the loader gave no patches")


def test_loader_views_reach_the_student_and_the_teacher(make_cfg, monkeypatch):
    """Patches and boxes from the loader are taken aside before the crop count is checked; the
    teacher pools at the loader's boxes, and the student sees the patches as one batch of B per
    patch index, in index order (BatchNorm statistics per index, as published)."""
    model = METHODS["pbsd"](parse_cfg(make_cfg("pbsd")))
    batch = pbsd_batch([0.0, 0.0, 16.0, 16.0])
    patches, boxes = batch[1][2:]
    pooled_at, student_batches = [], []

    def pool(fmap, at, size):
        pooled_at.append(at)
        return roi_pool(fmap, at, size)

    monkeypatch.setattr(pbsd_module, "roi_pool", pool)
    model.backbone.register_forward_pre_hook(lambda m, args: student_batches.append(args[0]))
    model.training_step(batch, 0)
    assert len(pooled_at) == 1 and torch.equal(pooled_at[0], boxes)
    small = [x for x in student_batches if x.shape[-1] == 9]
    # one student call of the 8 images' patches per patch index, in index order
    assert len(small) == 5
    assert all(torch.equal(x, patches[:, i]) for i, x in enumerate(small))


def test_patch_running_stats_false_keeps_the_full_views_statistics(make_cfg, monkeypatch):
    """``patch_running_stats: false``: the same loss and gradients as the published step, and
    BatchNorm running statistics that are those of the full views alone (a fresh copy of the
    networks fed only the full-size inputs the step gave them, in the same order)."""
    cfg = parse_cfg(make_cfg("pbsd"))
    published = METHODS["pbsd"](cfg)
    cfg_kept = copy.deepcopy(cfg)
    cfg_kept.method_kwargs.patch_running_stats = False
    kept = METHODS["pbsd"](cfg_kept)
    kept.load_state_dict(published.state_dict())
    fresh = copy.deepcopy(kept)
    batch = pbsd_batch([2.0, 1.0, 20.0, 17.0])
    # what the full views gave the online backbone and projector: their inputs before the
    # distillation term starts (its first act is to pool the teacher)
    seen: dict[str, list[torch.Tensor]] = {"backbone": [], "projector": []}
    in_term = [False]

    def pool(*args):
        in_term[0] = True
        return roi_pool(*args)

    monkeypatch.setattr(pbsd_module, "roi_pool", pool)
    for name in seen:
        getattr(kept, name).register_forward_pre_hook(
            lambda m, args, name=name: None if in_term[0] else seen[name].append(args[0].detach())
        )
    losses, grads = [], []
    for model in (published, kept):
        in_term[0] = False
        torch.manual_seed(1)
        loss = model.training_step(batch, 0)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.backbone.parameters()])
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert all(x.shape[-1] == 32 for x in seen["backbone"]) and len(seen["backbone"]) >= 2
    fresh.train()
    with torch.no_grad():
        for name in seen:
            for x in seen[name]:
                getattr(fresh, name)(x)
    for name in seen:
        norms = [
            (m, n)
            for m, n in zip(getattr(kept, name).modules(), getattr(fresh, name).modules())
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        ]
        assert norms or name == "projector"  # (DSCL's projector has no BatchNorm)
        for m, n in norms:
            torch.testing.assert_close(m.running_mean, n.running_mean, rtol=0, atol=0)
            torch.testing.assert_close(m.running_var, n.running_var, rtol=0, atol=0)
    # the published step's patches moved them (so the check above can fail)
    first = next(m for m in published.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d))
    kept_first = next(m for m in kept.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert not torch.equal(first.running_mean, kept_first.running_mean)
