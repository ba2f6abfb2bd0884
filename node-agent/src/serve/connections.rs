//! Accepting connections: at most `--max-connections` open at once on a listener (more wait in
//! the kernel's backlog), and each must send a request's headers within `--header-timeout-seconds`
//! (an idle keep-alive connection included), so clients that connect and stall cannot hold the
//! agent's sockets or tasks. On shutdown the listener stops accepting and the open connections
//! finish the requests they have. The gRPC listener speaks HTTP/2, whose connections carry at
//! most [`MAX_STREAMS`] requests at once and are pinged when idle, so a peer that vanished is
//! dropped.

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulConnection, GracefulShutdown};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How many connections a listener holds and how long one may take to send its headers.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Requests one HTTP/2 connection carries at once.
pub const MAX_STREAMS: u32 = 256;

/// What a listener speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1: the REST protocol, metrics and reports.
    Http1,
    /// HTTP/2 without TLS: gRPC.
    Http2,
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets the open connections
/// finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    protocol: Protocol,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(64 << 10)
        .keep_alive_interval(Some(limits.header_timeout))
        .keep_alive_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, or the peer gave up: wait a little, go on.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Responses go out as written: HTTP/2 writes headers and data separately, and Nagle's
        // algorithm would hold the second behind the client's delayed ACK (40 ms a call).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY could not be set");
        }
        let service = TowerToHyperService::new(router.clone());
        let io = TokioIo::new(stream);
        match protocol {
            Protocol::Http1 => spawn(&graceful, http1.serve_connection(io, service), slot),
            Protocol::Http2 => spawn(&graceful, http2.serve_connection(io, service), slot),
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Runs one connection, holding its slot until it ends.
fn spawn<C>(graceful: &GracefulShutdown, connection: C, slot: tokio::sync::OwnedSemaphorePermit)
where
    C: GracefulConnection + Send + 'static,
    C::Error: std::fmt::Display + Send,
{
    let connection = graceful.watch(connection);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "a connection ended with an error");
        }
        drop(slot);
    });
}
