"""tritonclient -> tiergate -> Triton must answer as tritonclient -> Triton does, over
both protocols, for every datatype the model takes.

    python triton_compare.py TRITON_HTTP TRITON_GRPC GATEWAY_HTTP GATEWAY_GRPC [GATEWAY_HTTP GATEWAY_GRPC ...]
"""

import sys
import unittest

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

DIRECT_HTTP, DIRECT_GRPC, *GATEWAYS = sys.argv[1:]
sys.argv = sys.argv[:1]
DATA = {
    "f32": ("FP32", np.array([[1.5, -2.25, 3.0], [0.0, 1e-30, -7.0]], dtype=np.float32)),
    "f64": ("FP64", np.array([[0.1, 2.0, -1e300], [5e-324, 1.0, 2.0]], dtype=np.float64)),
    "i8": ("INT8", np.array([[-128, 0, 127], [1, 2, 3]], dtype=np.int8)),
    "i32": ("INT32", np.array([[-(2**31), 0, 2**31 - 1], [4, 5, 6]], dtype=np.int32)),
    "i64": ("INT64", np.array([[-(2**63), 0, 2**63 - 1], [7, 8, 9]], dtype=np.int64)),
    "u8": ("UINT8", np.array([[0, 255, 1], [2, 3, 4]], dtype=np.uint8)),
    "u64": ("UINT64", np.array([[0, 2**64 - 1, 1], [2, 3, 4]], dtype=np.uint64)),
    "b": ("BOOL", np.array([[True, False, True], [False, False, True]], dtype=np.bool_)),
    "s": ("BYTES", np.array([[b"a", b"", b"xyz"], [b"\x00\xff", b"q", b"long string"]], dtype=np.object_)),
}


def http_infer(url, binary):
    with httpclient.InferenceServerClient(url) as c:
        inputs = []
        for name, (datatype, arr) in DATA.items():
            inp = httpclient.InferInput(name, list(arr.shape), datatype)
            inp.set_data_from_numpy(arr, binary_data=binary or datatype == "BYTES")
            inputs.append(inp)
        # Non-UTF-8 BYTES cannot travel in JSON (Triton and tritonclient both refuse it).
        outputs = [httpclient.InferRequestedOutput(f"out_{n}", binary_data=binary or n == "s") for n in DATA]
        result = c.infer("echo", inputs, outputs=outputs, headers={"x-tiergate-budget-ms": "250"})
        return {n: result.as_numpy(f"out_{n}") for n in DATA}


def grpc_infer(url):
    with grpcclient.InferenceServerClient(url) as c:
        inputs = []
        for name, (datatype, arr) in DATA.items():
            inp = grpcclient.InferInput(name, list(arr.shape), datatype)
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        result = c.infer("echo", inputs, headers={"x-tiergate-budget-ms": "250"})
        return {n: result.as_numpy(f"out_{n}") for n in DATA}


class ThroughTiergate(unittest.TestCase):
    def check(self, got, want):
        for name in DATA:
            with self.subTest(tensor=name):
                np.testing.assert_array_equal(got[name], want[name])

    def test_http(self):
        for binary in (True, False):
            want = http_infer(DIRECT_HTTP, binary)
            np.testing.assert_array_equal(want["f32"], DATA["f32"][1] * 2)
            for i in range(0, len(GATEWAYS), 2):
                with self.subTest(binary=binary, gateway=GATEWAYS[i]):
                    self.check(http_infer(GATEWAYS[i], binary), want)

    def test_grpc(self):
        want = grpc_infer(DIRECT_GRPC)
        self.check(want, http_infer(DIRECT_HTTP, True))
        for i in range(1, len(GATEWAYS), 2):
            with self.subTest(gateway=GATEWAYS[i]):
                self.check(grpc_infer(GATEWAYS[i]), want)

    def test_metadata_and_readiness(self):
        with grpcclient.InferenceServerClient(DIRECT_GRPC) as c:
            want = c.get_model_metadata("echo", as_json=True)
        for i in range(0, len(GATEWAYS), 2):
            with httpclient.InferenceServerClient(GATEWAYS[i]) as c:
                self.assertTrue(c.is_model_ready("echo"))
                self.assertEqual(c.get_model_metadata("echo")["inputs"][0]["name"], want["inputs"][0]["name"])
            with grpcclient.InferenceServerClient(GATEWAYS[i + 1]) as c:
                self.assertEqual(c.get_model_metadata("echo", as_json=True), want)

    def test_model_config_and_statistics_on_both_doors(self):
        # Each door answers as Triton's own port of its protocol, whichever protocol the
        # gateway speaks to Triton: passed through when the same, converted when not.
        with httpclient.InferenceServerClient(DIRECT_HTTP) as c:
            want_http = c.get_model_config("echo")
            want_http_stats = c.get_inference_statistics("echo")["model_stats"]
        with grpcclient.InferenceServerClient(DIRECT_GRPC) as c:
            want_grpc = c.get_model_config("echo").config
        self.assertGreater(want_http["max_batch_size"], 0)
        for i in range(0, len(GATEWAYS), 2):
            with self.subTest(door="http", gateway=GATEWAYS[i]):
                with httpclient.InferenceServerClient(GATEWAYS[i]) as c:
                    self.assertEqual(c.get_model_config("echo"), want_http)
                    stats = c.get_inference_statistics("echo")["model_stats"]
                self.assertEqual(shape(stats), shape(want_http_stats))
            with self.subTest(door="grpc", gateway=GATEWAYS[i + 1]):
                with grpcclient.InferenceServerClient(GATEWAYS[i + 1]) as c:
                    self.assertEqual(c.get_model_config("echo").config, want_grpc)
                    stats = c.get_inference_statistics("echo").model_stats
                self.assertEqual([(s.name, s.version) for s in stats],
                                 [(s["name"], s["version"]) for s in want_http_stats])


def shape(value):
    """The keys of a JSON value, all the way down (counts and times change between calls)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


if __name__ == "__main__":
    unittest.main(verbosity=2)
