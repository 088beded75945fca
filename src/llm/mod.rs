//! What the gateway reads of LLM traffic, beside the tensors of [`crate::protocol`]: a
//! stream's server-sent events ([`sse`]) and OpenAI's API ([`openai`]: what a request
//! asks, its usage, the events a relay writes itself). A leaf module: it knows nothing
//! of servers, and treats every body and event as untrusted.

pub mod openai;
pub mod sse;
pub mod tokens;
