"""A real NVIDIA Triton Inference Server (bundled by PyTriton, running on CPU) serving a
model that takes one input of every datatype PyTriton binds and answers each one back
(FP32 doubled), behind Triton's own dynamic batcher.

    python pytriton_server.py HTTP_PORT GRPC_PORT METRICS_PORT
"""

import sys

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
    triton.serve()
