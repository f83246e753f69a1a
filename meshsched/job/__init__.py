"""meshsched.job: the training-side SDK (checkpoints, cooperative exit, reports, calibration).

Importing it does not import torch; torch is loaded when a checkpoint is saved or ranks agree.
"""

from meshsched.job.accumulate import MicroBatch, micro_batches
from meshsched.job.checkpoint import Checkpoint, Checkpointer, RngState, State, TorchState
from meshsched.job.env import MeshEnv
from meshsched.job.sampler import ElasticSampler, even_split
from meshsched.job.session import Session, attach
from meshsched.wire.exitcodes import PREEMPTED_EXIT_CODE

__all__ = [
    "PREEMPTED_EXIT_CODE", "Checkpoint", "Checkpointer", "ElasticSampler", "MeshEnv", "MicroBatch", "RngState",
    "Session", "State", "TorchState", "attach", "even_split", "micro_batches",
]
