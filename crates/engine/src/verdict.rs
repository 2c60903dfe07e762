//! Turns what the kernel reported (exit, signal, cgroup counters, the host's own kills) and the
//! program's response into one status, and that into the result every surface answers with
//! (`Verdict::into_result`, for executions and cells alike). The response can only ever
//! supply `result` and `error`; it can never turn a kill, a limit or a non-zero exit into
//! anything else.

use airlock_api::{
    ErrorInfo, ExecutionResult, Isolation, LimitKind, Limits, Output, OutputFile, Status, Usage,
    OUTPUT_TYPES,
};
use airlock_sandbox::{Exit, KillReason, Outcome};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use crate::paths::check_relative_path;
use crate::pump::{decode_output, Streams};

/// What the runner sends back: exactly one of the two.
#[derive(Debug, PartialEq)]
pub(crate) enum Response {
    Result(Value),
    Error(ErrorInfo),
}

/// The runner's answer: the result or the error, and the rich outputs made on the way.
#[derive(Debug, PartialEq)]
pub(crate) struct Reply {
    pub answer: Response,
    pub outputs: Vec<Output>,
    pub files: Vec<OutputFile>,
}

/// The answer as it travels: `{"result": ...}` or `{"error": ...}`, with `outputs` or not.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    #[serde(default, deserialize_with = "present")]
    result: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    error: Option<ErrorInfo>,
    #[serde(default)]
    outputs: Vec<Output>,
    #[serde(default)]
    files: Vec<OutputFile>,
}

/// [`Some`] for a field that is there, `null` included.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

const MAX_OUTPUTS: usize = 1000;
const MAX_FILES: usize = 101;

const MAX_TYPE: usize = 256;
/// Error kinds airlock itself reports; a response claiming one is forged.
pub(crate) const RESERVED_KINDS: [&str; 2] = ["ResultError", "SandboxError"];
const MAX_MESSAGE: usize = 8 * 1024;
const MAX_TRACEBACK: usize = 64 * 1024;

/// Parses the program's response as untrusted data: bounded size (the pump capped it) and
/// bounded depth (serde_json refuses nesting past 128 levels).
pub(crate) fn parse_response(
    bytes: &[u8],
    overflow: bool,
    limit: u64,
) -> Result<Option<Reply>, String> {
    if overflow {
        return Err(format!("the response is larger than {limit} bytes"));
    }
    if bytes.is_empty() {
        return Ok(None);
    }
    let wire: Wire =
        serde_json::from_slice(bytes).map_err(|e| format!("the response is not valid: {e}"))?;
    let mut response = match (wire.result, wire.error) {
        (Some(v), None) => Response::Result(v),
        (None, Some(e)) => Response::Error(e),
        _ => return Err("the response is not valid: not one of result and error".into()),
    };
    if wire.outputs.len() > MAX_OUTPUTS {
        return Err(format!("the response has more than {MAX_OUTPUTS} outputs"));
    }
    for o in &wire.outputs {
        let text = o.data.is_string();
        if !OUTPUT_TYPES.contains(&o.mime.as_str()) || (o.mime != "application/json" && !text) {
            return Err(format!(
                "the response has an invalid output of type {:?}",
                o.mime
            ));
        }
    }
    if wire.files.len() > MAX_FILES {
        return Err(format!("the response has more than {MAX_FILES} files"));
    }
    for f in &wire.files {
        check_file(f).map_err(|why| format!("the response has an invalid file: {why}"))?;
    }
    if let Response::Error(e) = &response {
        if RESERVED_KINDS.contains(&e.kind.as_str()) {
            // Only airlock makes these; an exception's own type is never a bare one of them.
            return Err(format!(
                "the response used the reserved error type {}",
                e.kind
            ));
        }
    }
    if let Response::Error(e) = &mut response {
        cap(&mut e.kind, MAX_TYPE);
        cap(&mut e.message, MAX_MESSAGE);
        if let Some(tb) = &mut e.traceback {
            cap(tb, MAX_TRACEBACK);
        }
    }
    Ok(Some(Reply {
        answer: response,
        outputs: wire.outputs,
        files: wire.files,
    }))
}

/// A returned file: a relative path of plain components, and either contents (base64 of
/// exactly `size` bytes) or the reason it was skipped.
fn check_file(f: &OutputFile) -> Result<(), String> {
    check_relative_path(&f.path)?;
    match (&f.base64, &f.skipped) {
        (Some(data), None) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|e| format!("{:?}: {e}", f.path))?;
            if bytes.len() as u64 != f.size {
                return Err(format!("{:?}: the size does not match", f.path));
            }
            Ok(())
        }
        (None, Some(why)) if why.len() <= 64 => Ok(()),
        _ => Err(format!("{:?}: neither contents nor a reason", f.path)),
    }
}

fn cap(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

#[derive(Debug, PartialEq)]
pub(crate) struct Verdict {
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub result: Option<Value>,
    pub error: Option<ErrorInfo>,
    pub outputs: Vec<Output>,
    pub files: Vec<OutputFile>,
    pub limits_hit: Vec<LimitKind>,
}

impl Verdict {
    /// A sandbox that could not be built: airlock's error, nothing of the program's.
    pub(crate) fn setup_failed(message: String) -> Verdict {
        Verdict {
            status: Status::InternalError,
            exit_code: None,
            signal: None,
            result: None,
            error: Some(ErrorInfo {
                kind: "SandboxError".into(),
                message,
                traceback: None,
            }),
            outputs: Vec::new(),
            files: Vec::new(),
            limits_hit: Vec::new(),
        }
    }

    /// A session's cell answered and the sandbox lives on: its answer, parsed, is its verdict
    /// (`limits_hit`: what the host saw it reach meanwhile). A cell collects no files.
    pub(crate) fn answered(
        response: Result<Option<Reply>, String>,
        limits_hit: Vec<LimitKind>,
    ) -> Verdict {
        let mut v = Verdict {
            status: Status::Error,
            exit_code: None,
            signal: None,
            result: None,
            error: None,
            outputs: Vec::new(),
            files: Vec::new(),
            limits_hit,
        };
        match response {
            Ok(Some(reply)) => {
                v.outputs = reply.outputs;
                match reply.answer {
                    Response::Result(r) => (v.status, v.result) = (Status::Ok, Some(r)),
                    Response::Error(e) => v.error = Some(e),
                }
            }
            Ok(None) => v.error = Some(result_error("no answer".into())),
            Err(why) => v.error = Some(result_error(why)),
        }
        v
    }

    /// The result of an execution or a cell: this verdict, what the program wrote (as it was
    /// kept), what it used, the limits it ran under and the isolation it had.
    pub(crate) fn into_result(
        self,
        streams: Streams,
        usage: Usage,
        limits: Limits,
        isolation: Isolation,
    ) -> ExecutionResult {
        let Streams { stdout, stderr } = streams;
        let (stdout_truncated, stderr_truncated) = (stdout.truncated, stderr.truncated);
        ExecutionResult {
            status: self.status,
            exit_code: self.exit_code,
            signal: self.signal,
            stdout: decode_output(stdout.data, stdout_truncated),
            stderr: decode_output(stderr.data, stderr_truncated),
            stdout_truncated,
            stderr_truncated,
            result: self.result,
            error: self.error,
            outputs: self.outputs,
            files: self.files,
            usage,
            limits,
            limits_hit: self.limits_hit,
            isolation,
        }
    }
}

/// The error of an answer that could not be taken (airlock's own kind, never the code's).
pub(crate) fn result_error(message: String) -> ErrorInfo {
    ErrorInfo {
        kind: "ResultError".into(),
        message,
        traceback: None,
    }
}

/// How far under the CPU limit the program's reported time may be for a SIGXCPU to be the
/// kernel's (see `cpu_reached`): on a busy host the reported times have read 34 ms under a
/// 1 s limit the kernel had counted to (CI, with a build beside the tests).
const CPU_SLACK: std::time::Duration = std::time::Duration::from_millis(100);

pub(crate) fn verdict(
    outcome: &Outcome,
    response: Result<Option<Reply>, String>,
    limits: &Limits,
    output_truncated: bool,
) -> Verdict {
    let cpu_limit = std::time::Duration::from_millis(limits.cpu_ms);
    // Kernel counts only: the cgroup's total, or the program's own from wait4.
    let used = outcome.usage.cpu.max(outcome.usage.program_cpu);
    let cpu_exhausted = used.is_some_and(|used| used >= cpu_limit);
    // wait4's user and system times are the scheduler's runtime split by tick samples, and
    // can read a few milliseconds under the runtime RLIMIT_CPU is checked against.
    let cpu_reached = used.is_some_and(|used| used + CPU_SLACK >= cpu_limit);
    let (exit_code, signal) = match outcome.exit {
        Some(Exit::Code(c)) => (Some(c), None),
        Some(Exit::Signal(s)) => (None, Some(s)),
        None => (None, None),
    };
    let status = match (outcome.killed, outcome.exit) {
        (Some(KillReason::WallTime), _) => Status::Timeout,
        (Some(KillReason::CpuTime), _) => Status::CpuLimit,
        (Some(KillReason::Cancelled), _) => Status::InternalError,
        (Some(KillReason::Protocol), _) => Status::PolicyViolation,
        (None, Some(Exit::Signal(libc::SIGSYS))) => Status::PolicyViolation,
        // The kernel sends SIGXCPU at RLIMIT_CPU, which is at least the limit: a SIGXCPU with
        // clearly less CPU used was sent by the program itself.
        (None, Some(Exit::Signal(libc::SIGXCPU))) if cpu_reached => Status::CpuLimit,
        (None, Some(Exit::Signal(libc::SIGKILL))) if outcome.oom_kills > 0 => Status::MemoryLimit,
        // RLIMIT_CPU's hard limit, for a program that handled SIGXCPU.
        (None, Some(Exit::Signal(libc::SIGKILL))) if cpu_exhausted => Status::CpuLimit,
        (None, Some(Exit::Signal(_))) => Status::Crashed,
        (None, Some(Exit::Code(0))) if response.is_err() => Status::Error,
        (None, Some(Exit::Code(0))) => Status::Ok,
        (None, Some(Exit::Code(_))) => Status::Error,
        // The sandbox's own init died before reporting: only the OOM killer does that.
        (None, None) if outcome.oom_kills > 0 => Status::MemoryLimit,
        (None, None) => Status::InternalError,
    };

    let (mut result, mut error, mut outputs, mut files) = (None, None, Vec::new(), Vec::new());
    let response = response.map(|reply| {
        reply.map(|r| {
            if matches!(status, Status::Ok | Status::Error) {
                outputs = r.outputs;
                files = r.files;
            }
            r.answer
        })
    });
    match response {
        Ok(Some(Response::Result(v))) if status == Status::Ok => result = Some(v),
        Ok(Some(Response::Error(e))) if status == Status::Error => error = Some(e),
        Err(why) if status == Status::Error => error = Some(result_error(why)),
        _ => {}
    }
    if status == Status::InternalError && error.is_none() {
        let message = match outcome.killed {
            Some(KillReason::Cancelled) => "the execution was cancelled",
            _ => "the sandbox ended without reporting how the program ended",
        };
        error = Some(ErrorInfo {
            kind: "SandboxError".into(),
            message: message.into(),
            traceback: None,
        });
    }

    let mut limits_hit = Vec::new();
    if outcome.killed == Some(KillReason::WallTime) {
        limits_hit.push(LimitKind::WallTime);
    }
    if status == Status::CpuLimit || cpu_exhausted {
        limits_hit.push(LimitKind::CpuTime);
    }
    if outcome.oom_kills > 0 {
        limits_hit.push(LimitKind::Memory);
    }
    if outcome.pids_limit_hits > 0 {
        limits_hit.push(LimitKind::Pids);
    }
    if output_truncated {
        limits_hit.push(LimitKind::Output);
    }
    limits_hit.sort();
    limits_hit.dedup();
    Verdict {
        status,
        exit_code,
        signal,
        result,
        error,
        outputs,
        files,
        limits_hit,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use airlock_sandbox::{Isolation, LandlockReport, LandlockState, Usage};
    use serde_json::json;

    use super::*;

    fn outcome(exit: Option<Exit>, killed: Option<KillReason>, oom: u64) -> Outcome {
        Outcome {
            exit,
            killed,
            oom_kills: oom,
            pids_limit_hits: 0,
            usage: Usage {
                wall: Duration::from_millis(5),
                cpu: Some(Duration::from_millis(3)),
                program_cpu: Some(Duration::from_millis(2)),
                memory_peak_bytes: None,
            },
            isolation: Isolation {
                namespaces: vec![],
                uid: 1000,
                gid: 1000,
                seccomp: true,
                landlock: LandlockReport {
                    state: LandlockState::FullyEnforced,
                    abi: Some(6),
                },
                cgroup: None,
                no_new_privs: true,
                capabilities_dropped: true,
                downgraded: vec![],
            },
            ready_after: None,
        }
    }

    fn limits() -> Limits {
        Limits {
            timeout_ms: 1000,
            memory_mb: 64,
            cpu_ms: 1000,
            pids: 8,
            disk_mb: 8,
            output_bytes: 100,
        }
    }

    fn reply(answer: Response) -> Result<Option<Reply>, String> {
        Ok(Some(Reply {
            answer,
            outputs: Vec::new(),
            files: Vec::new(),
        }))
    }

    fn result(v: Value) -> Result<Option<Reply>, String> {
        reply(Response::Result(v))
    }

    #[test]
    fn a_response_cannot_override_the_kernel() {
        // A program that wrote a perfect result, then was killed at the deadline.
        let v = verdict(
            &outcome(None, Some(KillReason::WallTime), 0),
            result(json!(1)),
            &limits(),
            false,
        );
        assert_eq!(v.status, Status::Timeout);
        assert_eq!(v.result, None);
        assert_eq!(v.limits_hit, vec![LimitKind::WallTime]);
        // A result with a non-zero exit is not a success.
        let v = verdict(
            &outcome(Some(Exit::Code(3)), None, 0),
            result(json!(1)),
            &limits(),
            false,
        );
        assert_eq!(
            (v.status, v.exit_code, v.result),
            (Status::Error, Some(3), None)
        );
    }

    #[test]
    fn signals_map_to_their_statuses() {
        let cases = [
            (Exit::Signal(libc::SIGSYS), 0, Status::PolicyViolation),
            // 3 ms of CPU against a 1 s limit: the program sent SIGXCPU to itself.
            (Exit::Signal(libc::SIGXCPU), 0, Status::Crashed),
            (Exit::Signal(libc::SIGKILL), 1, Status::MemoryLimit),
            (Exit::Signal(libc::SIGKILL), 0, Status::Crashed),
            (Exit::Signal(libc::SIGSEGV), 0, Status::Crashed),
        ];
        for (exit, oom, want) in cases {
            let v = verdict(&outcome(Some(exit), None, oom), Ok(None), &limits(), false);
            assert_eq!(v.status, want, "{exit:?} oom={oom}");
            assert!(v.signal.is_some() && v.exit_code.is_none());
        }
    }

    #[test]
    fn sigxcpu_counts_as_the_cpu_limit_only_when_the_cpu_was_used() {
        let mut o = outcome(Some(Exit::Signal(libc::SIGXCPU)), None, 0);
        o.usage.program_cpu = Some(Duration::from_millis(1000));
        let v = verdict(&o, Ok(None), &limits(), false);
        assert_eq!(
            (v.status, v.limits_hit),
            (Status::CpuLimit, vec![LimitKind::CpuTime])
        );
        o.usage.cpu = None; // without cgroups, the program's own count decides
        assert_eq!(
            verdict(&o, Ok(None), &limits(), false).status,
            Status::CpuLimit
        );
        // wait4 may read under the runtime the kernel checked (998 ms seen here, 966 ms on a
        // busy host).
        for ms in [998, 966] {
            o.usage.program_cpu = Some(Duration::from_millis(ms));
            assert_eq!(
                verdict(&o, Ok(None), &limits(), false).status,
                Status::CpuLimit,
                "{ms} ms"
            );
        }
        o.usage.program_cpu = Some(Duration::from_millis(10));
        assert_eq!(
            verdict(&o, Ok(None), &limits(), false).status,
            Status::Crashed
        );
    }

    #[test]
    fn oom_of_a_child_is_reported_without_failing_the_program() {
        let v = verdict(
            &outcome(Some(Exit::Code(0)), None, 1),
            result(json!(null)),
            &limits(),
            false,
        );
        assert_eq!(v.status, Status::Ok);
        assert_eq!(v.limits_hit, vec![LimitKind::Memory]);
    }

    #[test]
    fn exceptions_and_bad_responses() {
        let err = ErrorInfo {
            kind: "ValueError".into(),
            message: "m".into(),
            traceback: Some("tb".into()),
        };
        let v = verdict(
            &outcome(Some(Exit::Code(1)), None, 0),
            reply(Response::Error(err.clone())),
            &limits(),
            false,
        );
        assert_eq!((v.status, v.error), (Status::Error, Some(err)));
        let v = verdict(
            &outcome(Some(Exit::Code(0)), None, 0),
            Err("garbage".into()),
            &limits(),
            true,
        );
        assert_eq!(v.status, Status::Error);
        assert_eq!(v.error.unwrap().kind, "ResultError");
        assert_eq!(v.limits_hit, vec![LimitKind::Output]);
        // No response at all (os._exit(0)): fine, no result.
        let v = verdict(
            &outcome(Some(Exit::Code(0)), None, 0),
            Ok(None),
            &limits(),
            false,
        );
        assert_eq!((v.status, v.result), (Status::Ok, None));
    }

    #[test]
    fn responses_are_parsed_strictly() {
        assert_eq!(parse_response(b"", false, 10), Ok(None));
        assert!(parse_response(b"{\"result\": 1}", true, 10)
            .unwrap_err()
            .contains("larger than 10"));
        assert!(parse_response(b"{\"result\": 1, \"extra\": 2}", false, 99).is_err());
        assert!(parse_response(b"{\"result\": NaN}", false, 99).is_err());
        assert!(parse_response(b"{\"result\": 1}{\"result\": 2}", false, 99).is_err());
        let forged = br#"{"error": {"type": "ResultError", "message": "m", "traceback": null}}"#;
        assert!(parse_response(forged, false, 999)
            .unwrap_err()
            .contains("reserved"));
        let own =
            br#"{"error": {"type": "__main__.ResultError", "message": "m", "traceback": null}}"#;
        assert!(parse_response(own, false, 999).is_ok());
        // Exactly one of result and error; outputs of known types, text where text is due.
        assert!(parse_response(b"{}", false, 99).is_err());
        assert!(parse_response(br#"{"result": 1, "error": null}"#, false, 99).is_err());
        let r = parse_response(br#"{"result": null}"#, false, 99)
            .unwrap()
            .unwrap();
        assert_eq!(r.answer, Response::Result(Value::Null));
        let ok = br#"{"result": 1, "outputs": [{"type": "image/png", "data": "iVBO"},
                     {"type": "application/json", "data": {"a": [1]}}]}"#;
        assert_eq!(
            parse_response(ok, false, 999)
                .unwrap()
                .unwrap()
                .outputs
                .len(),
            2
        );
        for bad in [
            r#"{"result": 1, "outputs": [{"type": "text/javascript", "data": "x"}]}"#,
            r#"{"result": 1, "outputs": [{"type": "image/png", "data": 1}]}"#,
            r#"{"result": 1, "outputs": [{"type": "text/plain", "data": "x", "extra": 1}]}"#,
            r#"{"result": 1, "files": [{"path": "../x", "size": 1, "base64": "eA=="}]}"#,
            r#"{"result": 1, "files": [{"path": "/etc/x", "size": 1, "base64": "eA=="}]}"#,
            r#"{"result": 1, "files": [{"path": "x", "size": 2, "base64": "eA=="}]}"#,
            r#"{"result": 1, "files": [{"path": "x", "size": 1, "base64": "!!"}]}"#,
            r#"{"result": 1, "files": [{"path": "x", "size": 1}]}"#,
        ] {
            assert!(parse_response(bad.as_bytes(), false, 999).is_err(), "{bad}");
        }
        let deep = format!("{{\"result\": {}{}}}", "[".repeat(200), "]".repeat(200));
        assert!(parse_response(deep.as_bytes(), false, 1 << 20).is_err());
        let long = format!(
            "{{\"error\": {{\"type\": \"E\", \"message\": \"{}\", \"traceback\": null}}}}",
            "x".repeat(20000)
        );
        match parse_response(long.as_bytes(), false, 1 << 20).unwrap() {
            Some(Reply {
                answer: Response::Error(e),
                ..
            }) => assert_eq!(e.message.len(), MAX_MESSAGE),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn executions_and_cells_make_their_results_alike() {
        // What the program wrote, as kept: a character cut by the limit is dropped.
        let mut streams = Streams::default();
        streams.stdout.data = "a\u{20ac}".as_bytes()[..3].to_vec();
        streams.stdout.truncated = true;
        streams.stderr.data = b"err".to_vec();
        let iso = crate::isolation::reported(&outcome(Some(Exit::Code(0)), None, 0).isolation);
        let usage = airlock_api::Usage {
            wall_ms: 5,
            ..airlock_api::Usage::default()
        };
        let answered = Verdict::answered(result(json!(7)), vec![LimitKind::Output]);
        let r = answered.into_result(streams, usage.clone(), limits(), iso.clone());
        assert_eq!((r.status, r.result), (Status::Ok, Some(json!(7))));
        assert_eq!((r.stdout, r.stdout_truncated), ("a".into(), true));
        assert_eq!((r.stderr, r.stderr_truncated), ("err".into(), false));
        assert_eq!(r.limits_hit, [LimitKind::Output]);
        assert_eq!((r.usage, r.limits, r.isolation), (usage, limits(), iso));

        // A cell's answer that is none, or not one, is airlock's `ResultError`; a sandbox that
        // could not be built is its `SandboxError`, with nothing of a program's.
        let none = Verdict::answered(Ok(None), Vec::new());
        assert_eq!(none.status, Status::Error);
        assert_eq!(none.error.map(|e| e.kind).as_deref(), Some("ResultError"));
        let bad = Verdict::answered(Err("the response is not valid".into()), Vec::new());
        assert_eq!(
            bad.error.map(|e| e.message).as_deref(),
            Some("the response is not valid")
        );
        let failed = Verdict::setup_failed("a path it mounts is gone".into());
        assert_eq!(failed.status, Status::InternalError);
        assert_eq!(
            failed.error.map(|e| e.kind).as_deref(),
            Some("SandboxError")
        );
        assert!(
            failed.exit_code.is_none() && failed.result.is_none() && failed.limits_hit.is_empty()
        );
    }
}
