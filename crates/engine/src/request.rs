//! The runner's request: a job as the runner reads it, and the fields a session's cell shares
//! with it, in Python's `marshal` format (see `marshal`): the code, its files and its options
//! travel as plain values, never pasted into source text.

use crate::error::EngineError;
use crate::job::{Entrypoint, Job};
use crate::marshal::{self, Value};
use crate::policy::PIP_TARGET;
use crate::runner;

const REPR_LIMIT: usize = 4096;
const MAX_DEPTH: usize = 64;

/// The runner's request for `job`, whose sandbox's `sys.path` after the standard library is
/// `sys_path` (see `Launcher::sys_path`); with the runner's on-demand part (`more`) unless its
/// sandbox is a zygote's child, whose zygote has defined it once for all its children.
pub(crate) fn for_job(
    job: &Job,
    mut sys_path: Vec<String>,
    result_limit: u64,
    more: bool,
) -> Result<Vec<u8>, EngineError> {
    // A limit past what one marshal integer holds is no limit anyway: no single answer can be
    // that large.
    let int = |n: u64| Value::Int(n.min(i32::MAX as u64) as i32);
    // Then where `pip install` puts packages in a sandbox.
    sys_path.push(PIP_TARGET.to_owned());
    let mut fields = vec![
        ("code", Value::Str(&job.code)),
        ("filename", Value::Str(&job.filename)),
        (
            "env",
            Value::Dict(
                job.env
                    .iter()
                    .map(|(k, v)| (k.as_str(), Value::Str(v)))
                    .collect(),
            ),
        ),
        (
            "files",
            Value::List(
                job.files
                    .iter()
                    .map(|f| {
                        Value::Dict(vec![
                            ("path", Value::Str(&f.path)),
                            ("data", Value::Bytes(&f.data)),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("stream", Value::Bool(job.stream)),
        ("echo_traceback", Value::Bool(job.echo_traceback)),
        (
            "sys_path",
            Value::List(sys_path.iter().map(|p| Value::Str(p)).collect()),
        ),
        ("more", Value::Str(if more { runner::MORE } else { "" })),
        ("result_limit", int(result_limit)),
        ("repr_limit", int(REPR_LIMIT as u64)),
        ("max_depth", int(MAX_DEPTH as u64)),
    ];
    let package = job.tools.as_ref().map(|t| t.package());
    fields.push(("tools", tools_field(package.as_ref())));
    fields.extend(entrypoint_fields(job.entrypoint.as_ref()));
    marshal::encode(&Value::Dict(fields)).map_err(|e| EngineError::Io {
        what: "encoding the request",
        source: std::io::Error::other(e),
    })
}

/// Function mode's two request fields (None for a plain execution), the same for a one-shot
/// run and a session cell.
pub(crate) fn entrypoint_fields(e: Option<&Entrypoint>) -> [(&'static str, Value<'_>); 2] {
    [
        ("entrypoint", e.map_or(Value::None, |e| Value::Str(&e.name))),
        (
            "inputs",
            e.map_or(Value::None, |e| Value::Object(&e.inputs)),
        ),
    ]
}

/// The request's `tools` field: the package the runner builds (an object of plain data), or
/// None when the job has no tools.
pub(crate) fn tools_field(package: Option<&serde_json::Value>) -> Value<'_> {
    match package {
        Some(serde_json::Value::Object(map)) => Value::Object(map),
        _ => Value::None,
    }
}
