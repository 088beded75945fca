"""A real NVIDIA Triton server (bundled by PyTriton, on CPU) serving model "resnet50"
with the simulator's resnet50-eager cost model: each call of B rows sleeps
7.5 ms + 0.085 ms x B on ONE model instance, and answers OUTPUT0 = INPUT0.

    python pytriton_cost.py batcher HTTP_PORT GRPC_PORT METRICS_PORT MAX_BATCH
        Triton's own dynamic batcher (max_batch_size MAX_BATCH, no added queue delay):
        Triton coalesces concurrent requests before calling the model.
    python pytriton_cost.py plain HTTP_PORT GRPC_PORT METRICS_PORT
        Batching off: every request is one model call of its own rows (tiergate's
        micro-batch tier does the coalescing in front of it).
"""

import sys
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

mode = sys.argv[1]
http_port, grpc_port, metrics_port = map(int, sys.argv[2:5])
COLS = 16
A, B = 0.0075, 0.000085


def cost(rows):
    time.sleep(A + B * rows)


@batch
def batched(INPUT0):
    cost(len(INPUT0))
    return {"OUTPUT0": INPUT0}


def plain(requests):
    answers = []
    for request in requests:
        rows = request["INPUT0"]
        cost(len(rows))
        answers.append({"OUTPUT0": rows})
    return answers


config = TritonConfig(
    http_address="127.0.0.1", http_port=http_port, grpc_address="127.0.0.1", grpc_port=grpc_port, metrics_port=metrics_port
)
with Triton(config=config) as triton:
    if mode == "batcher":
        max_batch = int(sys.argv[5])
        triton.bind(
            model_name="resnet50",
            infer_func=batched,
            inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(COLS,))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(COLS,))],
            config=ModelConfig(max_batch_size=max_batch, batcher=DynamicBatcher(max_queue_delay_microseconds=0)),
        )
    else:
        triton.bind(
            model_name="resnet50",
            infer_func=plain,
            inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1, COLS))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1, COLS))],
            config=ModelConfig(batching=False),
        )
    triton.serve()
