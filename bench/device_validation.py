#!/usr/bin/env python
"""The device profiles against published measured training throughputs: each published run's
model counted as exogym counts a step (exogym.sim.flops), priced on the profile of its device
(exogym.sim.devices), and the prediction beside the measurement with its error, whatever it
is (docs/devices.md, "Validation").

    python bench/device_validation.py            # a few seconds: the models live on "meta"

The models are built on PyTorch's meta device (shapes, no storage), so a 1.3B model counts in
seconds on a laptop. Autocast does not run there: a mixed-precision run is counted with its
weights in bf16 (its matrix products and activations in bf16 as under autocast; the
optimizer's fp32 master weights then move half their bytes, under 0.2% of these steps), and
the optimizer in torch's foreach form (no fused kernel on meta). A measured figure is the
published one per device; a step is one micro-batch's forward and backward and (where the run
takes several micro-batches per step, gradient accumulation) an optimizer step every
``accum`` of them, so the prediction is tokens or samples per second of the same work.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from exogym.sim.devices import PROFILES
from exogym.sim.flops import StepCount, count_step
from exogym.tasks.gpt import GPT, GPTConfig


def _flash(q: Tensor, k: Tensor, v: Tensor, attn_mask: Any = None, dropout_p: float = 0.0,
           is_causal: bool = False, scale: float | None = None) -> Tensor:
    """A fused attention kernel, as a GPU runs it (flash attention): on meta, PyTorch's
    dispatcher would take the unfused math path, T x T scores written and read in memory."""
    assert attn_mask is None
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, dropout_p, is_causal, scale=scale)[0]


class _Adam:
    def build(self, params: list[Tensor]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)


class _Sgd:
    def build(self, params: list[Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)


class _Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.body(x) + self.skip(x))


class ResNet50(nn.Module):
    """ResNet-50 v1.5 (He et al. 2016; the stride on the 3x3 convolution, as NVIDIA's
    DeepLearningExamples and torchvision): 25.6M parameters, ``(images, labels) -> loss``."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                   nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for b in range(blocks):
                layers.append(_Bottleneck(cin, width, stride if b == 0 else 1))
                cin = 4 * width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        h = self.features(x).mean(dim=(2, 3))
        return F.cross_entropy(self.fc(h), y)


@dataclass(frozen=True)
class Published:
    """One published measurement (docs/devices.md cites each)."""

    label: str
    device: str
    precision: str  # "bf16" (mixed), "fp32" (TF32 convolutions where the device has them)
    micro_batch: int
    accum: int  # micro-batches per optimizer step
    measured: float  # per device, in ``unit``
    unit: str  # "tok/s" or "img/s" or "seq/s"
    source: str


def _gpt(vocab: int, seq: int, layers: int, heads: int, width: int) -> GPTConfig:
    return GPTConfig(vocab_size=vocab, block_size=seq, n_layer=layers, n_head=heads,
                     n_embd=width, bias=False)


MODELS: dict[str, Any] = {
    "MPT-125m": _gpt(50368, 2048, 12, 12, 768),
    "MPT-350m": _gpt(50368, 2048, 24, 16, 1024),
    "MPT-760m": _gpt(50368, 2048, 24, 12, 1536),
    "MPT-1b": _gpt(50368, 2048, 24, 16, 2048),
    "GPT-2 124M": _gpt(50257, 1024, 12, 12, 768),
    "BERT-base": _gpt(28996, 128, 12, 12, 768),
    "ResNet-50": "resnet50",
}

_FOUNDRY = "llm-foundry scripts/train/benchmarking/README.md (8 GPUs, seq 2048)"
_LAMBDA = "lambdal/deeplearning-benchmark pytorch-train-throughput-*.csv"
PUBLISHED = (
    Published("MPT-125m", "a100", "bf16", 32, 2, 141_737, "tok/s", _FOUNDRY),
    Published("MPT-350m", "a100", "bf16", 32, 2, 58_782, "tok/s", _FOUNDRY),
    Published("MPT-760m", "a100", "bf16", 24, 2, 32_434, "tok/s", _FOUNDRY),
    Published("MPT-1b", "a100", "bf16", 14, 4, 20_513, "tok/s", _FOUNDRY),
    Published("MPT-1b", "h100", "bf16", 14, 1, 45_455, "tok/s", _FOUNDRY),
    Published("GPT-2 124M", "a100", "bf16", 64, 1, 218_453, "tok/s",
              "karpathy/llm.c scripts/run_gpt2_124M.sh (~300 ms per 8 x 64 x 1024 tokens)"),
    Published("ResNet-50", "a100", "fp32", 256, 1, 938, "img/s",
              "NVIDIA DeepLearningExamples resnet50v1.5 README (1 GPU, TF32)"),
    Published("ResNet-50", "a100", "bf16", 256, 1, 2470, "img/s",
              "NVIDIA DeepLearningExamples resnet50v1.5 README (1 GPU, AMP)"),
    Published("ResNet-50", "rtx3090", "fp32", 224, 1, 513, "img/s", _LAMBDA),
    Published("ResNet-50", "rtx4090", "fp32", 224, 1, 721, "img/s", _LAMBDA),
    Published("ResNet-50", "rtx3090", "bf16", 448, 1, 905, "img/s", _LAMBDA),
    Published("ResNet-50", "rtx4090", "bf16", 448, 1, 1301, "img/s", _LAMBDA),
    Published("BERT-base", "m3-max", "fp32", 64, 1, 87.7, "seq/s",
              "lucadiliello/pytorch-apple-silicon-benchmarks (MPS, 100 steps in 1m13s)"),
)


def _model(name: str, precision: str) -> tuple[nn.Module, Any]:
    spec = MODELS[name]
    with torch.device("meta"):
        model = ResNet50() if spec == "resnet50" else GPT(spec)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    return model, spec


def _batch(spec: Any, size: int, precision: str) -> tuple[Tensor, Tensor]:
    if spec == "resnet50":
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        return (torch.empty(size, 3, 224, 224, device="meta", dtype=dtype),
                torch.zeros(size, dtype=torch.long, device="meta"))
    ids = torch.zeros(size, spec.block_size, dtype=torch.long, device="meta")
    return ids, ids


def predict(p: Published) -> tuple[float, StepCount]:
    """Predicted throughput of ``p``'s work on its device, per second, and the count."""
    model, spec = _model(p.label, p.precision)
    optim = _Sgd() if spec == "resnet50" else _Adam()
    batch = _batch(spec, p.micro_batch, p.precision)
    count = count_step(model, batch, optim, device="meta")
    device = PROFILES[p.device]
    # a step = one micro-batch with its optimizer step; accumulation: the optimizer once per
    # ``accum`` micro-batches
    optimizer = sum(device.kernel_time(k) * n for k, n in count.optimizer_profile)
    seconds = device.step_time(count) - optimizer * (1 - 1 / p.accum)
    per_item = p.micro_batch * (spec.block_size if p.unit == "tok/s" else 1)
    return per_item / seconds, count


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    F.scaled_dot_product_attention = _flash  # the GPT's attention: fused, as on a GPU
    print("| model | device | precision | micro-batch | measured | predicted | error | "
          "bound by | source |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in PUBLISHED:
        value, count = predict(p)
        bound = PROFILES[p.device].bound(count)
        total = sum(bound.values())
        shares = ", ".join(f"{k} {v / total:.0%}" for k, v in bound.items() if v / total >= 0.01)
        print(f"| {p.label} | {PROFILES[p.device].title} | {p.precision} | {p.micro_batch} | "
              f"{p.measured:,.0f} {p.unit} | {value:,.0f} {p.unit} | "
              f"{(value / p.measured - 1) * 100:+.0f}% | {shares} | {p.source} |")


if __name__ == "__main__":
    main()
