//! Spans on their way to the collector: a bounded queue that never waits, and one thread that
//! sends them in batches with OTLP over HTTP (protobuf), each batch within a deadline.
//!
//! The SDK's `BatchSpanProcessor` also bounds its queue, but does not say how many it dropped;
//! here a span that finds the queue full is counted (`airlock_telemetry_spans_dropped_total`),
//! and so is each span of a batch the collector did not take in time.

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use crate::config::TelemetryConfig;
use crate::metrics::Metrics;

/// Where spans are handed over. Pushing never blocks.
#[derive(Debug)]
pub struct Queue {
    tx: SyncSender<SpanData>,
    metrics: Arc<Metrics>,
}

impl Queue {
    pub fn push(&self, span: SpanData) {
        match self.tx.try_send(span) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.metrics.telemetry_spans_dropped.add(&["queue_full"]);
            }
        }
    }
}

/// The queue, and the thread that empties it into an OTLP exporter for `config`'s endpoint
/// (the thread ends once the queue is dropped and emptied).
pub fn start(
    config: &TelemetryConfig,
    resource: Resource,
    metrics: Arc<Metrics>,
) -> Result<Queue, String> {
    let url = config
        .traces_url()
        .ok_or("telemetry.otlp_endpoint is not a URL")?;
    let timeout = Duration::from_millis(config.export_timeout_ms);
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(timeout)
        // A batch is tried once: the next one is on its way, and retrying would hold it back.
        .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
        .build()
        .map_err(|e| format!("the OTLP exporter: {e}"))?;
    exporter.set_resource(&resource);
    let (tx, rx) = std::sync::mpsc::sync_channel(config.max_queued_spans);
    let batch = Batching {
        max: config.max_batch_spans,
        interval: Duration::from_millis(config.batch_interval_ms),
        timeout,
    };
    let counted = metrics.clone();
    std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || send(rx, exporter, batch, &counted))
        .map_err(|e| format!("cannot start the OTLP exporter's thread: {e}"))?;
    Ok(Queue { tx, metrics })
}

struct Batching {
    max: usize,
    interval: Duration,
    timeout: Duration,
}

/// The exporter's thread: a batch is what came within `interval` of its first span (or
/// `max` spans), sent within `timeout`.
fn send(
    rx: Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
    batch: Batching,
    metrics: &Metrics,
) {
    // reqwest's client needs a runtime; this thread's own, never the server's.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "traces: no runtime for the OTLP exporter; spans are dropped");
            for _ in rx {
                metrics.telemetry_spans_dropped.add(&["export_failed"]);
            }
            return;
        }
    };
    let mut failing = false;
    while let Ok(first) = rx.recv() {
        let mut spans = Vec::with_capacity(batch.max.min(64));
        spans.push(first);
        let until = Instant::now() + batch.interval;
        while spans.len() < batch.max {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(span) => spans.push(span),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        let n = spans.len() as u64;
        let sent = runtime
            .block_on(async { tokio::time::timeout(batch.timeout, exporter.export(spans)).await });
        match sent {
            Ok(Ok(())) => {
                metrics.telemetry_spans_exported.add_n(&[], n);
                if std::mem::take(&mut failing) {
                    tracing::info!("traces: the OTLP collector takes spans again");
                }
            }
            Ok(Err(e)) => {
                metrics.telemetry_spans_dropped.add_n(&["export_failed"], n);
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(error = %e, "traces: the OTLP collector did not take a batch; its spans are dropped (counted) until it does");
                }
            }
            Err(_) => {
                metrics.telemetry_spans_dropped.add_n(&["export_failed"], n);
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(
                        timeout_ms = batch.timeout.as_millis() as u64,
                        "traces: the OTLP collector did not answer in time; spans are dropped (counted) until it does"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endpoint nothing listens on (a port just closed).
    fn closed_port() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    }

    fn span() -> SpanData {
        use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId};
        let now = std::time::SystemTime::now();
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes([1; 16]),
                SpanId::from_bytes([1; 8]),
                TraceFlags::SAMPLED,
                false,
                Default::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "test".into(),
            start_time: now,
            end_time: now,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_never_waits() {
        let metrics = Arc::new(Metrics::default());
        // Nothing empties this queue: its thread is never started.
        let (tx, _rx) = std::sync::mpsc::sync_channel(3);
        let queue = Queue {
            tx,
            metrics: metrics.clone(),
        };
        let started = Instant::now();
        for _ in 0..10 {
            queue.push(span());
        }
        assert!(started.elapsed() < Duration::from_millis(100));
        assert_eq!(metrics.telemetry_spans_dropped.get(&["queue_full"]), 7);
    }

    #[test]
    fn spans_for_a_collector_that_is_down_are_dropped_and_counted() {
        let metrics = Arc::new(Metrics::default());
        let config = TelemetryConfig {
            otlp_endpoint: Some(closed_port()),
            batch_interval_ms: 10,
            ..TelemetryConfig::default()
        };
        let queue = start(&config, Resource::builder_empty().build(), metrics.clone()).unwrap();
        for _ in 0..5 {
            queue.push(span());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while metrics.telemetry_spans_dropped.get(&["export_failed"]) < 5 {
            assert!(
                Instant::now() < deadline,
                "the failed batch was not counted"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(metrics.telemetry_spans_exported.get(&[]), 0);
    }
}
