"""tritonclient -> tiergate -> MLServer must answer as tritonclient -> MLServer does.

    python mlserver_compare.py MLSERVER_HTTP MLSERVER_GRPC \
        VIA_HTTP_BACKEND_HTTP VIA_HTTP_BACKEND_GRPC VIA_GRPC_BACKEND_HTTP VIA_GRPC_BACKEND_GRPC

The first gateway fronts MLServer's HTTP port, the second its gRPC port; each is asked
over both of its doors. MLServer's HTTP side takes JSON only (it does not implement
Triton's binary tensor extension, and needs `Content-Type: application/json`, which
tritonclient does not send by itself), so binary HTTP calls are compared through the
gateways: the one fronting MLServer's HTTP port has `binary_tensors = false` and
re-encodes them as JSON, the one fronting its gRPC port converts them to gRPC.
"""

import sys
import unittest

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

DIRECT_HTTP, DIRECT_GRPC, VIA_HTTP_HTTP, VIA_HTTP_GRPC, VIA_GRPC_HTTP, VIA_GRPC_GRPC = sys.argv[1:7]
sys.argv = sys.argv[:1]
ROWS = {
    "FP32": np.array([[0.1, 0.2, 0.0, 0.3], [3.1, 2.9, 0.2, 1.0], [0.2, 3.2, 2.8, -1.1]], dtype=np.float32),
    "FP64": np.array([[2.9, 3.1, -0.1, 0.9], [0.0, 2.8, 3.3, -0.9]], dtype=np.float64),
}


def predict_http(url, arr, datatype, binary):
    with httpclient.InferenceServerClient(url) as c:
        inp = httpclient.InferInput("input-0", list(arr.shape), datatype)
        inp.set_data_from_numpy(arr, binary_data=binary)
        out = httpclient.InferRequestedOutput("predict", binary_data=binary)
        headers = {"x-tiergate-budget-ms": "250"}
        if not binary:
            headers["Content-Type"] = "application/json"
        return c.infer("iris", [inp], outputs=[out], headers=headers).as_numpy("predict")


def predict_grpc(url, arr, datatype):
    with grpcclient.InferenceServerClient(url) as c:
        inp = grpcclient.InferInput("input-0", list(arr.shape), datatype)
        inp.set_data_from_numpy(arr)
        return c.infer("iris", [inp], headers={"x-tiergate-budget-ms": "250"}).as_numpy("predict")


class ThroughTiergate(unittest.TestCase):
    def test_same_answers(self):
        for datatype, arr in ROWS.items():
            with self.subTest(datatype=datatype):
                want = predict_http(DIRECT_HTTP, arr, datatype, False)
                self.assertEqual(len(want), len(arr))
                np.testing.assert_array_equal(predict_grpc(DIRECT_GRPC, arr, datatype), want)
                for url in (VIA_HTTP_HTTP, VIA_GRPC_HTTP):
                    np.testing.assert_array_equal(predict_http(url, arr, datatype, False), want)
                for url in (VIA_HTTP_HTTP, VIA_GRPC_HTTP):
                    np.testing.assert_array_equal(predict_http(url, arr, datatype, True), want)
                for url in (VIA_HTTP_GRPC, VIA_GRPC_GRPC):
                    np.testing.assert_array_equal(predict_grpc(url, arr, datatype), want)

    def test_micro_batch_answers_keep_the_backend_fields(self):
        # Split from one batch, each answer still has what a direct call gets: its own
        # id, the response's parameters and each output's (MLServer's content_type).
        arr = ROWS["FP32"][:1]
        with httpclient.InferenceServerClient(DIRECT_HTTP) as c:
            inp = httpclient.InferInput("input-0", list(arr.shape), "FP32")
            inp.set_data_from_numpy(arr, binary_data=False)
            out = [httpclient.InferRequestedOutput("predict", binary_data=False)]
            headers = {"Content-Type": "application/json"}
            want = c.infer("iris", [inp], outputs=out, request_id="direct", headers=headers).get_response()
        with httpclient.InferenceServerClient(VIA_HTTP_HTTP, concurrency=8) as c:
            pending = []
            for i in range(8):
                inp = httpclient.InferInput("input-0", list(arr.shape), "FP32")
                inp.set_data_from_numpy(arr, binary_data=False)
                headers = {"Content-Type": "application/json", "x-tiergate-budget-ms": "2000"}
                out = [httpclient.InferRequestedOutput("predict", binary_data=False)]
                pending.append(c.async_infer("iris", [inp], outputs=out, request_id=f"r{i}", headers=headers))
            got = [p.get_result().get_response() for p in pending]
        # (An empty parameters object and none are the same to every KServe v2 reader.)
        for i, answer in enumerate(got):
            self.assertEqual(answer["id"], f"r{i}")
            self.assertEqual(answer.get("parameters") or {}, want.get("parameters") or {})
            self.assertTrue(want["outputs"][0].get("parameters"), "MLServer names each output's content type")
            self.assertEqual(answer["outputs"][0].get("parameters"), want["outputs"][0].get("parameters"))
            self.assertEqual(answer["outputs"][0]["data"], want["outputs"][0]["data"])

    def test_metadata_and_readiness(self):
        with httpclient.InferenceServerClient(DIRECT_HTTP) as c:
            want = c.get_model_metadata("iris")
        for http_url, grpc_url in ((VIA_HTTP_HTTP, VIA_HTTP_GRPC), (VIA_GRPC_HTTP, VIA_GRPC_GRPC)):
            with httpclient.InferenceServerClient(http_url) as c:
                self.assertTrue(c.is_model_ready("iris"))
                self.assertEqual(c.get_model_metadata("iris")["name"], want["name"])
            with grpcclient.InferenceServerClient(grpc_url) as c:
                self.assertTrue(c.is_model_ready("iris"))
                self.assertEqual(c.get_model_metadata("iris", as_json=True)["name"], want["name"])

    def test_backend_errors_pass_through(self):
        bad = np.array([[1.0, 2.0]], dtype=np.float32)  # the model needs 4 features
        with self.assertRaises(InferenceServerException) as direct:
            predict_http(DIRECT_HTTP, bad, "FP32", False)
        with self.assertRaises(InferenceServerException) as via:
            predict_http(VIA_HTTP_HTTP, bad, "FP32", False)
        self.assertEqual(via.exception.status(), direct.exception.status())
        with self.assertRaises(InferenceServerException) as converted:
            predict_grpc(VIA_GRPC_GRPC, bad, "FP32")
        self.assertIn("features", str(converted.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
