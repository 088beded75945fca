"""Writes a tiny random-weight llama model as GGUF for llama.cpp's server, without
downloading one: `gguf_model.py OUT.gguf`.

Its vocabulary is SentencePiece's byte fallback alone (`<unk>`, `<s>`, `</s>` and the 256
byte tokens `<0x00>`..`<0xFF>`), so every byte of a prompt is one token and token counts
are exact. The output head is zero for every token but the printable ASCII bytes, so a
greedy answer (temperature 0) is printable text, one byte (and one stream chunk) a token.
Embedding 512, 8 blocks, feed-forward 1536, 8 heads over 4 KV heads, F32: about 100 MB,
written in under a second, a token in about 9 ms on one core.
"""

import sys

import numpy as np
from gguf import GGUFWriter

N_EMBD, N_BLOCKS, N_FF, N_HEAD, N_HEAD_KV, N_CTX = 512, 8, 1536, 8, 4, 4096
HEAD = N_EMBD // N_HEAD

TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
# SentencePiece token types: unknown, control, and byte.
TYPES = [2, 3, 3] + [6] * 256
PRINTABLE = [3 + b for b in range(0x20, 0x7F)]

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def main(path: str) -> None:
    rng = np.random.default_rng(7)

    def weights(*shape: int) -> np.ndarray:
        # numpy's shape is ggml's reversed: (out, in) for a matrix.
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = GGUFWriter(path, "llama")
    w.add_name("tiergate-tiny")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_BLOCKS)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HEAD)
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * len(TOKENS))
    w.add_token_types(TYPES)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(TEMPLATE)

    w.add_tensor("token_embd.weight", weights(len(TOKENS), N_EMBD))
    for i in range(N_BLOCKS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", weights(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_k.weight", weights(N_HEAD_KV * HEAD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_v.weight", weights(N_HEAD_KV * HEAD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_output.weight", weights(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weights(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weights(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weights(N_EMBD, N_FF))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    head = np.zeros((len(TOKENS), N_EMBD), dtype=np.float32)
    head[PRINTABLE] = rng.standard_normal((len(PRINTABLE), N_EMBD)).astype(np.float32)
    w.add_tensor("output.weight", head)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])
