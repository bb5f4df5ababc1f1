"""InProcessCommunicator: values of the collectives and byte accounting against the documented
formulas (S = bytes of one node's row, N = nodes):

all_reduce: every node sends and receives 2(N-1)/N * S; all_gather: (N-1) * S;
broadcast: the source sends (N-1) * S and receives 0, every other node receives S and sends 0.
"""

from __future__ import annotations

import pytest
import torch

from exogym.sim.comm import CommRecord, InProcessCommunicator

NODES = (1, 2, 3, 4, 8)
# (dtype, per-node shape, S = numel * element size, by hand)
PAYLOADS = [
    (torch.float32, (3,), 12),  # 3 * 4
    (torch.float16, (2, 5), 20),  # 10 * 2
    (torch.int64, (4, 1, 3), 96),  # 12 * 8
    (torch.float64, (1,), 8),  # 1 * 8
]


def stacked(n: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.arange(n * torch.Size(shape).numel()).reshape(n, *shape).to(dtype)


# -- byte accounting ------------------------------------------------------------------------------
@pytest.mark.parametrize("n", NODES)
@pytest.mark.parametrize(("dtype", "shape", "s"), PAYLOADS)
def test_all_reduce_bytes(n, dtype, shape, s):
    # Prepare
    comm = InProcessCommunicator(n)

    # Execute
    comm.all_reduce(stacked(n, dtype, shape), "sum")

    # Assert: ring all-reduce, 2(N-1)/N * S each way for every node
    want = 2 * (n - 1) / n * s
    assert comm.bytes_sent == pytest.approx([want] * n)
    assert comm.bytes_received == pytest.approx([want] * n)
    assert comm.total_bytes_sent == pytest.approx(n * want)


@pytest.mark.parametrize("n", NODES)
@pytest.mark.parametrize(("dtype", "shape", "s"), PAYLOADS)
def test_all_gather_bytes(n, dtype, shape, s):
    comm = InProcessCommunicator(n)

    comm.all_gather(stacked(n, dtype, shape))

    # ring all-gather: (N-1) * S each way
    assert comm.bytes_sent == pytest.approx([(n - 1) * s] * n)
    assert comm.bytes_received == pytest.approx([(n - 1) * s] * n)


@pytest.mark.parametrize("n", NODES)
@pytest.mark.parametrize(("dtype", "shape", "s"), PAYLOADS)
def test_broadcast_bytes(n, dtype, shape, s):
    src = n - 1
    comm = InProcessCommunicator(n)

    comm.broadcast(stacked(n, dtype, shape), src)

    # star: src sends (N-1)*S and receives 0; the others send 0 and receive S
    assert comm.bytes_sent == pytest.approx([(n - 1) * s if i == src else 0.0 for i in range(n)])
    want_received = [0.0 if i == src else float(s) for i in range(n)]
    assert comm.bytes_received == pytest.approx(want_received)


def test_bytes_by_hand_for_four_nodes():
    # Prepare: N = 4, one fp32 row of 3 -> S = 12 bytes
    comm = InProcessCommunicator(4)
    x = torch.zeros(4, 3)

    # Execute / Assert: all_reduce 2*3/4*12 = 18 per node
    comm.all_reduce(x)
    assert comm.bytes_sent == [18.0] * 4
    assert comm.bytes_received == [18.0] * 4

    # all_gather adds 3*12 = 36 -> 54
    comm.all_gather(x)
    assert comm.bytes_sent == [54.0] * 4
    assert comm.bytes_received == [54.0] * 4

    # broadcast from 1: node 1 sends 36 more (90), others receive 12 more (66); node 1 gets 0
    comm.broadcast(x, 1)
    assert comm.bytes_sent == [54.0, 90.0, 54.0, 54.0]
    assert comm.bytes_received == [66.0, 54.0, 66.0, 66.0]
    assert comm.total_bytes_sent == 54.0 * 3 + 90.0


@pytest.mark.parametrize("n", NODES)
def test_list_payload_sums_the_rows(n):
    # Prepare: fp32 (3,) -> 12 B, fp16 (2,5) -> 20 B, int64 (1,) -> 8 B; S = 40 B
    comm = InProcessCommunicator(n)
    xs = [torch.ones(n, 3), torch.ones(n, 2, 5, dtype=torch.float16),
          torch.ones(n, 1, dtype=torch.int64)]

    # Execute
    out = comm.all_reduce(xs, "sum")

    # Assert
    assert isinstance(out, list) and len(out) == 3
    want = 2 * (n - 1) / n * 40
    assert comm.bytes_sent == pytest.approx([want] * n)
    assert comm.bytes_received == pytest.approx([want] * n)
    assert comm.log[-1].payload_bytes == 40


def test_one_node_sends_nothing():
    comm = InProcessCommunicator(1)
    x = torch.ones(1, 5)

    comm.all_reduce(x)
    comm.all_gather(x)
    comm.broadcast(x, 0)

    assert comm.bytes_sent == [0.0]
    assert comm.bytes_received == [0.0]
    assert len(comm.log) == 3


def test_bytes_accumulate_over_calls():
    # N = 2, fp32 (2,) -> S = 8; all_reduce 2*1/2*8 = 8 per call
    comm = InProcessCommunicator(2)
    for _ in range(3):
        comm.all_reduce(torch.zeros(2, 2))
    assert comm.bytes_sent == [24.0, 24.0]
    assert comm.bytes_received == [24.0, 24.0]


# -- values ---------------------------------------------------------------------------------------
def test_all_reduce_mean_and_sum_values():
    # Prepare: rows [1,2], [3,4], [5,6]
    comm = InProcessCommunicator(3)
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])

    # Execute
    mean = comm.all_reduce(x, "mean")
    total = comm.all_reduce(x, "sum")

    # Assert: sum = [9, 12]; mean = [3, 4]; shape drops the node dim
    assert torch.equal(total, torch.tensor([9.0, 12.0]))
    assert torch.equal(mean, torch.tensor([3.0, 4.0]))
    assert torch.equal(x, torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))  # input untouched


def test_all_reduce_default_op_is_mean():
    comm = InProcessCommunicator(2)
    out = comm.all_reduce(torch.tensor([[2.0], [4.0]]))
    assert torch.equal(out, torch.tensor([3.0]))  # (2 + 4) / 2


def test_all_reduce_int64_sum():
    comm = InProcessCommunicator(2)
    out = comm.all_reduce(torch.tensor([[3, 5], [7, -1]]), "sum")
    # [3+7, 5-1] = [10, 4]
    assert out.dtype == torch.int64
    assert out.tolist() == [10, 4]


def test_all_reduce_int64_mean_of_divisible_values_stays_int64():
    comm = InProcessCommunicator(2)
    out = comm.all_reduce(torch.tensor([[2, 4], [6, -8]]), "mean")
    # [(2+6)/2, (4-8)/2] = [4, -2]
    assert out.dtype == torch.int64
    assert out.tolist() == [4, -2]


def test_all_reduce_list_values():
    comm = InProcessCommunicator(2)
    a = torch.tensor([[1.0], [3.0]])
    b = torch.tensor([[[2.0, 4.0]], [[6.0, 8.0]]])

    out = comm.all_reduce((a, b), "mean")

    # a: (1+3)/2 = 2; b: [(2+6)/2, (4+8)/2] = [4, 6]
    assert torch.equal(out[0], torch.tensor([2.0]))
    assert torch.equal(out[1], torch.tensor([[4.0, 6.0]]))


def test_all_reduce_fp16_stays_fp16_and_does_not_overflow():
    # Prepare: 60000 is exact in fp16 (a multiple of 32 below 65504); 60000 + 60000 overflows fp16
    comm = InProcessCommunicator(2)
    x = torch.tensor([[60000.0, 1.0], [60000.0, 2.0]], dtype=torch.float16)

    # Execute
    out = comm.all_reduce(x, "mean")

    # Assert: mean = [60000, 1.5], dtype fp16 (accumulated in fp32, not inf)
    assert out.dtype == torch.float16
    assert out.tolist() == [60000.0, 1.5]


def test_all_gather_returns_every_row():
    comm = InProcessCommunicator(3)
    x = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.int64)

    out = comm.all_gather(x)

    assert out.shape == (3, 2)
    assert out.tolist() == [[1, 2], [3, 4], [5, 6]]
    gathered = comm.all_gather([x, x.double()])
    assert isinstance(gathered, list) and gathered[1].dtype == torch.float64


@pytest.mark.parametrize("src", [0, 1, 2])
def test_broadcast_returns_the_source_row(src):
    comm = InProcessCommunicator(3)
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])

    out = comm.broadcast(x, src)

    assert out.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]][src]


# -- the log --------------------------------------------------------------------------------------
def test_comm_records_are_appended():
    # Prepare: N = 2, fp32 (3,) -> S = 12; fp16 (3,) -> S = 6
    comm = InProcessCommunicator(2)
    x = torch.zeros(2, 3)

    # Execute
    comm.all_reduce(x)  # default step -1, empty tag
    comm.attendance.step = 7
    comm.all_reduce(x, "sum", tag="grads", overlap=True)
    comm.attendance.step = 8
    comm.all_gather(x.half(), tag="g")
    comm.broadcast(x, 1, tag="buffers")

    # Assert
    assert comm.log == [
        CommRecord("all_reduce", 12, -1, "", False),
        CommRecord("all_reduce", 12, 7, "grads", True),
        CommRecord("all_gather", 6, 8, "g", False),
        CommRecord("broadcast", 12, 8, "buffers", False, src=1),
    ]


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c: c.all_reduce(torch.zeros(2, 4)), r"n_local=3.*\(2, 4\)"),
        (lambda c: c.all_gather(torch.zeros(4)), r"n_local=3.*\(4,\)"),
        (lambda c: c.broadcast(torch.tensor(1.0)), r"n_local=3.*\(\)"),
        (lambda c: c.all_reduce([torch.zeros(3, 1), torch.zeros(1, 3)]), r"n_local=3"),
        (lambda c: c.all_reduce([torch.zeros(3, 1), [1.0, 2.0, 3.0]]), r"n_local=3.*list"),
        (lambda c: c.all_reduce(torch.zeros(3, 1), "max"), r"op must be one of.*'max'"),
        (lambda c: c.broadcast(torch.zeros(3, 1), src=3), r"src.*\[0, 3\).*3"),
        (lambda c: c.broadcast(torch.zeros(3, 1), src=-1), r"src.*-1"),
    ],
)
def test_bad_calls_raise_and_account_nothing(call, match):
    comm = InProcessCommunicator(3)

    with pytest.raises(ValueError, match=match):
        call(comm)

    assert comm.bytes_sent == [0.0] * 3
    assert comm.bytes_received == [0.0] * 3
    assert comm.log == []


def test_zero_nodes_rejected():
    with pytest.raises(ValueError, match="num_nodes"):
        InProcessCommunicator(0)


@pytest.mark.parametrize("n", [1, 3])
def test_all_reduce_in_place_writes_every_row_and_counts_like_all_reduce(n: int) -> None:
    # Prepare: node i holds [i, 10 i]; fp16 too, to cover the low-precision path.
    x32 = torch.tensor([[float(i), 10.0 * i] for i in range(n)])
    x16 = x32.clone().half()
    comm = InProcessCommunicator(n)
    # Execute
    comm.all_reduce_([x32, x16], "mean", tag="t")
    # Assert: mean of 0..n-1 is (n-1)/2, so each row is [(n-1)/2, 10 (n-1)/2].
    want = torch.tensor([(n - 1) / 2, 10 * (n - 1) / 2])
    assert torch.equal(x32, want.expand(n, 2))
    assert x16.dtype == torch.float16 and torch.equal(x16.float(), want.expand(n, 2))
    # S = 2*4 + 2*2 = 12 bytes; ring: 2 (n-1)/n * 12.
    assert comm.bytes_sent == [2 * (n - 1) / n * 12] * n
    assert comm.log[-1].op == "all_reduce" and comm.log[-1].payload_bytes == 12
