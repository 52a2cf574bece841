"""One call of L x B through a network with grouped BatchNorm against L calls of B (PBSD's
student as published): the same outputs, gradients and running statistics."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from solo_ext.modules.grouped_norm import grouped_batch_norm


def network(channels_last: bool = False) -> nn.Module:
    """Conv + BatchNorm2d + ReLU, pooled, then a projector with BatchNorm1d (solo-learn's)."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8, affine=False),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 16),
        nn.BatchNorm1d(16),
        nn.ReLU(),
        nn.Linear(16, 4),
    )
    with torch.no_grad():  # running statistics away from their start, affine weights not 1/0
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
    net = net.double()  # (in float64 the two ways differ by rounding only, far below the checks)
    return net.to(memory_format=torch.channels_last) if channels_last else net


def per_batch(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x [B, L, ...]: one call per index l (as published), stacked back to [B, L, D]."""
    return torch.stack([net(x[:, index]) for index in range(x.size(1))], dim=1)


def grouped(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    b, num = x.shape[:2]
    with grouped_batch_norm([net], num) as ok:
        assert ok
        out = net(x.transpose(0, 1).flatten(0, 1))
    return out.view(num, b, -1).transpose(0, 1)


@pytest.mark.parametrize("channels_last", [False, True])
def test_one_grouped_call_equals_one_call_per_batch(channels_last):
    x = torch.randn(6, 5, 3, 9, 9, dtype=torch.float64) * 2 + 0.5  # B 6 images, L 5 patches
    ref, net = network(channels_last), network(channels_last)
    out_ref, out = per_batch(ref, x), grouped(net, x)
    torch.testing.assert_close(out, out_ref, rtol=1e-9, atol=1e-9)
    weights = torch.randn_like(out_ref)
    (out_ref * weights).sum().backward()
    (out * weights).sum().backward()
    for (name, p_ref), p in zip(ref.named_parameters(), net.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-8, atol=1e-9, msg=name)
    for (name, b_ref), b in zip(ref.named_buffers(), net.buffers()):
        torch.testing.assert_close(b, b_ref, rtol=1e-9, atol=1e-9, msg=name)
    assert int(net[1].num_batches_tracked) == 5
    # the layers are themselves again afterwards
    assert "forward" not in vars(net[1])


def test_the_grouped_statistics_are_not_those_of_the_whole_batch():
    """What grouping changes: one ungrouped call of L x B normalises with the whole batch's
    statistics, which the per-batch calls do not."""
    x = torch.randn(6, 5, 3, 9, 9, dtype=torch.float64)
    x[:, 0] += 3.0  # one patch index far from the others
    ref = network()
    whole = network()
    out_ref = per_batch(ref, x)
    out_whole = whole(x.transpose(0, 1).flatten(0, 1)).view(5, 6, -1).transpose(0, 1)
    assert not torch.allclose(out_whole, out_ref, atol=1e-3)


def test_sync_batch_norm_and_cumulative_averages_are_left_to_per_batch_calls():
    for layer in (nn.SyncBatchNorm(4), nn.BatchNorm2d(4, momentum=None)):
        net = nn.Sequential(nn.Conv2d(3, 4, 1), layer)
        with grouped_batch_norm([net], 5) as ok:
            assert not ok and "forward" not in vars(layer)


def test_eval_mode_layers_are_untouched():
    net = network().eval()
    with grouped_batch_norm([net], 5) as ok:
        assert ok and all("forward" not in vars(m) for m in net.modules())


def test_a_layer_called_before_in_the_step_still_backpropagates():
    """The step calls the backbone on the crops first, then on the patches: the running
    statistics the first call saved for its backward are updated as BatchNorm itself does."""
    ref, net = network(), network()
    crops = torch.randn(6, 3, 9, 9, dtype=torch.float64)
    x = torch.randn(6, 5, 3, 9, 9, dtype=torch.float64)
    (ref(crops).sum() + per_batch(ref, x).sum()).backward()
    (net(crops).sum() + grouped(net, x).sum()).backward()
    for p_ref, p in zip(ref.parameters(), net.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-8, atol=1e-9)
    for b_ref, b in zip(ref.buffers(), net.buffers()):
        torch.testing.assert_close(b, b_ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("channels_last", [False, True])
def test_calls_in_a_row_and_another_number_of_batches(channels_last):
    """Each layer keeps its scratch statistics between calls: what an earlier call (another
    number of batches, another step) left there changes nothing, and the outputs keep the
    input's memory format (no copy back to channels-last)."""
    ref, net = network(channels_last), network(channels_last)
    for step, num in enumerate((5, 5, 3, 5)):
        x = torch.randn(4, num, 3, 9, 9, dtype=torch.float64) * (1 + step) - step
        out_ref, out = per_batch(ref, x), grouped(net, x)
        torch.testing.assert_close(out, out_ref, rtol=1e-9, atol=1e-9)
        for b_ref, b in zip(ref.buffers(), net.buffers()):
            torch.testing.assert_close(b, b_ref, rtol=1e-9, atol=1e-9)
    with grouped_batch_norm([net], 5):
        flat = x.transpose(0, 1).flatten(0, 1)
        if channels_last:
            flat = flat.contiguous(memory_format=torch.channels_last)
        fmap = net[:3](flat)
    assert fmap.is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )
    assert int(net[1].num_batches_tracked) == 18 + 5  # the four calls, then the last one


def test_the_operators_a_grouped_call_dispatches_do_not_grow_with_the_number_of_batches():
    """On a GPU a small batch's step is bound by the kernels it launches: the L momentum steps
    are one matrix-vector product a statistic, not L updates, so a grouped forward and backward
    dispatch as many operators for 8 batches as for 2."""
    from solo_ext.bench.timing import OperatorCount

    def operators(num: int) -> int:
        net = network(channels_last=True)
        x = torch.randn(4, num, 3, 9, 9, dtype=torch.float64)
        grouped(net, x)  # the first call makes the layers' scratch statistics
        with OperatorCount() as count:
            grouped(net, x).sum().backward()
        return count.count

    assert operators(8) == operators(2)
