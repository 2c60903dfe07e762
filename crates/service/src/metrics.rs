//! Counters, gauges and histograms, rendered in the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counters by one or two label values.
#[derive(Debug, Default)]
pub struct Counters(Mutex<BTreeMap<Vec<String>, u64>>);

impl Counters {
    pub fn add(&self, labels: &[&str]) {
        self.add_n(labels, 1);
    }

    pub fn add_n(&self, labels: &[&str], n: u64) {
        let key = labels.iter().map(|s| (*s).to_owned()).collect();
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default() += n;
    }

    /// A series at zero until its first event, so that `increase(...)` sees that one too
    /// (a series born at 1 has no increase to show).
    pub fn touch(&self, labels: &[&str]) {
        self.add_n(labels, 0);
    }

    pub fn get(&self, labels: &[&str]) -> u64 {
        let key: Vec<String> = labels.iter().map(|s| (*s).to_owned()).collect();
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied()
            .unwrap_or(0)
    }

    fn render(&self, out: &mut String, name: &str, help: &str, label_names: &[&str]) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (values, n) in self.0.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let labels: Vec<String> = label_names
                .iter()
                .zip(values)
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {n}");
            } else {
                let _ = writeln!(out, "{name}{{{}}} {n}", labels.join(","));
            }
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    state: Mutex<(Vec<u64>, u64, f64)>, // per-bucket counts, total count, sum
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            state: Mutex::new((vec![0; bounds.len()], 0, 0.0)),
        }
    }

    pub fn observe(&self, d: Duration) {
        let v = d.as_secs_f64();
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for (i, b) in self.bounds.iter().enumerate() {
            if v <= *b {
                s.0[i] += 1;
            }
        }
        s.1 += 1;
        s.2 += v;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(out, name, "");
    }

    /// The series' lines; `labels` (`route="/v1/execute",`) go before `le`.
    fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for (b, n) in self.bounds.iter().zip(&s.0) {
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{b}\"}} {n}");
        }
        let plain = labels.trim_end_matches(',');
        let braces = if plain.is_empty() {
            String::new()
        } else {
            format!("{{{plain}}}")
        };
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}le=\"+Inf\"}} {}\n{name}_sum{braces} {}\n{name}_count{braces} {}",
            s.1, s.2, s.1
        );
    }
}

/// Histograms by one label's value (made on first use).
#[derive(Debug)]
pub struct Histograms {
    bounds: &'static [f64],
    by: Mutex<BTreeMap<String, std::sync::Arc<Histogram>>>,
}

impl Histograms {
    fn new(bounds: &'static [f64]) -> Self {
        Histograms {
            bounds,
            by: Mutex::default(),
        }
    }

    pub fn observe(&self, label: &str, d: Duration) {
        let h = self
            .by
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(label.to_owned())
            .or_insert_with(|| std::sync::Arc::new(Histogram::new(self.bounds)))
            .clone();
        h.observe(d);
    }

    fn render(&self, out: &mut String, name: &str, help: &str, label_name: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let by = self.by.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (value, h) in by {
            h.render_series(out, name, &format!("{label_name}=\"{}\",", escape(&value)));
        }
    }
}

const DURATION_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
const REQUEST_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const START_BOUNDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// Security events, by kind.
pub mod event {
    pub const AUTH_FAILURE: &str = "auth_failure";
    pub const REJECTED_INPUT: &str = "rejected_input";
    pub const SECCOMP_KILL: &str = "seccomp_kill";
    pub const MEMORY_KILL: &str = "memory_kill";
    pub const TIMEOUT: &str = "timeout";
    pub const OUTPUT_TRUNCATED: &str = "output_truncated";
    pub const FOREIGN_HOST: &str = "foreign_host";
    pub const FOREIGN_ORIGIN: &str = "foreign_origin";
    pub const SMUGGLING: &str = "smuggling";
    /// The connection cap was reached and an idle connection was closed for a new one.
    pub const CONNECTION_EVICTED: &str = "connection_evicted";
    /// Every connection was busy with a request: a new one was refused.
    pub const CONNECTION_REFUSED: &str = "connection_refused";
    /// A client took an answer more slowly than `http.answer_min_bytes_per_second`: its
    /// connection was closed and the answer's memory freed.
    pub const SLOW_READER: &str = "slow_reader";
    /// An answer did not fit in its key's (or everyone's) memory budget: a 429 or 503 went
    /// in its place.
    pub const ANSWER_OVER_BUDGET: &str = "answer_over_budget";

    /// Every kind: their series exist at zero from the start.
    pub const ALL: &[&str] = &[
        AUTH_FAILURE,
        REJECTED_INPUT,
        SECCOMP_KILL,
        MEMORY_KILL,
        TIMEOUT,
        OUTPUT_TRUNCATED,
        FOREIGN_HOST,
        FOREIGN_ORIGIN,
        SMUGGLING,
        CONNECTION_EVICTED,
        CONNECTION_REFUSED,
        SLOW_READER,
        ANSWER_OVER_BUDGET,
    ];
}

#[derive(Debug)]
pub struct Metrics {
    pub executions: Counters,
    pub execution_seconds: Histogram,
    pub sandbox_start_seconds: Histogram,
    pub sandbox_made_seconds: Histogram,
    /// Time from a request's arrival to its answer's head, by route.
    pub http_request_seconds: Histograms,
    pub queue_depth: Gauge,
    pub running: Gauge,
    pub connections: Gauge,
    pub security_events: Counters,
    pub http_requests: Counters,
    pub evaluations: Counters,
    pub evaluations_waiting: Gauge,
    pub pickle_scans: Counters,
    /// Steps of tool calls' approvals, by outcome (docs/approvals.md).
    pub tool_approvals: Counters,
    pub tool_calls: Counters,
    pub tool_call_seconds: Histogram,
    pub egress_connections: Counters,
    pub egress_bytes: Counters,
    pub credential_requests: Counters,
    /// Spans sent to the OTLP collector (`[telemetry]`).
    pub telemetry_spans_exported: Counters,
    /// Spans dropped: the queue was full (`queue_full`), or their batch was not taken
    /// (`export_failed`).
    pub telemetry_spans_dropped: Counters,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Metrics {
            executions: Counters::default(),
            execution_seconds: Histogram::new(DURATION_BOUNDS),
            sandbox_start_seconds: Histogram::new(START_BOUNDS),
            sandbox_made_seconds: Histogram::new(START_BOUNDS),
            http_request_seconds: Histograms::new(REQUEST_BOUNDS),
            queue_depth: Gauge::default(),
            running: Gauge::default(),
            connections: Gauge::default(),
            security_events: Counters::default(),
            http_requests: Counters::default(),
            evaluations: Counters::default(),
            evaluations_waiting: Gauge::default(),
            pickle_scans: Counters::default(),
            tool_approvals: Counters::default(),
            tool_calls: Counters::default(),
            tool_call_seconds: Histogram::new(DURATION_BOUNDS),
            egress_connections: Counters::default(),
            egress_bytes: Counters::default(),
            credential_requests: Counters::default(),
            telemetry_spans_exported: Counters::default(),
            telemetry_spans_dropped: Counters::default(),
        };
        // The series an alert or a dashboard watches exist before their first event.
        for kind in event::ALL {
            m.security_events.touch(&[kind]);
        }
        for status in airlock_api::Status::ALL {
            m.executions.touch(&[status.as_str()]);
        }
        for verdict in ["safe", "unsafe", "malformed"] {
            m.pickle_scans.touch(&[verdict]);
        }
        m.evaluations.touch(&["ok"]);
        m.telemetry_spans_exported.touch(&[]);
        for reason in ["queue_full", "export_failed"] {
            m.telemetry_spans_dropped.touch(&[reason]);
        }
        m
    }
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP airlock_build_info The running build: its version.\n# TYPE airlock_build_info gauge\nairlock_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        self.executions.render(
            &mut out,
            "airlock_executions_total",
            "Executions by status.",
            &["status"],
        );
        self.execution_seconds.render(
            &mut out,
            "airlock_execution_duration_seconds",
            "Wall time of executions.",
        );
        self.sandbox_start_seconds.render(
            &mut out,
            "airlock_sandbox_start_duration_seconds",
            "Time until an execution's sandbox was ready: built and confined, or taken from the warm pool.",
        );
        self.sandbox_made_seconds.render(
            &mut out,
            "airlock_sandbox_made_duration_seconds",
            "The same, for executions that found no pooled sandbox: a zygote's child made on the spot, or a cold start.",
        );
        for (name, help, g) in [
            (
                "airlock_queue_depth",
                "Executions waiting for a slot.",
                &self.queue_depth,
            ),
            (
                "airlock_running_sandboxes",
                "Executions running now.",
                &self.running,
            ),
            (
                "airlock_open_connections",
                "Open HTTP connections.",
                &self.connections,
            ),
            (
                "airlock_evaluations_waiting",
                "Expressions waiting for a turn to be evaluated (eval.max_running).",
                &self.evaluations_waiting,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                g.get()
            );
        }
        self.security_events.render(
            &mut out,
            "airlock_security_events_total",
            "Security-relevant events by kind.",
            &["kind"],
        );
        self.http_requests.render(
            &mut out,
            "airlock_http_requests_total",
            "HTTP requests by route and status code.",
            &["route", "code"],
        );
        self.http_request_seconds.render(
            &mut out,
            "airlock_http_request_duration_seconds",
            "Time from a request's arrival until its answer was ready to send, by route.",
            "route",
        );
        self.evaluations.render(
            &mut out,
            "airlock_evaluations_total",
            "Expressions evaluated by POST /v1/eval, by outcome (ok, or the error's type).",
            &["outcome"],
        );
        self.pickle_scans.render(
            &mut out,
            "airlock_pickle_scans_total",
            "Files scanned by POST /v1/pickle/scan, by verdict.",
            &["verdict"],
        );
        self.tool_approvals.render(
            &mut out,
            "airlock_tool_approvals_total",
            "Steps of tool calls that wait for an approval, by outcome (requested, approved, denied, timed_out, withdrawn).",
            &["outcome"],
        );
        self.tool_calls.render(
            &mut out,
            "airlock_tool_calls_total",
            "Calls from sandboxed code to the operator's tools, by server, tool and outcome (ok, error, denied, limit, cancelled).",
            &["server", "tool", "outcome"],
        );
        self.tool_call_seconds.render(
            &mut out,
            "airlock_tool_call_duration_seconds",
            "Time from a tool call's frame to its answer.",
        );
        self.egress_connections.render(
            &mut out,
            "airlock_egress_connections_total",
            "Connections through the egress proxy, by outcome (allowed, denied, failed) and reason.",
            &["outcome", "reason"],
        );
        self.egress_bytes.render(
            &mut out,
            "airlock_egress_bytes_total",
            "Bytes relayed by the egress proxy, by direction (out: from the sandbox).",
            &["direction"],
        );
        self.credential_requests.render(
            &mut out,
            "airlock_credential_requests_total",
            "Requests the egress proxy set a credential on, by credential and the answer's status class (none: no answer).",
            &["credential", "status"],
        );
        self.telemetry_spans_exported.render(
            &mut out,
            "airlock_telemetry_spans_exported_total",
            "Spans the OTLP collector took ([telemetry]).",
            &[],
        );
        self.telemetry_spans_dropped.render(
            &mut out,
            "airlock_telemetry_spans_dropped_total",
            "Spans dropped rather than wait: the queue was full (queue_full), or the collector did not take their batch in time (export_failed).",
            &["reason"],
        );
        out
    }
}

/// The tool servers' states, in Prometheus text.
pub fn render_tools(statuses: &[airlock_tools::SourceStatus]) -> String {
    let mut out = String::from(
        "# HELP airlock_tool_server_up Whether a tool server is started and listed its tools.
         # TYPE airlock_tool_server_up gauge
",
    );
    for s in statuses {
        let up = u8::from(s.state == airlock_tools::SourceState::Ready);
        let _ = writeln!(
            out,
            "airlock_tool_server_up{{server=\"{}\"}} {up}",
            escape(&s.name)
        );
    }
    out.push_str(
        "# HELP airlock_tool_server_restarts_total Times a tool server was started again.
         # TYPE airlock_tool_server_restarts_total counter
",
    );
    for s in statuses {
        let _ = writeln!(
            out,
            "airlock_tool_server_restarts_total{{server=\"{}\"}} {}",
            escape(&s.name),
            s.restarts
        );
    }
    out
}

/// The pools of environments in demand, by the environment's hash.
pub fn render_environment_pools(pools: &[(String, airlock_engine::PoolStatus)]) -> String {
    let mut out = String::new();
    type Read = fn(&airlock_engine::PoolStatus) -> u64;
    let series: [(&str, &str, &str, Read); 2] = [
        (
            "airlock_environment_pool_idle_sandboxes",
            "gauge",
            "Sandboxes of an environment ready and waiting.",
            |s| s.idle as u64,
        ),
        (
            "airlock_environment_pool_takes_total",
            "counter",
            "Executions naming an environment that got a pooled sandbox.",
            |s| s.takes,
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (hash, status) in pools {
            let _ = writeln!(out, "{name}{{hash=\"{hash}\"}} {}", value(status));
        }
    }
    out
}

/// Unlabelled series, each with its help and type, in Prometheus text.
fn write_plain(out: &mut String, series: &[(&str, &str, &str, u64)]) {
    for (name, kind, help, value) in series {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
}

/// The pool of the preloading zygote's children (zeros when there is none).
pub fn render_preloaded_pool(status: &airlock_engine::PoolStatus) -> String {
    let mut out = String::new();
    write_plain(
        &mut out,
        &[
        (
            "airlock_pool_preloaded_idle_sandboxes",
            "gauge",
            "Children of the preloading zygote ready and waiting.",
            status.idle as u64,
        ),
        (
            "airlock_pool_preloaded_takes_total",
            "counter",
            "Executions naming a preloaded package that got a pooled child of the preloading zygote.",
            status.takes,
        ),
        (
            "airlock_pool_preloaded_misses_total",
            "counter",
            "Executions naming a preloaded package that found no such child ready.",
            status.misses_empty,
        ),
        ],
    );
    out
}

/// The warm pool's state (zeros when there is none) and background clean-up failures, in
/// Prometheus text.
pub fn render_pool(status: &airlock_engine::PoolStatus) -> String {
    let mut out = String::new();
    write_plain(
        &mut out,
        &[
            (
                "airlock_pool_idle_sandboxes",
                "gauge",
                "Pooled sandboxes ready and waiting.",
                status.idle as u64,
            ),
            (
                "airlock_pool_in_use_sandboxes",
                "gauge",
                "Pooled sandboxes running an execution now.",
                status.in_use,
            ),
            (
                "airlock_pool_target_sandboxes",
                "gauge",
                "What the pool fills up to now (between pool.size and pool.max_size).",
                status.target as u64,
            ),
            (
                "airlock_pool_takes_total",
                "counter",
                "Executions that got a pooled sandbox.",
                status.takes,
            ),
            (
                "airlock_pool_waits_total",
                "counter",
                "Executions that found the pool empty and got the sandbox a refill was making.",
                status.waits,
            ),
            (
                "airlock_pool_refills_total",
                "counter",
                "Sandboxes added to the pool.",
                status.refills,
            ),
            (
                "airlock_pool_failures_total",
                "counter",
                "Pooled sandboxes that failed to start or were found dead.",
                status.failures,
            ),
        ],
    );
    let name = "airlock_cgroup_cleanup_failures_total";
    let _ = writeln!(
        out,
        "# HELP {name} Emptied sandbox cgroups the background removal could not remove (swept at the next start).\n# TYPE {name} counter\n{name} {}",
        airlock_sandbox::cleanup_failures()
    );
    let name = "airlock_pool_misses_total";
    let _ = writeln!(
        out,
        "# HELP {name} Executions that started a sandbox cold: the pool was empty, or their limits differ from the pool's.\n# TYPE {name} counter\n{name}{{reason=\"empty\"}} {}\n{name}{{reason=\"limits\"}} {}",
        status.misses_empty, status.misses_limits
    );
    out
}

/// The zygotes' state (zeros when there are none), in Prometheus text.
pub fn render_zygotes(status: &airlock_engine::ZygoteStatus) -> String {
    let mut out = String::new();
    write_plain(
        &mut out,
        &[
            (
                "airlock_zygotes_ready",
                "gauge",
                "Zygotes ready to make sandboxes.",
                status.ready as u64,
            ),
            (
                "airlock_zygote_children",
                "gauge",
                "Sandboxes alive now that are zygote children.",
                status.children as u64,
            ),
            (
                "airlock_zygote_children_total",
                "counter",
                "Sandboxes made as zygote children.",
                status.spawned,
            ),
            (
                "airlock_zygote_starts_total",
                "counter",
                "Zygotes started (first, replacing a dead one, or recycling).",
                status.starts,
            ),
            (
                "airlock_zygote_failures_total",
                "counter",
                "Zygotes that failed to start.",
                status.failures,
            ),
        ],
    );
    let name = "airlock_cold_starts_total";
    let _ = writeln!(
        out,
        "# HELP {name} Sandboxes started cold (their own interpreter) instead of from a zygote, by reason.\n# TYPE {name} counter"
    );
    for reason in COLD_REASONS {
        let n = status.cold.get(reason).copied().unwrap_or(0);
        let _ = writeln!(out, "{name}{{reason=\"{reason}\"}} {n}");
    }
    out
}

/// Every reason a sandbox starts cold (see `airlock_engine::zygotes`), exported from the start.
const COLD_REASONS: [&str; 14] = [
    "disabled",
    "unavailable",
    "egress",
    "seccomp_downgraded",
    "tools",
    "other_program",
    "zygote_starting",
    "zygote_restarting",
    "zygote_failed",
    "too_many_zygotes",
    "zygote_refused",
    "descriptors",
    "child_lost",
    "closed",
];

/// The `process_*` metrics every Prometheus client library exports, read from `/proc/self`
/// (a value that cannot be read is left out).
pub fn render_process() -> String {
    let mut out = String::new();
    let mut gauge = |name: &str, kind: &str, help: &str, value: Option<f64>| {
        if let Some(v) = value {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    };
    // /proc/<pid>/stat counts in USER_HZ, which Linux fixes at 100 for userspace.
    const TICKS: f64 = 100.0;
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command's name, which may hold spaces and parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // Counted from field 3 (state): utime is field 14, stime 15, starttime 22.
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    let cpu = field(14).zip(field(15)).map(|(u, s)| (u + s) / TICKS);
    gauge(
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time spent, in seconds.",
        cpu,
    );
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status.lines().find_map(|l| {
            let v = l.strip_prefix(key)?.trim().strip_suffix("kB")?;
            v.trim().parse::<f64>().ok().map(|k| k * 1024.0)
        })
    };
    gauge(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        kib("VmRSS:"),
    );
    gauge(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        kib("VmSize:"),
    );
    let fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as f64);
    gauge(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        fds,
    );
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let max_fds = limits.lines().find_map(|l| {
        let rest = l.strip_prefix("Max open files")?;
        rest.split_whitespace().next()?.parse::<f64>().ok()
    });
    gauge(
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors.",
        max_fds,
    );
    let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())
    });
    let start = boot.zip(field(22)).map(|(b, ticks)| b + ticks / TICKS);
    gauge(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since the Unix epoch, in seconds.",
        start,
    );
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn process_metrics_are_this_process_s() {
        let text = super::render_process();
        let value = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(
            started <= now + 1.0 && started > now - 86_400.0 * 30.0,
            "{started}"
        );
        assert!(value("process_cpu_seconds_total") >= 0.0);
    }

    #[test]
    fn watched_series_exist_at_zero_before_their_first_event() {
        let m = super::Metrics::default();
        let text = m.render();
        assert!(text.contains("airlock_security_events_total{kind=\"foreign_host\"} 0\n"));
        assert!(text.contains("airlock_executions_total{status=\"policy_violation\"} 0\n"));
        assert!(text.contains("airlock_build_info{version=\""));
        m.http_request_seconds
            .observe("/v1/execute", std::time::Duration::from_millis(3));
        let text = m.render();
        assert!(
            text.contains("airlock_http_request_duration_seconds_bucket{route=\"/v1/execute\",le=\"0.005\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("airlock_http_request_duration_seconds_count{route=\"/v1/execute\"} 1\n")
        );
    }

    use super::*;

    #[test]
    fn the_example_alert_rules_use_only_metrics_that_exist() {
        let rules = include_str!("../../../deploy/prometheus/alerts.yml");
        let exported =
            Metrics::default().render() + &render_pool(&airlock_engine::PoolStatus::default());
        let mut checked = 0;
        for (i, _) in rules.match_indices("airlock_") {
            let name: String = rules[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let name = name.trim_end_matches("_bucket");
            assert!(
                exported.contains(&format!("# TYPE {name} ")),
                "alerts.yml uses {name}, which airlock does not export"
            );
            checked += 1;
        }
        assert!(checked >= 7, "{checked}");
        for kind in [
            event::SECCOMP_KILL,
            event::AUTH_FAILURE,
            event::FOREIGN_HOST,
            event::FOREIGN_ORIGIN,
            event::SMUGGLING,
            event::CONNECTION_EVICTED,
            event::CONNECTION_REFUSED,
        ] {
            assert!(rules.contains(kind), "{kind}");
        }
    }

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.executions.add(&["ok"]);
        m.executions.add(&["ok"]);
        m.http_requests.add(&["/v1/execute", "200"]);
        m.execution_seconds.observe(Duration::from_millis(30));
        m.running.inc();
        let text = m.render();
        assert!(
            text.contains("airlock_executions_total{status=\"ok\"} 2"),
            "{text}"
        );
        assert!(text.contains("airlock_http_requests_total{route=\"/v1/execute\",code=\"200\"} 1"));
        assert!(text.contains("airlock_execution_duration_seconds_bucket{le=\"0.05\"} 1"));
        assert!(text.contains("airlock_execution_duration_seconds_bucket{le=\"0.025\"} 0"));
        assert!(text.contains("airlock_execution_duration_seconds_count 1"));
        assert!(text.contains("airlock_running_sandboxes 1"));
    }
}
