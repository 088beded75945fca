"""Triton's own Python client (tritonclient, HTTP and gRPC) against tiergate.

Run by tests/peers/tritonclient.rs, which starts a simulated backend and a
gateway on free ports and passes the gateway's HTTP and gRPC addresses:

    python tritonclient_test.py HTTP_HOST:PORT GRPC_HOST:PORT MODEL_CONFIG_DESCRIPTORS

MODEL_CONFIG_DESCRIPTORS is the FileDescriptorSet of tiergate's proto/model_config.proto,
compared here message by message with the one tritonclient carries.

The simulator's model "m" echoes its first input as OUTPUT0 and answers each row's sum
as OUTPUT1 (FP64; for BYTES the sum of element lengths), so every check below knows the
exact answer. The route sends budgets under 300 ms to the real-time tier and longer
ones to the micro-batch tier.
"""

import queue
import sys
import unittest

import ml_dtypes
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

HTTP_URL = sys.argv.pop(1)
GRPC_URL = sys.argv.pop(1)
DESCRIPTORS = sys.argv.pop(1)


# Steps of one sequence each client sends at once (the Rust side counts them).
SEQUENCE_STEPS = 32


def budget(ms="200"):
    """A fresh headers dict: tritonclient adds its own headers to the dict it is given."""
    return {"x-tiergate-budget-ms": ms}

SAMPLES = {
    "FP32": np.array([[1.5, -2.0, 3.25], [0.0, 4.0, 8.0]], dtype=np.float32),
    "INT64": np.array([[-(2**40), 7], [3, 2**53 + 1]], dtype=np.int64),
    "BYTES": np.array([[b"ab"], [b"cde"], [b""]], dtype=np.object_),
}


def row_sums(datatype, arr):
    if datatype == "BYTES":
        return np.array([sum(len(x) for x in row) for row in arr], dtype=np.float64)
    return arr.astype(np.float64).sum(axis=1)


class HttpClient(unittest.TestCase):
    def setUp(self):
        self.client = httpclient.InferenceServerClient(HTTP_URL, concurrency=4)

    def tearDown(self):
        self.client.close()

    def inputs(self, datatype, binary):
        arr = SAMPLES[datatype]
        inp = httpclient.InferInput("INPUT0", list(arr.shape), datatype)
        inp.set_data_from_numpy(arr, binary_data=binary)
        return arr, [inp]

    def test_health_and_metadata(self):
        self.assertTrue(self.client.is_server_live())
        self.assertTrue(self.client.is_server_ready())
        self.assertTrue(self.client.is_model_ready("m"))
        self.assertEqual(self.client.get_server_metadata()["name"], "tiergate")
        meta = self.client.get_model_metadata("m")
        self.assertEqual(meta["name"], "m")
        self.assertEqual([o["name"] for o in meta["outputs"]], ["OUTPUT0", "OUTPUT1"])
        self.assertFalse(self.client.is_model_ready("nope"))

    def test_infer_every_datatype_json_and_binary(self):
        for datatype in SAMPLES:
            for binary in (False, True):
                if datatype == "BYTES" and not binary:
                    continue  # tritonclient sends BYTES as JSON strings; covered below
                with self.subTest(datatype=datatype, binary=binary):
                    arr, inputs = self.inputs(datatype, binary)
                    outputs = [
                        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
                        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
                    ]
                    result = self.client.infer("m", inputs, outputs=outputs, headers=budget())
                    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arr)
                    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), row_sums(datatype, arr))

    def test_bytes_as_json_strings(self):
        arr = np.array([["héllo"], ["x"]], dtype=np.object_)
        inp = httpclient.InferInput("INPUT0", [2, 1], "BYTES")
        inp.set_data_from_numpy(arr, binary_data=False)
        result = self.client.infer("m", [inp], headers=budget())
        out = result.as_numpy("OUTPUT0")
        self.assertEqual([[x.decode() if isinstance(x, bytes) else x for x in row] for row in out], [["héllo"], ["x"]])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [6.0, 1.0])

    def test_requested_outputs_only(self):
        arr, inputs = self.inputs("FP32", True)
        outputs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
        result = self.client.infer("m", inputs, outputs=outputs, headers=budget())
        self.assertIsNone(result.as_numpy("OUTPUT0"))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), row_sums("FP32", arr))

    def test_compression_both_ways(self):
        # As Triton: compressed request bodies are read, answers compressed when asked.
        for request, response in (("gzip", "gzip"), ("deflate", "deflate"), ("gzip", None), (None, "deflate")):
            with self.subTest(request=request, response=response):
                arr, inputs = self.inputs("FP32", True)
                result = self.client.infer(
                    "m",
                    inputs,
                    headers=budget(),
                    request_compression_algorithm=request,
                    response_compression_algorithm=response,
                )
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arr)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), row_sums("FP32", arr))

    def test_async_infer(self):
        arr, inputs = self.inputs("INT64", True)
        pending = [self.client.async_infer("m", inputs, request_id=str(i), headers=budget()) for i in range(8)]
        for i, p in enumerate(pending):
            result = p.get_result()
            self.assertEqual(result.get_response()["id"], str(i))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arr)

    def test_errors(self):
        _, inputs = self.inputs("FP32", True)
        with self.assertRaises(InferenceServerException) as unknown:
            self.client.infer("nope", inputs)
        self.assertIn("unknown model 'nope'", str(unknown.exception))
        with self.assertRaises(InferenceServerException) as spent:
            self.client.infer("m", inputs, headers=budget("0"))
        self.assertIn("budget", str(spent.exception))

    def test_shared_memory_is_refused_saying_why(self):
        # tiergate cannot reach the client's shared memory: refused as Triton refuses a
        # region it does not know (400), whether on an output or an input.
        arr, inputs = self.inputs("FP32", True)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        out.set_shared_memory("output_region", 64)
        with self.assertRaises(InferenceServerException) as refused:
            self.client.infer("m", inputs, outputs=[out], headers=budget())
        self.assertEqual(refused.exception.status(), "400")
        self.assertIn("outputs[0].parameters.shared_memory_region", str(refused.exception))
        self.assertIn("cannot use shared memory", str(refused.exception))
        inp = httpclient.InferInput("INPUT0", [2, 3], "FP32")
        inp.set_shared_memory("input_region", 24)
        with self.assertRaises(InferenceServerException) as refused:
            self.client.infer("m", [inp], headers=budget())
        self.assertIn("inputs[0].parameters.shared_memory_region", str(refused.exception))

    def test_model_config_and_statistics(self):
        config = self.client.get_model_config("m")
        self.assertEqual(config["name"], "m")
        self.assertEqual(config["max_batch_size"], 0)
        self.assertEqual([(i["name"], i["data_type"], i["dims"]) for i in config["input"]],
                         [("INPUT0", "TYPE_FP32", [-1, -1])])
        stats = self.client.get_inference_statistics("m")["model_stats"][0]
        self.assertEqual((stats["name"], stats["version"]), ("m", "1"))

    def test_statistics_of_every_model(self):
        stats = self.client.get_inference_statistics()
        self.assertIn("m", [m["name"] for m in stats["model_stats"]])
        self.assertEqual(self.client.get_inference_statistics("m")["model_stats"][0]["name"], "m")

    def test_shared_memory_registration_is_refused(self):
        self.assertEqual(self.client.get_system_shared_memory_status(), [])
        with self.assertRaises(InferenceServerException) as refused:
            self.client.register_system_shared_memory("r0", "/r0", 64)
        self.assertIn("cannot use shared memory", str(refused.exception))
        self.client.unregister_system_shared_memory()

    def test_bf16_in_binary_on_both_tiers(self):
        # BF16 is binary only over HTTP, as Triton has it; these values are exact in it.
        arr = np.array([[1.5, -2.0, 3.25], [0.0, 4.0, 8.0]], dtype=ml_dtypes.bfloat16)
        for ms in ("200", "2000"):
            with self.subTest(budget=ms):
                inp = httpclient.InferInput("INPUT0", list(arr.shape), "BF16")
                inp.set_data_from_numpy(arr, binary_data=True)
                result = self.client.infer("m", [inp], headers=budget(ms))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0").astype(np.float32), arr.astype(np.float32))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), row_sums("FP32", arr))

    def test_repository_index_and_what_belongs_to_the_model_servers(self):
        index = self.client.get_model_repository_index()
        self.assertIn({"name": "m", "state": "READY"}, index)
        for refused_call in (lambda: self.client.load_model("m"), lambda: self.client.unload_model("m")):
            with self.assertRaises(InferenceServerException) as refused:
                refused_call()
            self.assertEqual(refused.exception.status(), "501")
            self.assertIn("model servers", str(refused.exception))
        for refused_call in (self.client.get_log_settings, self.client.get_trace_settings):
            with self.assertRaises(InferenceServerException) as refused:
                refused_call()
            self.assertIn("set them on the model servers", str(refused.exception))

    def test_micro_batch_tier(self):
        # A 2 s budget calls for the micro-batch tier: concurrent callers share batches
        # and each gets exactly its own rows and id back, JSON or binary as it asked.
        pending = []
        for i in range(12):
            arr = np.full((1 + i % 3, 3), i, dtype=np.float32)
            inp = httpclient.InferInput("INPUT0", list(arr.shape), "FP32")
            inp.set_data_from_numpy(arr, binary_data=i % 2 == 0)
            out = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=i % 3 == 0)]
            call = self.client.async_infer("m", [inp], request_id=str(i), outputs=out, headers=budget("2000"))
            pending.append((arr, call))
        for i, (arr, call) in enumerate(pending):
            result = call.get_result()
            self.assertEqual(result.get_response()["id"], str(i))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), row_sums("FP32", arr))

    def test_sequence_steps_are_never_combined(self):
        # 32 concurrent steps of sequence 77 with a 2 s budget (the micro-batch tier):
        # each gets its own answer; tests/peers/tritonclient.rs then checks that
        # each reached the backend alone (its id on a call of its own).
        pending = []
        for i in range(SEQUENCE_STEPS):
            arr = np.full((1, 3), i, dtype=np.float32)
            inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
            inp.set_data_from_numpy(arr)
            call = self.client.async_infer("m", [inp], request_id=f"seq-http-{i}", sequence_id=77,
                                           sequence_start=i == 0, headers=budget("2000"))
            pending.append((arr, call))
        for arr, call in pending:
            np.testing.assert_array_equal(call.get_result().as_numpy("OUTPUT0"), arr)


class GrpcClient(unittest.TestCase):
    def setUp(self):
        self.client = grpcclient.InferenceServerClient(GRPC_URL)

    def tearDown(self):
        self.client.close()

    def inputs(self, datatype):
        arr = SAMPLES[datatype]
        inp = grpcclient.InferInput("INPUT0", list(arr.shape), datatype)
        inp.set_data_from_numpy(arr)
        return arr, [inp]

    def test_health_and_metadata(self):
        self.assertTrue(self.client.is_server_live())
        self.assertTrue(self.client.is_server_ready())
        self.assertTrue(self.client.is_model_ready("m"))
        self.assertEqual(self.client.get_server_metadata(as_json=True)["name"], "tiergate")
        meta = self.client.get_model_metadata("m", as_json=True)
        self.assertEqual(meta["name"], "m")
        self.assertEqual([o["name"] for o in meta["outputs"]], ["OUTPUT0", "OUTPUT1"])
        # Triton answers ready: false for a model it does not serve, not an error.
        self.assertFalse(self.client.is_model_ready("nope"))

    def test_model_config_and_statistics_from_an_http_backend(self):
        # The route's backend speaks HTTP: its JSON is converted to Triton's messages,
        # decoded here by tritonclient's own generated code.
        config = self.client.get_model_config("m").config
        self.assertEqual((config.name, config.platform, config.max_batch_size), ("m", "tiergate_sim", 0))
        self.assertEqual([(o.name, o.data_type, list(o.dims)) for o in config.output],
                         [("OUTPUT0", model_config_pb2.TYPE_FP32, [-1, -1]),
                          ("OUTPUT1", model_config_pb2.TYPE_FP64, [-1])])
        self.assertEqual(config.instance_group[0].kind, model_config_pb2.ModelInstanceGroup.KIND_CPU)
        stats = self.client.get_inference_statistics("m").model_stats
        self.assertEqual([(s.name, s.version) for s in stats], [("m", "1")])

    def test_infer_every_datatype(self):
        for datatype in SAMPLES:
            with self.subTest(datatype=datatype):
                arr, inputs = self.inputs(datatype)
                result = self.client.infer("m", inputs, headers=budget())
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arr)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), row_sums(datatype, arr))

    def test_bf16_on_both_tiers(self):
        arr = np.array([[1.5, -2.0, 3.25], [0.0, 4.0, 8.0]], dtype=ml_dtypes.bfloat16)
        for ms in ("200", "2000"):
            with self.subTest(budget=ms):
                inp = grpcclient.InferInput("INPUT0", list(arr.shape), "BF16")
                inp.set_data_from_numpy(arr)
                result = self.client.infer("m", [inp], headers=budget(ms))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0").astype(np.float32), arr.astype(np.float32))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), row_sums("FP32", arr))

    def test_repository_index_and_what_belongs_to_the_model_servers(self):
        index = self.client.get_model_repository_index(as_json=True)
        self.assertIn({"name": "m", "state": "READY"}, index["models"])
        for refused_call in (lambda: self.client.load_model("m"), lambda: self.client.unload_model("m")):
            with self.assertRaises(InferenceServerException) as refused:
                refused_call()
            self.assertEqual(refused.exception.status(), "StatusCode.UNIMPLEMENTED")
            self.assertIn("model servers", refused.exception.message())
        for refused_call in (self.client.get_log_settings, self.client.get_trace_settings):
            with self.assertRaises(InferenceServerException) as refused:
                refused_call()
            self.assertEqual(refused.exception.status(), "StatusCode.UNIMPLEMENTED")
            self.assertIn("set them on the model servers", refused.exception.message())

    def test_shared_memory_registration_is_refused_saying_why(self):
        self.assertEqual(self.client.get_system_shared_memory_status(as_json=True), {})
        self.assertEqual(self.client.get_cuda_shared_memory_status(as_json=True), {})
        registrations = (
            lambda: self.client.register_system_shared_memory("r0", "/r0", 64),
            lambda: self.client.register_cuda_shared_memory("r1", b"aGFuZGxl", 0, 64),
        )
        for register in registrations:
            with self.assertRaises(InferenceServerException) as refused:
                register()
            self.assertEqual(refused.exception.status(), "StatusCode.INVALID_ARGUMENT")
            self.assertIn("cannot use shared memory", refused.exception.message())
        self.client.unregister_system_shared_memory()
        self.client.unregister_cuda_shared_memory()

    def test_shared_memory_is_refused_saying_why(self):
        arr, inputs = self.inputs("FP32")
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("output_region", 64)
        with self.assertRaises(InferenceServerException) as refused:
            self.client.infer("m", inputs, outputs=[out], headers=budget())
        self.assertEqual(refused.exception.status(), "StatusCode.INVALID_ARGUMENT")
        self.assertIn("cannot use shared memory", refused.exception.message())

    def test_compressed_requests(self):
        # As Triton: gzip and deflate messages are read.
        for algorithm in ("gzip", "deflate"):
            with self.subTest(algorithm=algorithm):
                arr, inputs = self.inputs("FP32")
                result = self.client.infer("m", inputs, headers=budget(), compression_algorithm=algorithm)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arr)

    def test_requested_outputs_only(self):
        arr, inputs = self.inputs("FP32")
        outputs = [grpcclient.InferRequestedOutput("OUTPUT1")]
        result = self.client.infer("m", inputs, outputs=outputs, headers=budget())
        self.assertIsNone(result.as_numpy("OUTPUT0"))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), row_sums("FP32", arr))

    def test_async_infer(self):
        arr, inputs = self.inputs("FP32")
        done = queue.Queue()
        for i in range(8):
            self.client.async_infer("m", inputs, lambda result, error: done.put((result, error)), request_id=str(i), headers=budget())
        ids = set()
        for _ in range(8):
            result, error = done.get(timeout=30)
            self.assertIsNone(error, error and f"{error.status()}: {error.message()}")
            ids.add(result.get_response().id)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arr)
        self.assertEqual(ids, {str(i) for i in range(8)})

    def test_streaming(self):
        arr, inputs = self.inputs("INT64")
        done = queue.Queue()
        self.client.start_stream(callback=lambda result, error: done.put((result, error)))
        for i in range(5):
            self.client.async_stream_infer("m", inputs, request_id=str(i))
        got = [done.get(timeout=30) for _ in range(5)]
        self.client.stop_stream()
        for i, (result, error) in enumerate(got):
            self.assertIsNone(error)
            self.assertEqual(result.get_response().id, str(i))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), row_sums("INT64", arr))

    def test_errors(self):
        _, inputs = self.inputs("FP32")
        with self.assertRaises(InferenceServerException) as unknown:
            self.client.infer("nope", inputs)
        self.assertEqual(unknown.exception.status(), "StatusCode.NOT_FOUND")
        # A message over the gateway's limit (64 MiB by default) is RESOURCE_EXHAUSTED, as Triton says.
        big = grpcclient.InferInput("INPUT0", [1, 70 * 2**20 // 4], "FP32")
        big.set_data_from_numpy(np.zeros((1, 70 * 2**20 // 4), dtype=np.float32))
        with self.assertRaises(InferenceServerException) as too_large:
            self.client.infer("m", [big], headers=budget())
        self.assertEqual(too_large.exception.status(), "StatusCode.RESOURCE_EXHAUSTED")

    def test_micro_batch_tier(self):
        # The gRPC deadline is the budget: 2 s calls for the micro-batch tier, where
        # concurrent callers share batches and each gets exactly its own rows and id.
        done = queue.Queue()
        arrays = {}
        for i in range(12):
            arr = np.full((1 + i % 3, 2), i, dtype=np.int64)
            arrays[str(i)] = arr
            inp = grpcclient.InferInput("INPUT0", list(arr.shape), "INT64")
            inp.set_data_from_numpy(arr)
            self.client.async_infer(
                "m", [inp], lambda result, error: done.put((result, error)), request_id=str(i), client_timeout=2.0
            )
        for _ in range(12):
            result, error = done.get(timeout=30)
            self.assertIsNone(error)
            arr = arrays.pop(result.get_response().id)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arr)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), row_sums("INT64", arr))
        self.assertEqual(arrays, {})

    def test_sequence_steps_are_never_combined(self):
        # As over HTTP, with sequence 78 and the budget from the gRPC deadline.
        done = queue.Queue()
        for i in range(SEQUENCE_STEPS):
            inp = grpcclient.InferInput("INPUT0", [1, 2], "INT64")
            inp.set_data_from_numpy(np.full((1, 2), i, dtype=np.int64))
            self.client.async_infer("m", [inp], lambda result, error: done.put((result, error)),
                                    request_id=f"seq-grpc-{i}", sequence_id=78, sequence_start=i == 0,
                                    client_timeout=2.0)
        for _ in range(SEQUENCE_STEPS):
            result, error = done.get(timeout=30)
            self.assertIsNone(error)
            i = int(result.get_response().id.removeprefix("seq-grpc-"))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 2), i, dtype=np.int64))


STATISTICS = ("ModelStatistics", "StatisticDuration", "InferStatistics", "InferResponseStatistics",
              "InferBatchStatistics", "MemoryUsage")


def declared(file):
    """Every message and enum a file declares, by full name: fields as (name, number,
    type, label, type name, in a oneof), enum values as (name, number)."""
    if not isinstance(file, descriptor_pb2.FileDescriptorProto):
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        file = proto
    found = {}

    def walk(prefix, messages, enums):
        for enum in enums:
            found[f"{prefix}.{enum.name}"] = sorted((v.name, v.number) for v in enum.value)
        for m in messages:
            name = f"{prefix}.{m.name}"
            found[name] = sorted((f.name, f.number, f.type, f.label, f.type_name, f.HasField("oneof_index"))
                                 for f in m.field)
            walk(name, m.nested_type, m.enum_type)

    walk(f".{file.package}", file.message_type, file.enum_type)
    return found


class ModelConfigSchema(unittest.TestCase):
    """tiergate's proto/model_config.proto declares Triton's messages with Triton's
    names, numbers and types: every message and enum of tritonclient's model config,
    and its statistics messages, field by field."""

    def test_every_field_as_triton(self):
        with open(DESCRIPTORS, "rb") as f:
            ours = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        mine = {}
        for file in ours.file:
            mine.update(declared(file))
        theirs = declared(model_config_pb2.DESCRIPTOR)
        statistics = tuple(f".inference.{m}" for m in STATISTICS)
        theirs.update((n, v) for n, v in declared(service_pb2.DESCRIPTOR).items()
                      if n in statistics or n.startswith(tuple(f"{m}." for m in statistics)))
        self.assertGreater(len(theirs), 60)
        for name, fields in theirs.items():
            with self.subTest(declared=name):
                self.assertEqual(mine.get(name), fields)

    def test_every_service_message_as_triton(self):
        # Every message proto/grpc_service.proto declares, as tritonclient's: but the two
        # carried as their encoded bytes (identical on the wire), which its comment names.
        with open(DESCRIPTORS, "rb") as f:
            ours = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        service = next(f for f in ours.file if f.name == "grpc_service.proto")
        mine = declared(service)
        theirs = declared(service_pb2.DESCRIPTOR)
        as_bytes = (".inference.ModelConfigResponse", ".inference.ModelStatisticsResponse")
        self.assertGreater(len(mine), 40)
        for name, fields in mine.items():
            if name in as_bytes:
                continue
            with self.subTest(declared=name):
                self.assertEqual(fields, theirs.get(name))


if __name__ == "__main__":
    unittest.main(verbosity=2)
