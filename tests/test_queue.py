"""The label-aware queue: FIFO order, wrap-around, masked empty slots, buffers in state_dict."""

from __future__ import annotations

import torch

from solo_ext.modules.queue import KeyQueue, LabeledQueue


def _keys(start, n, dim=3):
    """Keys whose first coordinate is their global index, so positions can be read back."""
    keys = torch.zeros(n, dim)
    keys[:, 0] = torch.arange(start, start + n, dtype=torch.float)
    return keys


def test_fifo_and_wraparound_with_batch_not_dividing_size():
    queue = LabeledQueue(size=7, dim=3)
    assert not queue.valid.any()
    written = 0
    for _ in range(5):  # batches of 3 into a queue of 7: wraps at uneven positions
        queue.enqueue(_keys(written, 3), torch.arange(written, written + 3) % 5)
        written += 3
        # a reference FIFO: the slot of global item g is g % 7, and it holds the newest such g
        expected = {}
        for g in range(written):
            expected[g % 7] = g
        for slot in range(7):
            if slot in expected:
                assert queue.keys[slot, 0].item() == expected[slot]
                assert queue.labels[slot].item() == expected[slot] % 5
            else:
                assert queue.labels[slot].item() == -1
        assert queue.valid.tolist() == [slot in expected for slot in range(7)]
        assert queue.ptr.item() == written % 7
    assert queue.valid.all()


def test_batch_larger_than_queue_keeps_newest():
    queue = LabeledQueue(size=4, dim=3)
    queue.enqueue(_keys(0, 10), torch.arange(10))
    assert sorted(queue.keys[:, 0].tolist()) == [6.0, 7.0, 8.0, 9.0]
    assert queue.ptr.item() == 10 % 4
    # and the FIFO continues at the right slot: item 10 overwrites the oldest one (6)
    queue.enqueue(_keys(10, 1), torch.tensor([10]))
    assert sorted(queue.keys[:, 0].tolist()) == [7.0, 8.0, 9.0, 10.0]


def test_state_dict_round_trip():
    queue = LabeledQueue(size=5, dim=2)
    queue.enqueue(torch.randn(3, 2), torch.tensor([1, 2, 3]))
    other = LabeledQueue(size=5, dim=2)
    other.load_state_dict(queue.state_dict())
    assert torch.equal(other.keys, queue.keys)
    assert torch.equal(other.labels, queue.labels)
    assert other.ptr.item() == 3


def test_key_queue_is_the_same_fifo_without_labels():
    """DenseCL's queues: the same slots, order and valid (written) slots as the labelled queue."""
    keys_only, labelled = KeyQueue(size=7, dim=3), LabeledQueue(size=7, dim=3)
    keys_only.keys.copy_(labelled.keys)
    assert not keys_only.valid.any()
    written = 0
    for n in (3, 3, 9, 1):  # wraps, and one batch larger than the queue
        keys_only.enqueue(_keys(written, n))
        labelled.enqueue(_keys(written, n), torch.arange(written, written + n))
        written += n
        assert torch.equal(keys_only.keys, labelled.keys)
        assert torch.equal(keys_only.valid, labelled.valid)
        assert keys_only.ptr.item() == labelled.ptr.item() == written % 7
    assert set(keys_only.state_dict()) == {"keys", "ptr", "written"}
