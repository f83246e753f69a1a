"""Documented constants that no dataset measures: GPU memory per type, and the checkpoint-size model from
which Lazer's load time l and pause time p are derived. The fit writes them to gpus.json / overheads.json.

l = LOAD_FIXED_S + checkpoint_bytes / STORAGE_BYTES_PER_S     (start the process, then read the checkpoint)
p = PAUSE_FIXED_S + checkpoint_bytes / STORAGE_BYTES_PER_S    (stop at a step boundary, then write it)
checkpoint_bytes = parameters * 4 B (fp32) * (1 + optimizer state copies)
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
STORAGE_BYTES_PER_S = 125 * MIB  # AWS EBS gp3 baseline throughput (125 MiB/s), a common default volume
LOAD_FIXED_S = 20.0  # assumption: process + CUDA context + framework and data-loader start-up
PAUSE_FIXED_S = 5.0  # assumption: reach a step boundary, signal all ranks, flush
BYTES_PER_PARAM = 4  # fp32 weights


@dataclass(frozen=True, slots=True)
class GpuSpec:
    gpu_type: str
    memory_mb: int
    source: str


@dataclass(frozen=True, slots=True)
class CheckpointFacts:
    model: str
    params_millions: float
    optimizer: str
    state_copies: int  # optimizer state tensors per parameter (SGD+momentum 1, Adam 2, plain SGD 0)
    source: str


GPUS = (
    GpuSpec("k80", 12 * 1024, "NVIDIA Tesla K80: 24 GB per board = 2 GPUs x 12 GB; AWS p2 lists 12 GiB per GPU"),
    GpuSpec("p100", 16 * 1024, "NVIDIA Tesla P100 16 GB (SXM2 / PCIe-16GB; a 12 GB PCIe variant also exists)"),
    GpuSpec("t4", 16 * 1024, "NVIDIA T4 16 GB GDDR6; AWS g4dn.12xlarge = 4 x T4 (Pollux measurements)"),
    GpuSpec("v100", 16 * 1024, "NVIDIA V100 16 GB as on AWS p3.2xlarge/8xlarge/16xlarge (p3dn has 32 GB)"),
)

CHECKPOINTS = (
    CheckpointFacts("a3c", 3.2, "adam", 2, "estimate from the A3C-LSTM Atari net (4 conv + LSTM 1024->512)"),
    CheckpointFacts("bert", 110.0, "adam", 2, "BERT-base, Devlin et al. 2019 (110M)"),
    CheckpointFacts("cifar10", 11.17, "sgd+momentum", 1, "ResNet-18 for CIFAR-10 (11.17M)"),
    CheckpointFacts("cyclegan", 28.3, "adam", 2, "2 ResNet-9-block generators (11.4M each) + 2 PatchGAN (2.8M)"),
    CheckpointFacts("deepspeech2", 87.0, "sgd+momentum", 1, "estimate: 5 bidirectional LSTM layers of 1024"),
    CheckpointFacts("imagenet", 25.56, "sgd+momentum", 1, "ResNet-50, torchvision (25,557,032)"),
    CheckpointFacts("lm", 14.0, "sgd", 0, "estimate: 2-layer LSTM 200/200 with 33,278-word WikiText-2 vocab"),
    CheckpointFacts("ncf", 0.4, "adam", 2, "estimate: NeuMF on MovieLens-1M (factors 8, MLP 64-32-16-8)"),
    CheckpointFacts("recommendation", 24.5, "adam", 2, "estimate: VAE-CF on ML-20M, 20,108 items, 600-200"),
    CheckpointFacts("resnet18", 11.17, "sgd+momentum", 1, "ResNet-18 for CIFAR-10 (11.17M)"),
    CheckpointFacts("resnet50", 25.56, "sgd+momentum", 1, "ResNet-50, torchvision (25,557,032)"),
    CheckpointFacts("transformer", 48.0, "adam", 2, "estimate: Transformer base 6+6 layers d=512 on Multi30k"),
    CheckpointFacts("yolov3", 61.9, "sgd+momentum", 1, "YOLOv3 (Darknet-53), 61.9M"),
)


def checkpoint_bytes(c: CheckpointFacts) -> float:
    return c.params_millions * 1e6 * BYTES_PER_PARAM * (1 + c.state_copies)


def load_seconds(c: CheckpointFacts) -> float:
    return LOAD_FIXED_S + checkpoint_bytes(c) / STORAGE_BYTES_PER_S


def pause_seconds(c: CheckpointFacts) -> float:
    return PAUSE_FIXED_S + checkpoint_bytes(c) / STORAGE_BYTES_PER_S
