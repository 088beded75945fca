"""A real NVIDIA Triton Inference Server (bundled by PyTriton, running on CPU) serving a
model that takes one input of every datatype PyTriton binds and answers each one back
(FP32 doubled), behind Triton's own dynamic batcher; and a decoupled model, `tokens`,
that answers `text_input` with `max_tokens` responses of one word each (`text_output`),
20 ms apart, as Triton's LLM backends stream tokens.

    python pytriton_server.py HTTP_PORT GRPC_PORT METRICS_PORT
"""

import sys
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

http_port, grpc_port, metrics_port = map(int, sys.argv[1:4])
DTYPES = {
    "f32": np.float32,
    "f64": np.float64,
    "i8": np.int8,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "u64": np.uint64,
    "b": np.bool_,
    "s": np.bytes_,
}


@batch
def echo(**inputs):
    out = {f"out_{k}": v for k, v in inputs.items()}
    out["out_f32"] = inputs["f32"] * 2
    return out


def tokens(requests):
    """A decoupled model (no batching: one request at a time): a word a step."""
    n = int(requests[0]["max_tokens"].reshape(-1)[0])
    for step in range(n):
        time.sleep(0.02)
        yield [{"text_output": np.array([f"word{step} ".encode()], dtype=np.bytes_)}]


config = TritonConfig(http_address="127.0.0.1", http_port=http_port, grpc_address="127.0.0.1", grpc_port=grpc_port, metrics_port=metrics_port)
# PyTriton restricts statistics to callers with its access token; the test compares them.
security = TritonSecurityConfig(restricted_endpoints=["shared-memory", "model-repository", "trace", "logging"])
with Triton(config=config, security_config=security) as triton:
    triton.bind(
        model_name="echo",
        infer_func=echo,
        inputs=[Tensor(name=k, dtype=d, shape=(-1,)) for k, d in DTYPES.items()],
        outputs=[Tensor(name=f"out_{k}", dtype=d, shape=(-1,)) for k, d in DTYPES.items()],
        config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=100)),
    )
    triton.bind(
        model_name="tokens",
        infer_func=tokens,
        inputs=[Tensor(name="text_input", dtype=np.bytes_, shape=(1,)), Tensor(name="max_tokens", dtype=np.int32, shape=(1,))],
        outputs=[Tensor(name="text_output", dtype=np.bytes_, shape=(1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )
    triton.serve()
