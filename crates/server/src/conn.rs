//! Accepting connections, with the bounds `axum::serve` does not offer: a request header must arrive whole
//! within a time (a slowly sent header, or a kept-alive connection left idle, is closed), and at most so many
//! connections are open at once (past that, a new one is answered 503 at once and closed, so that idle or slow
//! connections cannot take every descriptor and hold off the clients that would send a request).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWrite;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::ServeError;

pub struct Limits {
    pub header_timeout: Duration,
    pub max_connections: usize,
}

/// Connections past the limit being answered 503 at once; past these too, they are closed unanswered, so
/// that a flood of connections costs a bounded number of tasks.
const REFUSING: usize = 64;

/// How long a refused connection is given to take its 503 before it is closed.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// Serves `router` on every connection `listener` accepts, until the process stops.
pub async fn accept(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
) -> Result<(), ServeError> {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let refusing = Arc::new(Semaphore::new(REFUSING));
    let mut http = http1::Builder::new();
    // hyper's header timer starts when the connection starts waiting for a request, not at its first byte,
    // so it closes idle kept-alive connections as well as slow headers.
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // A connection that went away before it was accepted concerns only itself; anything else
                // (out of descriptors, of memory) is the process's, and retrying at once would spin.
                if !is_connection_error(&e) {
                    tracing::error!("accepting a connection: {e}; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                continue;
            }
        };
        // A streamed answer is many small writes: without TCP_NODELAY each waits for the client's delayed ACK
        // (Nagle), about 40 ms a token on Linux.
        let _ = tcp.set_nodelay(true);
        match open.clone().try_acquire_owned() {
            Ok(permit) => {
                let conn = http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router.clone()));
                let metrics = metrics.clone();
                metrics.connections_open.fetch_add(1, Relaxed);
                tokio::spawn(async move {
                    // Errors are the client's doing (it left, sent garbage, took too long): nothing to report
                    // but at debug level, as an idle kept-alive connection closed by the header timer is one.
                    if let Err(e) = conn.await {
                        tracing::debug!("connection closed: {e}");
                    }
                    metrics.connections_open.fetch_sub(1, Relaxed);
                    drop(permit);
                });
            }
            Err(_) => {
                metrics.connections_refused.fetch_add(1, Relaxed);
                if let Ok(permit) = refusing.clone().try_acquire_owned() {
                    tokio::spawn(refuse(tcp, limits.max_connections, permit));
                }
            }
        }
    }
}

/// Answers a connection past the limit with a 503 (without reading its request), then closes it.
async fn refuse(mut tcp: TcpStream, limit: usize, _permit: OwnedSemaphorePermit) {
    let body = ApiError::unavailable(format!(
        "the server has {limit} connections open, its limit (--max-connections); retry shortly"
    ))
    .body()
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // (By hand: the workspace's tokio is built without its io-util extension traits.)
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        let mut rest = answer.as_bytes();
        while !rest.is_empty() {
            tcp.writable().await?;
            match tcp.try_write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut tcp).poll_shutdown(cx)).await?;
        // Closing a socket with unread bytes resets the connection, which can destroy the answer before the
        // client reads it: what the client sent is read and dropped until it closes (or the linger ends).
        let mut sink = [0u8; 4096];
        loop {
            tcp.readable().await?;
            match tcp.try_read(&mut sink) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await;
}

/// Errors of accept(2) that concern the one connection being accepted (as hyper and axum classify them).
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}
