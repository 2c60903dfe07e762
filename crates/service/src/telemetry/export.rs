//! Spans on their way to the collector: a bounded queue that never waits, and one thread that
//! sends them in batches with OTLP over HTTP (protobuf), each batch within a deadline.
//!
//! The SDK's `BatchSpanProcessor` also bounds its queue, but does not say how many it dropped;
//! here a span that finds the queue full is counted (`airlock_telemetry_spans_dropped_total`),
//! and so is each span of a batch the collector did not take in time. At shutdown the queue
//! is flushed, within a deadline of its own: the spans of the last requests are not lost.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use crate::config::TelemetryConfig;
use crate::metrics::Metrics;

/// What the exporter's thread is handed: a span, or a request to send what it holds now and
/// say so (everything queued before it included: the queue is in order).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // nearly every message is a span: boxing would allocate for each
enum Message {
    Span(SpanData),
    Flush(Sender<()>),
}

/// Where spans are handed over. Pushing never blocks.
#[derive(Debug)]
pub struct Queue {
    tx: SyncSender<Message>,
    metrics: Arc<Metrics>,
}

impl Queue {
    pub fn push(&self, span: SpanData) {
        match self.tx.try_send(Message::Span(span)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.metrics.telemetry_spans_dropped.add(&["queue_full"]);
            }
        }
    }

    /// Blocks until every span pushed so far has been sent (or its batch failed, counted), or
    /// `within` has passed; whether they were. For shutdown: a collector that does not answer
    /// holds it up no longer than `within`.
    pub fn flush(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let (ack, acked) = std::sync::mpsc::channel();
        let mut message = Message::Flush(ack);
        loop {
            match self.tx.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    message = back;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => return false,
            }
        }
        acked
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
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
/// `max` spans, or up to a flush), sent within `timeout`.
fn send(
    rx: Receiver<Message>,
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
            for message in rx {
                match message {
                    Message::Span(_) => metrics.telemetry_spans_dropped.add(&["export_failed"]),
                    Message::Flush(ack) => {
                        let _ = ack.send(());
                    }
                }
            }
            return;
        }
    };
    let mut failing = false;
    while let Ok(first) = rx.recv() {
        let mut spans = Vec::with_capacity(batch.max.min(64));
        let mut flushed = None;
        match first {
            Message::Span(span) => spans.push(span),
            Message::Flush(ack) => flushed = Some(ack),
        }
        let until = Instant::now() + batch.interval;
        while flushed.is_none() && spans.len() < batch.max {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Message::Span(span)) => spans.push(span),
                Ok(Message::Flush(ack)) => flushed = Some(ack),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        if spans.is_empty() {
            if let Some(ack) = flushed {
                let _ = ack.send(());
            }
            continue;
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
        // The one flushing may have stopped waiting: nobody to tell is fine.
        if let Some(ack) = flushed {
            let _ = ack.send(());
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

    /// A queue to a collector that is down, batching every `interval_ms`, with five spans
    /// pushed.
    fn five_spans_for_nobody(interval_ms: u64, metrics: &Arc<Metrics>) -> Queue {
        let config = TelemetryConfig {
            otlp_endpoint: Some(closed_port()),
            batch_interval_ms: interval_ms,
            ..TelemetryConfig::default()
        };
        let queue = start(&config, Resource::builder_empty().build(), metrics.clone()).unwrap();
        for _ in 0..5 {
            queue.push(span());
        }
        queue
    }

    #[test]
    fn spans_for_a_collector_that_is_down_are_dropped_and_counted() {
        let metrics = Arc::new(Metrics::default());
        let _queue = five_spans_for_nobody(10, &metrics);
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

    #[test]
    fn a_flush_sends_the_batch_being_gathered_and_gives_up_at_its_deadline() {
        let metrics = Arc::new(Metrics::default());
        // A batch would wait a minute for more spans; the flush sends it now.
        let queue = five_spans_for_nobody(60_000, &metrics);
        assert!(queue.flush(Duration::from_secs(30)));
        // Sent (and, nobody listening, counted as dropped) before the flush returned.
        assert_eq!(metrics.telemetry_spans_dropped.get(&["export_failed"]), 5);
        assert!(queue.flush(Duration::from_secs(30)), "nothing left to send");

        // Nothing empties this one: the flush cannot even be queued, and says so.
        let (tx, _rx) = std::sync::mpsc::sync_channel(1);
        let stuck = Queue { tx, metrics };
        stuck.push(span());
        assert!(!stuck.flush(Duration::from_millis(50)));
    }
}
