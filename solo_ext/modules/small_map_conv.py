"""The weight gradient of convolutions over small feature maps on CPU, one matrix product per
kernel tap.

oneDNN computes a convolution's weight gradient at about half its forward rate on small maps,
and far less on the smallest: on 2 AMD EPYC cores, for a 3x3 convolution of 512 channels, 99
GFLOP/s at 4x4 (ResNet-18's last stage at 32 px) and 41 GFLOP/s at 2x2 (PBSD's 9 px patches),
against 160-240 GFLOP/s forward. Written per tap, the gradient of tap (i, j) is one product of
the output gradient's rows and the input's rows that the tap joins, only where the tap falls
inside the input (a 3x3 kernel over a 2x2 map: 16 of its 36 products): in an eighth of oneDNN's
time at 2x2 and in 1/2.2 of it at 4x4, equal to float32 rounding.

:func:`small_map_weight_grad` is a ``TorchFunctionMode`` under which ``conv2d`` takes that
weight gradient where :func:`taps_win` says it is faster (measured on those cores: outputs of at
most 16 positions, 4x4, and of at most 64, 8x8, with at least 256 x 256 channels); the input
gradient, the output and everything else stay torch's, and the backward is differentiable again
(a gradient penalty's double backward). Forward-mode AD and ``torch.func`` transforms are not
defined for it. solo-ext's methods train under it on CPU (their ``training_step``); solo-learn's
own methods never do. ``SOLO_EXT_SMALL_MAP_CONV=0`` turns it off.
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
    """Whether the per-tap weight gradient is used for this convolution."""
    positions = out_height * out_width
    return positions <= SMALL_MAP or (
        positions <= MEDIUM_MAP and in_channels * out_channels >= WIDE_CHANNELS
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


class _SmallMapConv2d(torch.autograd.Function):
    """``conv2d`` whose backward takes the input gradient from torch and the weight gradient
    per tap (:func:`weight_grad_by_taps`)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding):
        ctx.save_for_backward(x, weight)
        ctx.stride, ctx.padding, ctx.has_bias = stride, padding, bias is not None
        return F.conv2d(x, weight, bias, stride, padding)

    @staticmethod
    def backward(ctx, grad_out):
        # differentiable operators only, so that a double backward (create_graph) works; a
        # plain backward runs them without recording
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.convolution_backward(
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
                [True, False, False],
            )[0]
        if ctx.needs_input_grad[1]:
            kernel = tuple(weight.shape[2:])
            last = _channels_last(weight)
            grad_w = weight_grad_by_taps(grad_out, x, kernel, ctx.stride, ctx.padding, last)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_out.sum((0, 2, 3))
        return grad_x, grad_w, grad_b, None, None


def _channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _cpu_autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch before 2.4: no device argument
        return torch.is_autocast_cpu_enabled()


def _per_tap(args: tuple, kwargs: dict) -> tuple | None:
    """The call's (x, weight, bias, stride, padding) when its weight gradient goes per tap."""
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
    if h_out < 1 or w_out < 1 or not taps_win(x.shape[1], weight.shape[0], h_out, w_out):
        return None
    return x, weight, bias, stride, padding


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
    """The convolutions called inside take their weight gradient per tap where
    :func:`taps_win` (float32 / float64 on CPU, no autocast, groups and dilation 1)."""
    if not enabled() or active():
        yield
        return
    with _SmallMapMode():
        yield
