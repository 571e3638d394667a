//! `titan serve`: an OpenAI-compatible server. Requests become sequences of one engine, batched together
//! step by step (continuous batching); the HTTP side only parses, queues and streams.

pub mod api;
pub mod error;
mod http;
mod metrics;
mod scheduler;
pub mod template;

use std::sync::Arc;

use anyhow::{Context, Result};
use titan_engine::Model;

pub use scheduler::SchedulerOptions;
use template::ChatTemplate;

pub struct ServeOptions {
    pub listen: String,
    pub api_key: Option<String>,
    /// The model id clients name.
    pub name: String,
    /// A chat template overriding the model's (`--chat-template`).
    pub chat_template: Option<String>,
    pub scheduler: SchedulerOptions,
    /// Requests that may wait for a slot before new ones get 429.
    pub queue_len: usize,
    pub body_limit: usize,
}

/// Serves `model` until the process is stopped; prints `listening on ADDR` once it accepts connections.
pub fn serve(model: Model, opts: ServeOptions) -> Result<()> {
    let source = opts.chat_template.clone().or_else(|| {
        model
            .weights
            .file
            .get_str("tokenizer.chat_template")
            .ok()
            .flatten()
            .map(str::to_owned)
    });
    let token = |id: Option<u32>| {
        id.and_then(|t| model.tokenizer.token_bytes(t))
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    let template = match source {
        Some(s) => Some(
            ChatTemplate::new(&s, &token(model.tokenizer.bos()), &token(model.tokenizer.eos()))
                .context("the chat template")?,
        ),
        None => {
            eprintln!("warning: the model has no chat template: /v1/chat/completions will answer 400 (give one with --chat-template FILE)");
            None
        }
    };
    let model = Arc::new(model);
    let metrics = Arc::new(metrics::Metrics::default());
    let ctx_size = opts.scheduler.ctx_size;
    let queue = scheduler::start(model.clone(), opts.scheduler, opts.queue_len, metrics.clone());
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let state = Arc::new(http::AppState {
        model,
        name: opts.name,
        template,
        queue,
        queue_len: opts.queue_len,
        metrics,
        api_key: opts.api_key,
        ctx_size,
        body_limit: opts.body_limit,
        created,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&opts.listen)
            .await
            .with_context(|| format!("listening on {}", opts.listen))?;
        println!("listening on {}", listener.local_addr()?);
        // A streamed answer is many small writes: without TCP_NODELAY each waits for the client's delayed ACK
        // (Nagle), about 40 ms a token on Linux.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, http::router(state)).await.context("serving HTTP")
    })
}
