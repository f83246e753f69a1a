"""GPU memory of a training job per GPU: a documented assumption, since no profile measures memory.

    memory_mb(model, b) = CONTEXT_MB + static_mb(model) + ACTIVATION_MB_PER_SAMPLE[model] * b

static = parameters * 4 B * (2 + optimizer state copies): fp32 weights, their gradients and the optimizer
state (parameter counts and optimizers from assumptions.CHECKPOINTS). CONTEXT_MB is the CUDA context plus
framework workspace. Activations per sample are *assumptions* per model family, rough fp32 training
footprints at the datasets' usual input sizes (ImageNet 224x224 ResNet-50 ~100 MiB/sample, CIFAR 32x32
ResNet-18 ~12 MiB, ...). They were chosen so that the pairs the Gavel measurements mark infeasible (e.g.
two ResNet-50 at batch 128 on one 16 GB GPU) do not fit, and the single jobs of the profiles do.
Gradient accumulation with micro-batch b keeps only b samples' activations live, which is what lets a
shared job fit (Castor Algorithm 2).
"""

from __future__ import annotations

from functools import lru_cache

from meshsched.perf.assumptions import BYTES_PER_PARAM, CHECKPOINTS, MIB

CONTEXT_MB = 500.0  # assumption: CUDA context (~300 MiB) + cuDNN/cuBLAS workspace

ACTIVATION_MB_PER_SAMPLE: dict[str, float] = {  # assumption, see the module doc
    "a3c": 400.0,  # one "unit" = 4 workers' 20-step rollouts of 84x84 frames
    "bert": 120.0,  # BERT-base, sequence 384
    "cifar10": 12.0,  # ResNet-18 on 32x32
    "cyclegan": 3000.0,  # batch 1 of 256x256 images through 2 generators + 2 discriminators
    "deepspeech2": 150.0,  # ~10 s utterances through 5 bi-LSTM layers
    "imagenet": 100.0,  # ResNet-50 on 224x224
    "lm": 40.0,  # 2-layer LSTM, bptt 35 (a sample is one sequence column)
    "ncf": 0.02,
    "recommendation": 0.5,  # VAE-CF over 20,108 items
    "resnet18": 12.0,  # ResNet-18 on 32x32 (Gavel's CIFAR-10)
    "resnet50": 100.0,  # ResNet-50 on 224x224
    "transformer": 25.0,  # Transformer base, Multi30k sentences
    "yolov3": 200.0,  # 416x416
}
DEFAULT_ACTIVATION_MB = 100.0  # assumption for a model family not listed

_STATIC = {c.model: c.params_millions * 1e6 * BYTES_PER_PARAM * (2 + c.state_copies) / MIB for c in CHECKPOINTS}


@lru_cache(maxsize=1 << 14)
def job_memory_mb(model: str, micro_batch: int) -> float:
    """Assumed memory per GPU of `model` training with `micro_batch` samples live at once."""
    return CONTEXT_MB + _STATIC.get(model, 500.0) + ACTIVATION_MB_PER_SAMPLE.get(model, DEFAULT_ACTIVATION_MB) * micro_batch


@lru_cache(maxsize=1 << 16)
def pair_fits(model_a: str, batch_a: int, model_b: str, batch_b: int, gpu_memory_mb: float) -> bool:
    """Whether two jobs with these micro-batches fit together on one GPU."""
    return job_memory_mb(model_a, batch_a) + job_memory_mb(model_b, batch_b) <= gpu_memory_mb
