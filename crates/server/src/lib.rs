//! `titan serve`: an OpenAI-compatible server. Requests become sequences of one engine, batched together
//! step by step (continuous batching); the HTTP side only parses, queues and streams.

pub mod api;
pub mod error;
mod http;
mod metrics;
mod scheduler;
pub mod template;

use std::io;
use std::sync::Arc;

use titan_engine::Model;

pub use scheduler::SchedulerOptions;
use template::{ChatTemplate, TemplateError};

/// Why the server did not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The chat template (the one given, or the model's) is not valid Jinja.
    #[error("the chat template does not parse: {0}")]
    Template(#[from] TemplateError),
    /// The operating system refused the engine's thread.
    #[error("the engine thread does not start: {0}")]
    EngineThread(#[source] io::Error),
    /// The operating system refused the HTTP side's runtime (its threads, its event queue).
    #[error("the HTTP runtime does not start: {0}")]
    Runtime(#[source] io::Error),
    /// The address does not resolve, is taken, or is not this machine's.
    #[error("listening on {addr}: {source}")]
    Listen { addr: String, source: io::Error },
    /// Accepting connections failed after the server had started.
    #[error("the HTTP server stopped: {0}")]
    Http(#[source] io::Error),
}

pub struct ServeOptions {
    pub listen: String,
    pub api_key: Option<String>,
    /// The model id clients name.
    pub name: String,
    /// A chat template overriding the model's.
    pub chat_template: Option<String>,
    pub scheduler: SchedulerOptions,
    /// Requests that may wait for a slot before new ones get 429.
    pub queue_len: usize,
    pub body_limit: usize,
}

/// A duration as the log gives it: milliseconds to a tenth, as a small model answers in less than one.
fn ms(d: std::time::Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// Serves `model` until the process is stopped; prints `listening on ADDR` once it accepts connections.
pub fn serve(model: Model, opts: ServeOptions) -> Result<(), ServeError> {
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
        Some(s) => Some(ChatTemplate::new(
            &s,
            &token(model.tokenizer.bos()),
            &token(model.tokenizer.eos()),
        )?),
        None => {
            tracing::warn!("the model has no chat template and none was given: /v1/chat/completions will answer 400");
            None
        }
    };
    let model = Arc::new(model);
    let metrics = Arc::new(metrics::Metrics::default());
    let ctx_size = opts.scheduler.ctx_size;
    let queue = scheduler::start(model.clone(), opts.scheduler, opts.queue_len, metrics.clone())
        .map_err(ServeError::EngineThread)?;
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
        .map_err(ServeError::Runtime)?;
    rt.block_on(async move {
        let listen = |source| ServeError::Listen {
            addr: opts.listen.clone(),
            source,
        };
        let listener = tokio::net::TcpListener::bind(&opts.listen).await.map_err(listen)?;
        println!("listening on {}", listener.local_addr().map_err(listen)?);
        // A streamed answer is many small writes: without TCP_NODELAY each waits for the client's delayed ACK
        // (Nagle), about 40 ms a token on Linux.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, http::router(state))
            .await
            .map_err(ServeError::Http)
    })
}
