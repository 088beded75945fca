"""A decoupled model (several responses a request) on a real Triton (PyTriton's),
through tiergate as from Triton directly: tritonclient's gRPC stream API
(`start_stream`, `async_stream_infer`) over `ModelStreamInfer`, and HTTP's
`generate_stream` (server-sent events). Every response comes, in order, as it is made,
the final one flagged as Triton flags it.

    python triton_decoupled_test.py TRITON_HTTP TRITON_GRPC GATEWAY_HTTP GATEWAY_GRPC

The model, `tokens`, answers `text_input` with `max_tokens` responses `word0 `,
`word1 `, ... 20 ms apart.
"""

import json
import queue
import sys
import time
import unittest
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient

DIRECT_HTTP, DIRECT_GRPC, GATEWAY_HTTP, GATEWAY_GRPC = sys.argv[1:5]
sys.argv = sys.argv[:1]


def grpc_stream(url, n):
    """Each response's text, whether it is final, and when it came."""
    got = queue.Queue()
    with grpcclient.InferenceServerClient(url) as c:
        c.start_stream(callback=lambda result, error: got.put((result, error)))
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"tell me"], dtype=np.object_))
        tokens = grpcclient.InferInput("max_tokens", [1], "INT32")
        tokens.set_data_from_numpy(np.array([n], dtype=np.int32))
        c.async_stream_infer("tokens", [text, tokens], request_id="r1", enable_empty_final_response=True)
        out = []
        while True:
            result, error = got.get(timeout=30)
            if error is not None:
                raise error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            words = result.as_numpy("text_output")
            word = words[0].decode() if words is not None and len(words) else ""
            out.append((word, final, response.id, time.monotonic()))
            if final:
                break
        c.stop_stream()
    return out


def generate_stream(url, n):
    """Each event's text, and when it came."""
    body = json.dumps({"text_input": "tell me", "max_tokens": n}).encode()
    request = urllib.request.Request(
        f"http://{url}/v2/models/tokens/generate_stream", data=body, headers={"content-type": "application/json"}
    )
    out = []
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream"), answer.headers
        for line in answer:
            if line.startswith(b"data: "):
                out.append((json.loads(line[6:])["text_output"], time.monotonic()))
    return out


class Decoupled(unittest.TestCase):
    def test_grpc_stream_through_tiergate_is_tritons(self):
        direct = grpc_stream(DIRECT_GRPC, 8)
        relayed = grpc_stream(GATEWAY_GRPC, 8)
        self.assertEqual([r[:3] for r in relayed], [d[:3] for d in direct])
        self.assertEqual([w for w, *_ in relayed[:8]], [f"word{i} " for i in range(8)])
        self.assertTrue(relayed[-1][1], "the last response says it is final")
        # Relayed as they come: the responses are made 20 ms apart, so the first arrives
        # well before the last (a relay holding them to the end would bring them at once).
        self.assertGreater(relayed[7][3] - relayed[0][3], 0.1)

    def test_generate_stream_through_tiergate_is_tritons(self):
        direct = generate_stream(DIRECT_HTTP, 6)
        relayed = generate_stream(GATEWAY_HTTP, 6)
        self.assertEqual([t for t, _ in relayed], [t for t, _ in direct])
        self.assertEqual([t for t, _ in relayed], [f"word{i} " for i in range(6)])
        self.assertGreater(relayed[-1][1] - relayed[0][1], 0.06)


if __name__ == "__main__":
    unittest.main(verbosity=2)
