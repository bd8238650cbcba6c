//! [`Collector`]: binds the OTLP/gRPC and OTLP/HTTP listeners and serves both until
//! cancelled, then stops accepting and lets in-flight requests finish (bounded by
//! `drain_timeout`). Both run on the shared connection loop
//! (`stallwatch_storage::listen`: header read and idle timeouts, HTTP/2 keepalive PINGs, a
//! connection cap and lifetime, TCP_NODELAY on every accepted socket: without it a gRPC
//! server shows a fixed ~43 ms p99 at concurrency 1, Nagle + delayed ACK).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use stallwatch_storage::control::Observation;
use stallwatch_storage::listen::{self, ListenLimits, ListenerStats};
use stallwatch_storage::Storage;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::CollectorConfig;
use crate::error::CollectorError;
use crate::grpc::GrpcService;
use crate::http::http_app;
use crate::ingest::IngestState;
use crate::stats::IngestStats;

/// The running OTLP receiver: both listeners bound, not yet serving.
pub struct Collector {
    state: IngestState,
    grpc: TcpListener,
    http: TcpListener,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    drain_timeout: Duration,
    limits: ListenLimits,
    grpc_stats: Arc<ListenerStats>,
    http_stats: Arc<ListenerStats>,
}

async fn bind_one(
    addr: SocketAddr,
    transport: &'static str,
) -> Result<TcpListener, CollectorError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| CollectorError::Bind {
            transport,
            addr,
            source,
        })
}

impl Collector {
    /// Validates `config` and binds both listeners (port 0 picks a free port).
    /// Observations of committed spans and logs go to `observer` (bounded; ingest waits
    /// when it is full).
    ///
    /// Errors: [`CollectorError::Config`], [`CollectorError::Bind`].
    pub async fn bind(
        config: CollectorConfig,
        storage: Storage,
        observer: mpsc::Sender<Observation>,
    ) -> Result<Collector, CollectorError> {
        let state = IngestState::new(&config, storage, observer)?;
        let grpc = bind_one(config.grpc_listen, "grpc").await?;
        let http = bind_one(config.http_listen, "http").await?;
        let local = |l: &TcpListener, transport, addr| {
            l.local_addr().map_err(|source| CollectorError::Bind {
                transport,
                addr,
                source,
            })
        };
        let grpc_addr = local(&grpc, "grpc", config.grpc_listen)?;
        let http_addr = local(&http, "http", config.http_listen)?;
        Ok(Collector {
            state,
            grpc,
            http,
            grpc_addr,
            http_addr,
            drain_timeout: config.drain_timeout,
            limits: config.listen,
            grpc_stats: ListenerStats::new("otlp_grpc"),
            http_stats: ListenerStats::new("otlp_http"),
        })
    }

    /// The bound OTLP/gRPC address (the real port when 0 was asked).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bound OTLP/HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The ingest counters; implements [`stallwatch_storage::MetricsSource`] for `/metrics`.
    pub fn stats(&self) -> Arc<IngestStats> {
        self.state.stats()
    }

    /// The connection counters of the OTLP/gRPC and OTLP/HTTP listeners, for
    /// [`stallwatch_storage::listen::ListenerMetrics`].
    pub fn listener_stats(&self) -> [Arc<ListenerStats>; 2] {
        [self.grpc_stats.clone(), self.http_stats.clone()]
    }

    /// The shared ingest state (for [`crate::http_app`] in tests).
    pub fn state(&self) -> IngestState {
        self.state.clone()
    }

    /// Serves both transports until `shutdown` is cancelled, then stops accepting, lets
    /// in-flight requests finish (up to `drain_timeout`) and returns.
    ///
    /// Errors: [`CollectorError::Serve`] when a server fails while serving.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), CollectorError> {
        // HTTP/1.1 reaches the gRPC service only to be answered with a readable 4xx naming
        // the OTLP/HTTP address (a common exporter misconfiguration got a raw HTTP/2
        // SETTINGS frame).
        let grpc_service = GrpcService::new(self.state.clone(), self.http_addr);
        let grpc_service = tower::ServiceBuilder::new()
            .map_request(|r: http::Request<listen::RequestBody>| r.map(tonic::body::Body::new))
            .service(grpc_service);
        let grpc = listen::serve(
            self.grpc,
            grpc_service,
            self.limits,
            self.grpc_stats.clone(),
            shutdown.clone(),
        );
        let http = listen::serve(
            self.http,
            http_app(self.state.clone()),
            self.limits,
            self.http_stats.clone(),
            shutdown.clone(),
        );
        // Request bodies still arriving get a short pause limit from now on (ingest.rs,
        // `STOPPING_BODY_IDLE`), so a client that stalled mid-body cannot hold the drain.
        let stopping = {
            let state = self.state.clone();
            let shutdown = shutdown.clone();
            async move {
                shutdown.cancelled().await;
                state.inner.stopping.cancel();
            }
        };
        let both = async {
            tokio::join!(grpc, http, stopping);
            Ok(())
        };
        let deadline = async {
            shutdown.cancelled().await;
            tokio::time::sleep(self.drain_timeout).await;
        };
        tokio::select! {
            r = both => r,
            () = deadline => {
                tracing::warn!(drain_timeout_ms = self.drain_timeout.as_millis() as u64,
                    "OTLP drain deadline passed; closing remaining connections");
                Ok(())
            }
        }
    }
}
