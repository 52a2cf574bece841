"""The weight gradient of convolutions on CPU: one matrix product per kernel tap over small
feature maps, Winograd's F(3x3, 2x2) for 3x3 stride-1 convolutions over larger ones.

oneDNN computes a convolution's weight gradient at about half its forward rate on small maps,
and far less on the smallest: on 2 AMD EPYC cores, for a 3x3 convolution of 512 channels, 99
GFLOP/s at 4x4 (ResNet-18's last stage at 32 px) and 41 GFLOP/s at 2x2 (PBSD's 9 px patches),
against 160-240 GFLOP/s forward. Written per tap, the gradient of tap (i, j) is one product of
the output gradient's rows and the input's rows that the tap joins, only where the tap falls
inside the input (a 3x3 kernel over a 2x2 map: 16 of its 36 products): in an eighth of oneDNN's
time at 2x2 and in 1/2.2 of it at 4x4, equal to float32 rounding. On larger maps oneDNN's weight
gradient stays at 110-140 GFLOP/s (0.6-0.75x its forward rate; the input gradient runs at the
forward's), so a training step's backward runs slower than its FLOPs say; the Winograd form
(:func:`weight_grad_winograd`) does 2.25x fewer multiplications, in 1/1.2 of oneDNN's time for 64
channels at 32x32, 1/1.5 for 128 at 16x16 and 1/1.7 for 256 at 8x8 (same cores, batch 64).

:func:`small_map_weight_grad` is a ``TorchFunctionMode`` under which ``conv2d`` takes those
weight gradients where :func:`winograd_wins` or :func:`taps_win` say they are faster (measured on
those cores); the input gradient, the output and everything else stay torch's, and the backward
is differentiable again (a gradient penalty's double backward; the Winograd cases then take
torch's weight gradient). Forward-mode AD and ``torch.func`` transforms are not defined for it.
solo-ext's methods train under it on CPU (their ``training_step``); solo-learn's own methods
never do. ``SOLO_EXT_SMALL_MAP_CONV=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

ENV = "SOLO_EXT_SMALL_MAP_CONV"
SMALL_MAP = 16  # output positions at most: always per tap
MEDIUM_MAP = 64  # up to this many: per tap where in x out channels reach WIDE_CHANNELS
WIDE_CHANNELS = 256 * 256
# 3x3, stride 1, above SMALL_MAP: Winograd where in x out channels reach WINOGRAD_CHANNELS, or
# WINOGRAD_NARROW on maps of at least WINOGRAD_LARGE_MAP positions (winograd_wins)
WINOGRAD_CHANNELS = 128 * 128
WINOGRAD_NARROW, WINOGRAD_LARGE_MAP = 64 * 64, 1024
WINOGRAD_MIN_TILES = 2048  # output positions over the whole batch
WINOGRAD_WASTE = 1.25  # tiled positions (odd sides rounded up) over positions, at most
WINOGRAD_CHUNK_BYTES = 64 << 20  # the transformed tiles of one chunk of images


def _pair(value: int | Sequence[int]) -> tuple[int, int] | None:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        if all(isinstance(v, int) for v in value):
            return int(value[0]), int(value[1])
    return None  # "same" / "valid": left to torch


def _span(tap: int, size_in: int, size_out: int, stride: int, pad: int) -> tuple[int, int]:
    """The output indices [lo, hi) at which kernel offset ``tap`` reads inside the input."""
    lo = max(0, -((tap - pad) // stride))
    hi = min(size_out, (size_in - 1 - tap + pad) // stride + 1)
    return lo, hi


def taps_win(in_channels: int, out_channels: int, out_height: int, out_width: int) -> bool:
    """Whether the per-tap weight gradient is used for this convolution (unless
    :func:`winograd_wins`)."""
    positions = out_height * out_width
    return positions <= SMALL_MAP or (
        positions <= MEDIUM_MAP and in_channels * out_channels >= WIDE_CHANNELS
    )


def winograd_wins(
    in_channels: int,
    out_channels: int,
    out_height: int,
    out_width: int,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    images: int,
) -> bool:
    """Whether the weight gradient of this convolution is taken by
    :func:`weight_grad_winograd`: a 3x3 stride-1 kernel above SMALL_MAP positions, at least
    WINOGRAD_MIN_TILES output positions over the batch, WINOGRAD_CHANNELS in x out channels (or
    WINOGRAD_NARROW on maps of WINOGRAD_LARGE_MAP positions), and at most WINOGRAD_WASTE more
    tiled positions than positions (an odd side's tiles take a zero row or column: 5x5 and 7x7
    maps are left to the taps or to torch)."""
    if kernel != (3, 3) or stride != (1, 1):
        return False
    positions, channels = out_height * out_width, in_channels * out_channels
    if positions <= SMALL_MAP or images * positions < WINOGRAD_MIN_TILES:
        return False
    tiled = (out_height + out_height % 2) * (out_width + out_width % 2)
    if tiled > WINOGRAD_WASTE * positions:
        return False
    return channels >= WINOGRAD_CHANNELS or (
        channels >= WINOGRAD_NARROW and positions >= WINOGRAD_LARGE_MAP
    )


def weight_grad_by_taps(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    channels_last: bool = False,
) -> torch.Tensor:
    """d loss / d weight [C_out, C_in, kh, kw] of a dense (groups 1, dilation 1) 2-D
    convolution of ``x`` [B, C_in, H, W] whose output gradient is ``grad_out``
    [B, C_out, H_out, W_out]; in the channels-last layout with ``channels_last`` (the layout of
    a channels-last weight), else contiguous. Differentiable (differentiable operators only)."""
    _, c_in, height, width = x.shape
    c_out, h_out, w_out = grad_out.shape[1:]
    g = grad_out.permute(0, 2, 3, 1)  # [B, H_out, W_out, C_out]
    xl = x.permute(0, 2, 3, 1)
    taps = []
    for kh in range(kernel[0]):
        i0, i1 = _span(kh, height, h_out, stride[0], padding[0])
        for kw in range(kernel[1]):
            j0, j1 = _span(kw, width, w_out, stride[1], padding[1])
            if i0 >= i1 or j0 >= j1:  # the tap only ever reads padding
                taps.append(x.new_zeros(c_out, c_in))
                continue
            r0 = i0 * stride[0] + kh - padding[0]
            c0 = j0 * stride[1] + kw - padding[1]
            rows = xl[
                :,
                r0 : r0 + (i1 - i0 - 1) * stride[0] + 1 : stride[0],
                c0 : c0 + (j1 - j0 - 1) * stride[1] + 1 : stride[1],
            ]
            outs = g[:, i0:i1, j0:j1].reshape(-1, c_out)
            taps.append(outs.t() @ rows.reshape(-1, c_in))
    if channels_last:  # [C_out, kh * kw, C_in] in memory
        grad = torch.stack(taps, dim=1).view(c_out, *kernel, c_in)
        return grad.permute(0, 3, 1, 2)
    return torch.stack(taps, dim=2).view(c_out, c_in, *kernel)


# Winograd F(3, 2) for the correlation y_k = sum_p g_p d_(k+p) (k < 3, p < 2, d of 4), from
# evaluation at 0, 1, -1 and infinity: y = A^T [(G g) * (B^T d)], here with the halves of B^T's
# middle rows taken out (integer transforms) and put back on the 4 x 4 products (_WINOGRAD_SCALE)
_WINOGRAD_A_T = ((1.0, 1.0, 1.0, 0.0), (0.0, 1.0, -1.0, 0.0), (0.0, 1.0, 1.0, 1.0))
_WINOGRAD_SCALE = (1.0, 0.5, 0.5, 1.0)


def _input_transform(dst: torch.Tensor, d0, d1, d2, d3) -> None:
    """dst[0..3] = 2 B^T [d0 d1 d2 d3] (the rows of B^T with the halves taken out)."""
    torch.sub(d0, d2, out=dst[0])
    torch.add(d1, d2, out=dst[1])
    torch.sub(d2, d1, out=dst[2])
    torch.sub(d3, d1, out=dst[3])


def _grad_transform(dst: torch.Tensor, g0, g1) -> None:
    """dst[0..3] = G [g0 g1]."""
    dst[0].copy_(g0)
    torch.add(g0, g1, out=dst[1])
    torch.sub(g0, g1, out=dst[2])
    dst[3].copy_(g1)


def weight_grad_winograd(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    padding: tuple[int, int],
    channels_last: bool = False,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """d loss / d weight [C_out, C_in, 3, 3] of a 3x3, stride-1, dilation-1, groups-1
    convolution of ``x`` [B, C_in, H, W] whose output gradient is ``grad_out``, by Winograd's
    F(3x3, 2x2): the weight gradient is the correlation of the padded input with the output
    gradient, taken over 2x2 tiles of the output gradient (4x4 input tiles at stride 2); after
    the transforms, 16 products of [C_out, tiles] x [tiles, C_in] (one batched matmul) instead
    of 9 over every position, 2.25x fewer multiplications. The images go in chunks whose
    transformed tiles take about ``chunk_bytes`` (:data:`WINOGRAD_CHUNK_BYTES`), in buffers
    reused from chunk to chunk, so the transforms stay in cache. Not differentiable (writes
    into its buffers); the layout of the result as :func:`weight_grad_by_taps`."""
    batch, c_in = x.shape[:2]
    c_out, h_out, w_out = grad_out.shape[1:]
    h_even, w_even = h_out + h_out % 2, w_out + w_out % 2  # odd sizes: one zero row / column
    th, tw = h_even // 2, w_even // 2
    g = grad_out.permute(0, 2, 3, 1)  # [B, H_out, W_out, C_out]
    if (h_even, w_even) != (h_out, w_out):
        g = F.pad(g, (0, 0, 0, w_even - w_out, 0, h_even - h_out))
    # the padded input, H_out + 2 rows and W_out + 2 columns read (and the odd sizes' extra one)
    rows, cols = h_even + 2, w_even + 2
    right, bottom = cols - x.shape[3] - padding[1], rows - x.shape[2] - padding[0]
    xp = F.pad(x.permute(0, 2, 3, 1), (0, 0, padding[1], right, padding[0], bottom))
    per_image = max(1, 16 * th * tw * (c_in + c_out) * x.element_size())
    n = max(1, min(batch, (chunk_bytes or WINOGRAD_CHUNK_BYTES) // per_image))
    half_x = x.new_empty(4, n, rows, tw, c_in)  # along the width first, then the height
    v = x.new_empty(4, 4, n, th, tw, c_in)
    half_g = grad_out.new_empty(4, n, h_even, tw, c_out)
    u = grad_out.new_empty(4, 4, n, th, tw, c_out)
    m = x.new_zeros(16, c_out, c_in)
    for lo in range(0, batch, n):
        k_images = min(n, batch - lo)
        xs, gs = xp[lo : lo + k_images], g[lo : lo + k_images]
        hx, vs = half_x[:, :k_images], v[:, :, :k_images]
        hg, us = half_g[:, :k_images], u[:, :, :k_images]
        _input_transform(hx, *(xs[:, :, k : k + w_even - 1 : 2] for k in range(4)))
        for k in range(4):
            _input_transform(vs[:, k], *(hx[k][:, i : i + h_even - 1 : 2] for i in range(4)))
        _grad_transform(hg, gs[:, :, 0::2], gs[:, :, 1::2])
        for k in range(4):
            _grad_transform(us[:, k], hg[k][:, 0::2], hg[k][:, 1::2])
        us, vs = us.reshape(16, -1, c_out), vs.reshape(16, -1, c_in)  # views while whole
        torch.baddbmm(m, us.transpose(1, 2), vs, out=m)
    scale = x.new_tensor(_WINOGRAD_SCALE)
    m = m.view(4, 4, c_out, c_in) * (scale[:, None] * scale[None, :])[:, :, None, None]
    a_t = x.new_tensor(_WINOGRAD_A_T)
    if channels_last:
        return torch.einsum("ux,xyoi,vy->ouvi", a_t, m, a_t).contiguous().permute(0, 3, 1, 2)
    return torch.einsum("ux,xyoi,vy->oiuv", a_t, m, a_t).contiguous()


class _SmallMapConv2d(torch.autograd.Function):
    """``conv2d`` whose backward takes the input gradient from torch and the weight gradient
    per tap (:func:`weight_grad_by_taps`) or, with ``winograd``, by
    :func:`weight_grad_winograd` (torch's own under a double backward)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, winograd=False):
        ctx.save_for_backward(x, weight)
        ctx.stride, ctx.padding, ctx.has_bias = stride, padding, bias is not None
        ctx.winograd = winograd
        return F.conv2d(x, weight, bias, stride, padding)

    @staticmethod
    def backward(ctx, grad_out):
        # differentiable operators only, so that a double backward (create_graph) works; a
        # plain backward runs them without recording
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _torch_grad(ctx, grad_out, x, weight, 0)
        if ctx.needs_input_grad[1]:
            kernel = tuple(weight.shape[2:])
            last = _channels_last(weight)
            if not ctx.winograd:
                grad_w = weight_grad_by_taps(grad_out, x, kernel, ctx.stride, ctx.padding, last)
            elif torch.is_grad_enabled():  # create_graph: torch's (differentiable) gradient
                grad_w = _torch_grad(ctx, grad_out, x, weight, 1)
            else:
                grad_w = weight_grad_winograd(grad_out, x, ctx.padding, last)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_out.sum((0, 2, 3))
        return grad_x, grad_w, grad_b, None, None, None


def _torch_grad(ctx, grad_out, x, weight, which: int) -> torch.Tensor:
    """torch's gradient of the input (``which`` 0) or of the weight (1)."""
    mask = [which == 0, which == 1, False]
    return torch.ops.aten.convolution_backward(
        grad_out,
        x,
        weight,
        None,
        list(ctx.stride),
        list(ctx.padding),
        [1, 1],
        False,
        [0, 0],
        1,
        mask,
    )[which]


def _channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _cpu_autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch before 2.4: no device argument
        return torch.is_autocast_cpu_enabled()


def _per_tap(args: tuple, kwargs: dict) -> tuple | None:
    """The call's (x, weight, bias, stride, padding, winograd) when its weight gradient goes per
    tap (``winograd`` False) or by Winograd (True)."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    given = dict(zip(names, args))
    given.update(kwargs)
    x, weight = given.get("input"), given.get("weight")
    bias = given.get("bias")
    if not (
        isinstance(x, torch.Tensor)
        and isinstance(weight, torch.Tensor)
        and weight.requires_grad
        and torch.is_grad_enabled()
        and x.dim() == 4
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and weight.dtype == x.dtype
        and given.get("groups", 1) == 1
        and not _cpu_autocast()
    ):
        return None
    stride, padding = _pair(given.get("stride", 1)), _pair(given.get("padding", 0))
    if stride is None or padding is None or _pair(given.get("dilation", 1)) != (1, 1):
        return None
    kh, kw = weight.shape[2:]
    h_out = (x.shape[2] + 2 * padding[0] - kh) // stride[0] + 1
    w_out = (x.shape[3] + 2 * padding[1] - kw) // stride[1] + 1
    if h_out < 1 or w_out < 1:
        return None
    channels = x.shape[1], weight.shape[0]
    if winograd_wins(*channels, h_out, w_out, (kh, kw), stride, x.shape[0]):
        return x, weight, bias, stride, padding, True
    if not taps_win(*channels, h_out, w_out):
        return None
    return x, weight, bias, stride, padding, False


class _SmallMapMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.conv2d:
            call = _per_tap(args, kwargs)
            if call is not None:
                return _SmallMapConv2d.apply(*call)
        return func(*args, **kwargs)


# the profiler's name of the per-tap backward, and the kind of operator whose work it does
PROFILED_AS = {"_SmallMapConv2dBackward": "aten::convolution_backward"}

_suspended = 0


def enabled() -> bool:
    """False under ``SOLO_EXT_SMALL_MAP_CONV=0`` or :func:`suspended`."""
    return not _suspended and os.environ.get(ENV, "1") != "0"


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """The steps started inside run torch's convolutions only (the bench counts a step's FLOPs
    so: a convolution's, padding included, as ``torch.utils.flop_counter`` counts them)."""
    global _suspended
    _suspended += 1
    try:
        yield
    finally:
        _suspended -= 1


def active() -> bool:
    """Whether a :func:`small_map_weight_grad` is in force here."""
    stack = torch.overrides._get_current_function_mode_stack()
    return any(isinstance(mode, _SmallMapMode) for mode in stack)


@contextlib.contextmanager
def small_map_weight_grad() -> Iterator[None]:
    """The convolutions called inside take their weight gradient by Winograd where
    :func:`winograd_wins`, else per tap where :func:`taps_win` (float32 / float64 on CPU, no
    autocast, groups and dilation 1)."""
    if not enabled() or active():
        yield
        return
    with _SmallMapMode():
        yield
