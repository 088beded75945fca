"""The official OpenAI Python SDK drives tiergate's Batch API end to end: upload, create,
poll, list, download, cancel.

Run by tests/peers/openai.rs, which starts a simulated backend and a gateway with
an embeddings route (/v1/embeddings, model "m", answered fast) and a slow KServe model
("slow"), and passes the gateway's HTTP address:

    python openai_batch_test.py HOST:PORT

The simulator's embedding of a string is [characters, sum of its bytes].
"""

import io
import json
import sys
import time
import unittest

from openai import BadRequestError, NotFoundError, OpenAI

ADDR = sys.argv.pop(1)


def embedding_line(i):
    return {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": f"text {i}"}}


def slow_line(i):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [i]}]}
    return {"custom_id": f"s{i}", "method": "POST", "url": "/v2/models/slow/infer", "body": body}


def jsonl(lines):
    return io.BytesIO("\n".join(json.dumps(line) for line in lines).encode())


class BatchApi(unittest.TestCase):
    def setUp(self):
        self.client = OpenAI(base_url=f"http://{ADDR}/v1", api_key="not-used", max_retries=0)

    def wait(self, batch_id, statuses, limit=60):
        deadline = time.monotonic() + limit
        while True:
            batch = self.client.batches.retrieve(batch_id)
            if batch.status in statuses:
                return batch
            self.assertLess(time.monotonic(), deadline, f"batch stuck in {batch.status}")
            time.sleep(0.05)

    def test_upload_create_poll_download(self):
        n = 300
        uploaded = self.client.files.create(file=("in.jsonl", jsonl([embedding_line(i) for i in range(n)])), purpose="batch")
        self.assertEqual(uploaded.purpose, "batch")
        self.assertEqual(self.client.files.retrieve(uploaded.id).id, uploaded.id)
        batch = self.client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h", metadata={"job": "nightly"}
        )
        self.assertIn(batch.status, ("validating", "in_progress", "finalizing", "completed"))
        done = self.wait(batch.id, ("completed", "failed"))
        self.assertEqual(done.status, "completed", done.errors)
        self.assertEqual((done.request_counts.total, done.request_counts.completed, done.request_counts.failed), (n, n, 0))
        self.assertEqual(done.metadata, {"job": "nightly"})
        output = self.client.files.content(done.output_file_id).text
        seen = {}
        for line in output.splitlines():
            result = json.loads(line)
            self.assertNotIn(result["custom_id"], seen)
            seen[result["custom_id"]] = result
        self.assertEqual(len(seen), n)
        for i in range(n):
            result = seen[f"e{i}"]
            self.assertEqual(result["response"]["status_code"], 200)
            text = f"text {i}"
            data = result["response"]["body"]["data"]
            self.assertEqual(data, [{"object": "embedding", "index": 0, "embedding": [len(text), sum(text.encode())]}])
        listed = [b.id for b in self.client.batches.list(limit=100)]
        self.assertIn(batch.id, listed)

    def test_cancel_keeps_partial_results(self):
        n = 200
        uploaded = self.client.files.create(file=("slow.jsonl", jsonl([slow_line(i) for i in range(n)])), purpose="batch")
        batch = self.client.batches.create(input_file_id=uploaded.id, endpoint="/v2/models/slow/infer", completion_window="24h")
        cancelling = self.client.batches.cancel(batch.id)
        self.assertIn(cancelling.status, ("cancelling", "cancelled"))
        done = self.wait(batch.id, ("cancelled",))
        counts = done.request_counts
        self.assertEqual(counts.total, n)
        self.assertEqual(counts.completed + counts.failed, n)
        self.assertGreater(counts.failed, 0, "the cancel stopped requests that had not run")
        errors = self.client.files.content(done.error_file_id).text.splitlines()
        self.assertEqual(len(errors), counts.failed)
        self.assertTrue(all(json.loads(e)["error"]["code"] == "batch_cancelled" for e in errors))
        if counts.completed:
            self.assertEqual(len(self.client.files.content(done.output_file_id).text.splitlines()), counts.completed)

    def test_bad_lines_fail_the_batch_with_line_numbers(self):
        lines = [embedding_line(0), embedding_line(0), {"custom_id": "x", "method": "POST", "url": "/nope", "body": {}}]
        uploaded = self.client.files.create(file=("bad.jsonl", jsonl(lines)), purpose="batch")
        batch = self.client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        self.assertEqual(batch.status, "failed")
        self.assertEqual([(e.line, e.code) for e in batch.errors.data], [(2, "duplicate_custom_id"), (3, "invalid_url")])

    def test_files_are_listed_and_deleted(self):
        made = [
            self.client.files.create(file=(f"f{i}.jsonl", jsonl([embedding_line(i)])), purpose="batch").id
            for i in range(3)
        ]
        listed = [f.id for f in self.client.files.list(purpose="batch")]
        self.assertTrue(set(made) <= set(listed), (made, listed))
        self.assertEqual([f.id for f in self.client.files.list(purpose="fine-tune")], [])
        # Pages as OpenAI's: one at a time, oldest first, then after the cursor.
        first = self.client.files.list(limit=1, order="asc", purpose="batch")
        self.assertEqual(len(first.data), 1)
        self.assertTrue(first.has_more)
        after = self.client.files.list(limit=100, order="asc", purpose="batch", after=first.data[0].id)
        self.assertNotIn(first.data[0].id, [f.id for f in after.data])
        deleted = self.client.files.delete(made[0])
        self.assertEqual((deleted.id, deleted.deleted), (made[0], True))
        with self.assertRaises(NotFoundError):
            self.client.files.retrieve(made[0])
        with self.assertRaises(NotFoundError):
            self.client.files.delete(made[0])
        self.assertNotIn(made[0], [f.id for f in self.client.files.list()])

    def test_every_line_must_go_to_the_batch_endpoint(self):
        # As OpenAI: a line whose url is not the batch's endpoint fails the batch, by its line.
        lines = [embedding_line(0), slow_line(1)]
        uploaded = self.client.files.create(file=("mixed.jsonl", jsonl(lines)), purpose="batch")
        batch = self.client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        self.assertEqual(batch.status, "failed")
        self.assertEqual([(e.line, e.code) for e in batch.errors.data], [(2, "invalid_url")])
        self.assertIn("not the batch's endpoint /v1/embeddings", batch.errors.data[0].message)
        # An endpoint no route serves is refused when the batch is created.
        with self.assertRaises(BadRequestError) as refused:
            self.client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
        self.assertIn("no route serves it", str(refused.exception))

    def test_errors_are_openai_error_objects_and_answers_carry_request_ids(self):
        with self.assertRaises(NotFoundError) as missing:
            self.client.files.retrieve("file-nope")
        error = missing.exception
        self.assertEqual((error.code, error.type, error.param), ("not_found", "invalid_request_error", None))
        self.assertIn("file-nope", error.message)
        self.assertTrue(error.request_id, "the error names its request id")
        with self.assertRaises(BadRequestError) as bad:
            self.client.batches.create(input_file_id="file-nope", endpoint="/v1/nowhere", completion_window="24h")
        self.assertEqual(bad.exception.code, "bad_request")
        uploaded = self.client.files.create(file=("one.jsonl", jsonl([embedding_line(0)])), purpose="batch")
        self.assertTrue(uploaded._request_id, "every answer carries x-request-id")
        self.assertTrue(self.client.files.retrieve(uploaded.id)._request_id)
        self.assertTrue(self.client.batches.list(limit=1)._request_id)


if __name__ == "__main__":
    unittest.main(verbosity=2)
