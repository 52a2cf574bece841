"""The per-tap and Winograd weight gradients of convolutions on CPU: equal to the definition and
to torch's convolution backward; taken only where their rules say, never for solo-learn's own
methods, and off with ``SOLO_EXT_SMALL_MAP_CONV=0``."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

import solo_ext.modules.small_map_conv as small_map
from solo_ext.commands.pretrain import parse_cfg, run
from solo_ext.modules.small_map_conv import (
    small_map_weight_grad,
    taps_win,
    weight_grad_by_taps,
    weight_grad_winograd,
    winograd_wins,
)


def _weight_grad_by_definition(grad_out, x, kernel, stride, padding):
    """dL/dw[o, i, a, b] = sum over images and output positions (y, z) of
    grad_out[n, o, y, z] * x_padded[n, i, y * stride + a, z * stride + b]: loops, float64."""
    n, c_in, _, _ = x.shape
    c_out, h_out, w_out = grad_out.shape[1:]
    xp = F.pad(x, (padding[1], padding[1], padding[0], padding[0]))
    grad = torch.zeros(c_out, c_in, *kernel, dtype=torch.float64)
    for a, b, y, z in itertools.product(
        range(kernel[0]), range(kernel[1]), range(h_out), range(w_out)
    ):
        pixel = xp[:, :, y * stride[0] + a, z * stride[1] + b]  # [N, C_in]
        grad[:, :, a, b] += grad_out[:, :, y, z].t() @ pixel
    return grad


@pytest.mark.parametrize(
    "size, kernel, stride, padding",
    [
        ((2, 2), (3, 3), (1, 1), (1, 1)),  # PBSD's patches at ResNet-18's last stage
        ((4, 5), (3, 3), (1, 1), (1, 1)),
        ((5, 5), (3, 3), (2, 2), (1, 1)),  # a stage's first, strided convolution
        ((3, 3), (1, 1), (2, 2), (0, 0)),  # its 1x1 shortcut
        ((3, 4), (5, 3), (1, 2), (2, 1)),
        ((1, 1), (3, 3), (1, 1), (1, 1)),  # only the centre tap reads the input
        ((3, 3), (3, 3), (3, 3), (2, 2)),  # taps that only ever read padding
    ],
)
def test_weight_gradient_equals_its_definition(size, kernel, stride, padding):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, *size, dtype=torch.float64, generator=gen)
    h_out = (size[0] + 2 * padding[0] - kernel[0]) // stride[0] + 1
    w_out = (size[1] + 2 * padding[1] - kernel[1]) // stride[1] + 1
    grad_out = torch.randn(3, 5, h_out, w_out, dtype=torch.float64, generator=gen)
    expected = _weight_grad_by_definition(grad_out, x, kernel, stride, padding)
    for fmt in (torch.contiguous_format, torch.channels_last):
        got = weight_grad_by_taps(
            grad_out.contiguous(memory_format=fmt),
            x.contiguous(memory_format=fmt),
            kernel,
            stride,
            padding,
        )
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "size, padding",
    [
        ((16, 16), 1),  # ResNet-18's 16 px stage at 32 px crops (float64 here, few channels)
        ((4, 5), 1),  # an odd output width: one zero column of the output gradient
        ((7, 3), 1),
        ((5, 5), 0),  # no padding: 3x3 outputs
        ((6, 4), 2),  # more padding than the kernel's half: a larger output than the input
        ((1, 1), 1),  # one output position, only the centre tap reads the input
        ((3, 9), 0),  # 1 x 7 outputs
    ],
)
def test_winograd_weight_gradient_equals_its_definition(size, padding):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, *size, dtype=torch.float64, generator=gen)
    h_out, w_out = size[0] + 2 * padding - 2, size[1] + 2 * padding - 2
    grad_out = torch.randn(3, 5, h_out, w_out, dtype=torch.float64, generator=gen)
    expected = _weight_grad_by_definition(grad_out, x, (3, 3), (1, 1), (padding, padding))
    # all 3 images in one chunk; one by one; 2 then the last 1 (the buffers' shorter views)
    tiles_per_image = ((h_out + 1) // 2) * ((w_out + 1) // 2)
    two_images = 2 * 16 * tiles_per_image * (4 + 5) * 8
    for fmt, chunk in itertools.product(
        (torch.contiguous_format, torch.channels_last), (None, 1, two_images)
    ):
        got = weight_grad_winograd(
            grad_out.contiguous(memory_format=fmt),
            x.contiguous(memory_format=fmt),
            (padding, padding),
            fmt == torch.channels_last,
            chunk,
        )
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        assert got.is_contiguous(memory_format=fmt)


def _conv_and_grads(x, w, b, needs_x, mode: bool, call, loss: str = "weighted"):
    """The output and the gradients as the backward gives them (``torch.autograd.grad``: not
    re-laid out into the leaves' layouts, as accumulating into ``.grad`` would); the output
    gradient in the output's layout, or an expanded one for ``loss="sum"``."""
    x = x.detach().clone().requires_grad_(needs_x)
    w = w.detach().clone().requires_grad_(True)
    b = None if b is None else b.detach().clone().requires_grad_(True)
    with small_map_weight_grad() if mode else torch.enable_grad():
        y = call(x, w, b)
    if loss == "sum":
        total = y.sum()
    else:
        weights = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)
        last = y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
        total = (y * weights.contiguous(memory_format=_format(last))).sum()
    leaves = [t for t in (x, w, b) if t is not None and t.requires_grad]
    grads = dict(zip(map(id, leaves), torch.autograd.grad(total, leaves)))
    return y, grads.get(id(x)), grads[id(w)], None if b is None else grads[id(b)]


def _format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(
    "size, kernel, stride, padding, bias, needs_x, keywords",
    [
        ((2, 2), 3, 1, 1, False, True, False),
        ((4, 4), 3, 1, 1, True, True, True),  # conv2d(input=..., padding=[1, 1])
        ((5, 5), 3, 2, 1, False, True, False),
        ((3, 3), 1, 2, 0, True, False, True),  # the first layer: no input gradient
        ((3, 3), 5, 1, 2, True, True, False),
        ((2, 7), 3, 1, 1, True, True, True),  # 14 output positions, not square
        ((1, 16), 3, 1, 1, False, True, False),
    ],
)
def test_under_the_mode_conv2d_gives_torchs_output_and_gradients(
    size, kernel, stride, padding, bias, needs_x, keywords, channels_last, dtype
):
    gen = torch.Generator().manual_seed(1)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(6, 8, *size, generator=gen, dtype=dtype).contiguous(memory_format=fmt)
    w = torch.randn(7, 8, kernel, kernel, generator=gen, dtype=dtype)
    w = w.contiguous(memory_format=fmt)
    b = torch.randn(7, generator=gen, dtype=dtype) if bias else None

    def call(x, w, b):
        if keywords:
            return F.conv2d(input=x, weight=w, bias=b, stride=[stride] * 2, padding=[padding] * 2)
        return F.conv2d(x, w, b, stride, padding)

    y, gx, gw, gb = _conv_and_grads(x, w, b, needs_x, True, call)
    assert y.grad_fn.name() == "_SmallMapConv2dBackward"  # solo-ext's backward was taken
    ry, rgx, rgw, rgb = _conv_and_grads(x, w, b, needs_x, False, call)
    assert ry.grad_fn.name() != "_SmallMapConv2dBackward"
    torch.testing.assert_close(y, ry, rtol=0, atol=0)  # the forward is torch's own
    if needs_x:
        torch.testing.assert_close(gx, rgx, rtol=0, atol=0)  # so is the input gradient
    else:
        assert gx is None
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(gw, rgw, rtol=tol, atol=tol)
    assert gw.dtype == dtype and gw.is_contiguous(memory_format=fmt)
    if bias:
        torch.testing.assert_close(gb, rgb, rtol=tol, atol=tol)


@pytest.mark.parametrize("padding_mode", ["reflect", "circular", "zeros"])
def test_conv2d_modules_with_every_padding_mode(padding_mode):
    """``nn.Conv2d`` pads by itself first for the other modes, then calls conv2d unpadded."""
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(6, 5, 3, padding=1, padding_mode=padding_mode).double()
    x = torch.randn(4, 6, 3, 4, dtype=torch.float64, requires_grad=True)
    ref = copy.deepcopy(conv)
    with small_map_weight_grad():
        y = conv(x)
    assert y.grad_fn.name() == "_SmallMapConv2dBackward"
    y.pow(2).sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    ref(x_ref).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-12, atol=1e-12)
    for p, q in zip(conv.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)


def _winograd_everywhere(monkeypatch, **floors) -> list:
    """Lowers the Winograd rule's floors (``WINOGRAD_CHANNELS`` and ``WINOGRAD_MIN_TILES`` to 1,
    and any others given) for this test's small tensors; the returned list gets, for every
    Winograd weight gradient taken, (the input's shape, whether grad mode was on)."""
    for name, value in {"WINOGRAD_CHANNELS": 1, "WINOGRAD_MIN_TILES": 1, **floors}.items():
        monkeypatch.setattr(small_map, name, value)
    taken = []
    by_winograd = small_map.weight_grad_winograd

    def spied(*args):
        taken.append((args[1].shape, torch.is_grad_enabled()))
        return by_winograd(*args)

    monkeypatch.setattr(small_map, "weight_grad_winograd", spied)
    return taken


@pytest.mark.parametrize("winograd", [False, True])
def test_a_double_backward_equals_torchs(winograd, monkeypatch):
    """Gradient penalties (``create_graph``): on the input gradient, and on the weight gradient,
    whose per-tap products are differentiated in turn; a Winograd case (which writes into its
    buffers) then takes torch's own weight gradient."""
    taken = _winograd_everywhere(monkeypatch) if winograd else []
    gen = torch.Generator().manual_seed(4)
    x0 = torch.randn(3, 5, *((6, 6) if winograd else (4, 3)), dtype=torch.float64, generator=gen)
    w0 = torch.randn(6, 5, 3, 3, dtype=torch.float64, generator=gen)

    def penalties(mode: bool):
        x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
        with small_map_weight_grad() if mode else torch.enable_grad():
            y = F.conv2d(x, w, padding=1).tanh()
        assert (y.grad_fn.next_functions[0][0].name() == "_SmallMapConv2dBackward") == mode
        gx, gw = torch.autograd.grad(y.pow(2).sum(), (x, w), create_graph=True)
        (gx.pow(2).sum() + gw.pow(2).sum()).backward()
        return gw.detach(), x.grad, w.grad

    for got, expected in zip(penalties(True), penalties(False)):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    # the plain backward of the penalty (through y again) only; never under create_graph
    assert [grad_mode for _, grad_mode in taken] == ([False] if winograd else [])
    assert small_map._per_tap((x0, w0.requires_grad_()), {"padding": 1})[-1] is winograd


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "layouts", [(False, False), (True, True), (False, True), (True, False)]
)  # (x channels-last, weight channels-last)
@pytest.mark.parametrize(
    "size, padding, bias, needs_x",
    [((6, 6), 1, False, True), ((5, 7), 1, True, True), ((9, 9), 0, True, False)],
)
@pytest.mark.parametrize("loss", ["weighted", "sum"])  # "sum": an expanded output gradient
def test_under_the_mode_winograd_gives_torchs_output_and_gradients(
    size, padding, bias, needs_x, layouts, dtype, loss, monkeypatch
):
    """Few channels here, so the rule's channel floor is lowered; the decision is spied."""
    taken = _winograd_everywhere(monkeypatch, WINOGRAD_WASTE=2)
    gen = torch.Generator().manual_seed(6)
    x_fmt, w_fmt = (_format(last) for last in layouts)
    x = torch.randn(5, 6, *size, generator=gen, dtype=dtype).contiguous(memory_format=x_fmt)
    w = torch.randn(7, 6, 3, 3, generator=gen, dtype=dtype).contiguous(memory_format=w_fmt)
    b = torch.randn(7, generator=gen, dtype=dtype) if bias else None

    def call(x, w, b):
        return F.conv2d(x, w, b, 1, padding)

    y, gx, gw, gb = _conv_and_grads(x, w, b, needs_x, True, call, loss)
    assert y.grad_fn.name() == "_SmallMapConv2dBackward" and taken == [(x.shape, False)]
    ry, rgx, rgw, rgb = _conv_and_grads(x, w, b, needs_x, False, call, loss)
    torch.testing.assert_close(y, ry, rtol=0, atol=0)
    if needs_x:
        torch.testing.assert_close(gx, rgx, rtol=0, atol=0)
    else:
        assert gx is None
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(gw, rgw, rtol=tol, atol=tol)
    assert gw.dtype == dtype and gw.is_contiguous(memory_format=w_fmt)  # the weight's layout
    if bias:
        torch.testing.assert_close(gb, rgb, rtol=tol, atol=tol)


def test_the_winograd_rule():
    # 3x3 stride 1 above 16 positions, with 128 x 128 channels, or 64 x 64 from 32x32 up, and
    # 2048 positions over the batch; not where rounding odd sides up adds over a quarter
    def wins(c_in, c_out, size, images=64, kernel=(3, 3), stride=(1, 1)):
        return winograd_wins(c_in, c_out, *size, kernel, stride, images)

    assert wins(128, 128, (16, 16)) and wins(64, 64, (32, 32)) and wins(64, 64, (56, 56), 16)
    assert wins(256, 256, (8, 8)) and wins(512, 512, (6, 6))  # even maps before the taps
    assert wins(128, 128, (9, 9), 320) and wins(128, 128, (15, 16))  # 100 / 81, 256 / 240
    assert not wins(128, 128, (5, 5), 320) and not wins(512, 512, (7, 7), 16)  # 36 / 25, 64 / 49
    assert not wins(128, 128, (16, 16), 7)  # 1792 positions over the batch
    assert not wins(64, 64, (16, 16)) and not wins(64, 64, (9, 9), 320)
    assert not wins(512, 512, (4, 4), 128)  # the taps' small maps
    assert not wins(3, 64, (32, 32))  # a stem's three channels
    assert not wins(128, 128, (16, 16), stride=(2, 2))
    assert not wins(128, 128, (16, 16), kernel=(1, 1))


def test_the_rule():
    # small maps always; up to 8x8 where the channels are wide
    assert taps_win(3, 64, 4, 4) and taps_win(512, 512, 2, 2)
    assert taps_win(256, 256, 8, 8) and taps_win(512, 2048, 7, 7)
    assert not taps_win(128, 128, 8, 8) and not taps_win(64, 64, 5, 5)
    assert not taps_win(512, 512, 9, 9) and not taps_win(64, 64, 32, 32)


@pytest.mark.parametrize(
    "case",
    [
        "large map",
        "narrow 8x8",
        "groups",
        "dilation",
        "padding same",
        "frozen weight",
        "only the bias learns",
        "no grad",
        "bf16 autocast",
        "bf16 tensors",
    ],
)
def test_other_convolutions_are_left_to_torch(case, monkeypatch):
    decided = []
    per_tap = small_map._per_tap
    monkeypatch.setattr(
        small_map, "_per_tap", lambda *a: decided.append(per_tap(*a)) or decided[-1]
    )
    gen = torch.Generator().manual_seed(2)
    shapes = {"large map": (32, 16), "narrow 8x8": (8, 64)}
    size, channels = shapes.get(case, (4, 16))
    x = torch.randn(2, channels, size, size, generator=gen, requires_grad=True)
    w = torch.randn(channels, channels // (2 if case == "groups" else 1), 3, 3, generator=gen)
    b = torch.randn(channels, generator=gen, requires_grad=True)
    w.requires_grad_(case not in ("frozen weight", "only the bias learns"))
    if case == "bf16 tensors":
        x, w, b = (t.detach().bfloat16().requires_grad_(True) for t in (x, w, b))
    conv = {"padding": 1}
    if case == "groups":
        conv["groups"] = 2
    if case == "dilation":
        conv.update(dilation=2, padding=2)
    if case == "padding same":
        conv["padding"] = "same"
    with small_map_weight_grad(), torch.set_grad_enabled(case != "no grad"):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "bf16 autocast"):
            y = F.conv2d(x, w, b if case == "only the bias learns" else None, **conv)
    assert decided == [None]  # seen, and left to torch
    assert y.grad_fn is None or y.grad_fn.name() != "_SmallMapConv2dBackward"
    # the same input and weight shapes otherwise take the taps: a 4x4 map, 16 channels, groups
    # and dilation 1, a weight that learns, float32, grad mode on
    w = torch.randn(16, 16, 3, 3, generator=gen, requires_grad=True)
    with small_map_weight_grad():
        y = F.conv2d(x[:, :16, :4, :4].detach().float(), w, padding=1)
    assert decided[-1] is not None and y.grad_fn.name() == "_SmallMapConv2dBackward"


def test_the_environment_variable_turns_it_off(monkeypatch):
    x = torch.randn(2, 4, 3, 3)
    w = torch.randn(4, 4, 3, 3, requires_grad=True)
    monkeypatch.setenv(small_map.ENV, "0")
    with small_map_weight_grad():
        assert not small_map.active()
        assert F.conv2d(x, w, padding=1).grad_fn.name() != "_SmallMapConv2dBackward"
    monkeypatch.setenv(small_map.ENV, "1")
    with small_map_weight_grad():
        assert small_map.active()
        with small_map_weight_grad():  # nested: one mode
            assert (
                sum(
                    isinstance(m, small_map._SmallMapMode)
                    for m in torch.overrides._get_current_function_mode_stack()
                )
                == 1
            )
    assert not small_map.active()


def test_a_step_enters_it_on_cpu_only():
    from solo_ext.methods.base import _small_map_step

    seen = []

    def step(self, batch, batch_idx):
        seen.append(small_map.active())
        return batch_idx

    wrapped = _small_map_step(step)
    assert wrapped.__wrapped__ is step and wrapped.small_map_step
    for device, expected in (("cpu", True), ("cuda", False), ("mps", False)):
        holder = type("Method", (), {"device": torch.device(device)})()
        assert wrapped(holder, None, 7) == 7
        assert seen[-1] is expected, device
    assert not small_map.active()


def test_solo_ext_methods_train_under_it_and_solo_learns_do_not(make_cfg):
    from solo_ext.host import METHODS

    parse_cfg(make_cfg("scl"))  # (registers the methods)
    ours = {n: c for n, c in METHODS.items() if c.__module__.startswith("solo_ext.methods")}
    assert len(ours) == 9
    for name, cls in METHODS.items():
        wrapped = getattr(cls.training_step, "small_map_step", False)
        assert wrapped == (name in ours), name


def test_a_training_step_through_lightning_takes_the_taps_and_equals_torchs(make_cfg, monkeypatch):
    """Through the Lightning door: PBSD's step (its 9 px patches' small maps) takes the per-tap
    weight gradient, and the trained weights equal those of the same run with it turned off."""
    calls = []
    by_taps = small_map.weight_grad_by_taps

    def counted(*args):
        calls.append(args[1].shape[-1])
        return by_taps(*args)

    monkeypatch.setattr(small_map, "weight_grad_by_taps", counted)
    common = {"checkpoint.enabled": False, "limit_train_batches": 2, "limit_val_batches": 0}
    on = run(make_cfg("pbsd", **common))
    assert calls and min(calls) <= 3  # the patches' last stages
    taken = len(calls)
    monkeypatch.setenv(small_map.ENV, "0")
    off = run(make_cfg("pbsd", **common))
    assert len(calls) == taken  # none with it off
    for key in ("train_pbsd_loss", "train_distillation_loss"):
        assert on["metrics"][key] == pytest.approx(off["metrics"][key], rel=1e-4), key
    weights_on, weights_off = on["model"].state_dict(), off["model"].state_dict()
    for name, value in weights_on.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, weights_off[name], rtol=1e-4, atol=1e-5, msg=name)
    # bf16-mixed on CPU: Lightning's autocast around the step, so torch's convolutions
    monkeypatch.setenv(small_map.ENV, "1")
    bf16 = run(make_cfg("pbsd", precision="bf16-mixed", **common))
    assert len(calls) == taken and bf16["metrics"]["train_pbsd_loss"] > 0


def test_a_training_step_through_lightning_takes_winograd_and_equals_torchs(make_cfg, monkeypatch):
    """Through the Lightning door, with the rule's channel floors lowered to the tiny backbone's
    widths: every 3x3 stride-1 convolution above 16 positions takes the Winograd weight
    gradient, and the trained weights equal those of the same run with the mode off."""
    taken = _winograd_everywhere(monkeypatch, WINOGRAD_NARROW=1)
    common = {"checkpoint.enabled": False, "limit_train_batches": 2, "limit_val_batches": 0}
    on = run(make_cfg("scl", **common))
    assert taken and all(shape[-1] * shape[-2] > small_map.SMALL_MAP for shape, _ in taken)
    count = len(taken)
    monkeypatch.setenv(small_map.ENV, "0")
    off = run(make_cfg("scl", **common))
    assert len(taken) == count
    key = next(k for k in on["metrics"] if k.startswith("train_") and k.endswith("_loss"))
    assert on["metrics"][key] == pytest.approx(off["metrics"][key], rel=1e-4), key
    weights_on, weights_off = on["model"].state_dict(), off["model"].state_dict()
    for name, value in weights_on.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, weights_off[name], rtol=1e-4, atol=1e-5, msg=name)
