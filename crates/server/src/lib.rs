//! `titan serve`: an OpenAI-compatible server. Requests become sequences of one engine, batched together
//! step by step (continuous batching); the HTTP side only parses, queues and streams.

pub mod template;
