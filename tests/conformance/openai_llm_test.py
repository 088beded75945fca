"""The official OpenAI Python SDK against tiergate's LLM doors: chat streamed and whole,
completions with a prompt list, the Responses API streamed and whole, embeddings, a
Batch API file of chat lines through `client.files` and `client.batches`, an error in
the middle of a stream raised as `APIError`, and `_request_id`.

Run by tests/peers/openai.rs, which starts the simulator's LLMs and a gateway with a
chat route (model "llama": real time, micro-batch and offline), a route whose backend
it makes fail mid-stream (model "faulty", its simulator at FAULTS), and an embeddings
route (model "m"), and passes the addresses:

    python openai_llm_test.py GATEWAY FAULTS

The simulator's prompt tokens are the words of the prompt (at least one); it generates
exactly `max_tokens` tokens, one word each.
"""

import io
import json
import sys
import time
import unittest
import urllib.request

from openai import APIError, OpenAI

ADDR, FAULTS = sys.argv.pop(1), sys.argv.pop(1)
MESSAGES = [{"role": "user", "content": "what does the gateway do"}]


def jsonl(lines):
    return io.BytesIO("\n".join(json.dumps(line) for line in lines).encode())


class LlmDoors(unittest.TestCase):
    def setUp(self):
        self.client = OpenAI(base_url=f"http://{ADDR}/v1", api_key="not-used", max_retries=0)

    def test_chat_whole(self):
        answer = self.client.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=7)
        self.assertEqual(answer.object, "chat.completion")
        self.assertEqual(len(answer.choices[0].message.content.split()), 7)
        self.assertEqual(answer.usage.completion_tokens, 7)
        self.assertEqual(answer.usage.prompt_tokens, 5)
        self.assertEqual(answer.service_tier, "default", "real time, said as OpenAI says it")
        self.assertTrue(answer._request_id, "x-request-id, as the SDK reads it")

    def test_chat_streamed_without_and_with_usage(self):
        chunks = list(self.client.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=6, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(len(text.split()), 6)
        self.assertTrue(all(c.usage is None for c in chunks), "no usage chunk unless asked")
        chunks = list(
            self.client.chat.completions.create(
                model="llama", messages=MESSAGES, max_tokens=3, stream=True, stream_options={"include_usage": True}
            )
        )
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual((chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens), (5, 3))

    def test_streams_come_token_by_token(self):
        stream = self.client.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=40, stream=True)
        arrivals = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic())
        self.assertEqual(len(arrivals), 40)
        # The simulator's steps take 2 ms: forty tokens over tens of milliseconds, the
        # first long before the last (a stream held to its end would bring them at once).
        self.assertGreater(arrivals[-1] - arrivals[0], 0.03)

    def test_completions_with_a_prompt_list(self):
        answer = self.client.completions.create(model="llama", prompt=["one two", "three four five"], max_tokens=4)
        self.assertEqual([c.index for c in answer.choices], [0, 1])
        self.assertTrue(all(len(c.text.split()) == 4 for c in answer.choices))
        self.assertEqual((answer.usage.prompt_tokens, answer.usage.completion_tokens), (5, 8))

    def test_responses_whole_and_streamed(self):
        answer = self.client.responses.create(model="llama", input="say something", max_output_tokens=5)
        self.assertEqual(answer.status, "completed")
        self.assertEqual(len(answer.output_text.split()), 5)
        self.assertEqual((answer.usage.input_tokens, answer.usage.output_tokens), (2, 5))
        events = list(self.client.responses.create(model="llama", input="say something", max_output_tokens=4, stream=True))
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        self.assertEqual(len("".join(deltas).split()), 4)
        self.assertEqual(events[-1].type, "response.completed")
        self.assertEqual(events[-1].response.usage.output_tokens, 4)

    def test_embeddings(self):
        answer = self.client.embeddings.create(model="m", input=["ab", "abc"])
        self.assertEqual([len(d.embedding) for d in answer.data], [2, 2])
        self.assertEqual(answer.data[1].embedding[0], 3.0)

    def test_an_unknown_model_is_model_not_found(self):
        with self.assertRaises(Exception) as raised:
            self.client.chat.completions.create(model="nope", messages=MESSAGES)
        self.assertEqual(raised.exception.status_code, 404)
        self.assertEqual(raised.exception.code, "model_not_found")

    def test_an_error_mid_stream_is_raised(self):
        faults = urllib.request.Request(
            f"http://{FAULTS}/sim/faults",
            data=json.dumps({"malformed_after_tokens": 2}).encode(),
            headers={"content-type": "application/json"},
        )
        urllib.request.urlopen(faults).read()
        stream = self.client.chat.completions.create(model="faulty", messages=MESSAGES, max_tokens=20, stream=True)
        seen = []
        with self.assertRaises(APIError) as raised:
            for chunk in stream:
                seen.extend(c.delta.content for c in chunk.choices if c.delta.content)
        self.assertEqual(len(seen), 2, "the tokens before the fault came through")
        self.assertIn("malformed_event", str(raised.exception.body))

    def test_a_batch_of_chat_lines(self):
        lines = [
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "llama", "messages": MESSAGES, "max_tokens": 3},
            }
            for i in range(12)
        ]
        uploaded = self.client.files.create(file=("chats.jsonl", jsonl(lines)), purpose="batch")
        batch = self.client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 60
        while batch.status not in ("completed", "failed"):
            self.assertLess(time.monotonic(), deadline, f"batch stuck in {batch.status}")
            time.sleep(0.05)
            batch = self.client.batches.retrieve(batch.id)
        self.assertEqual(batch.status, "completed", batch.errors)
        self.assertEqual(batch.request_counts.completed, 12)
        self.assertEqual((batch.usage.input_tokens, batch.usage.output_tokens), (60, 36))
        out = self.client.files.content(batch.output_file_id).text.splitlines()
        answers = {json.loads(l)["custom_id"]: json.loads(l)["response"]["body"] for l in out}
        self.assertEqual(sorted(answers), sorted(f"c{i}" for i in range(12)))
        for answer in answers.values():
            self.assertEqual(answer["usage"]["completion_tokens"], 3)
            self.assertEqual(answer["object"], "chat.completion")


if __name__ == "__main__":
    unittest.main(verbosity=2)
