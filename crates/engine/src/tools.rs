//! Code mode: the sandbox's side of the operator's tools is a second channel (descriptor 4),
//! served on the host by a [`ToolBridge`] (the `airlock-tools` crate). The engine only passes
//! the channel in, runs the bridge beside the sandbox, closes the channel when the sandbox is
//! gone, and turns a protocol breach into the execution's verdict.

use std::os::unix::net::UnixStream;

/// Where the runner finds the tool channel.
pub const TOOLS_FD: i32 = 4;

/// A call as the runner sends it on the tool channel: one JSON frame, read by the host's
/// bridge. Here beside the runner that writes it, so that the fuzz target of the channel reads
/// calls without building the bridge's crate (its HTTP and MCP clients).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub id: u64,
    pub server: String,
    pub tool: String,
    pub arguments: Box<serde_json::value::RawValue>,
    /// The line of the code that made the call, as the runner saw it (shown to approvers;
    /// the code is not trusted, so it only says where to look).
    #[serde(default)]
    pub line: Option<u64>,
}

/// The calls in `bytes` read as a bridge reads its channel (for the fuzz target): how many,
/// and whether a frame broke the protocol.
pub(crate) fn read_calls(mut bytes: &[u8], cap: u64) -> (usize, bool) {
    use crate::channel::{self, Frame};
    let mut calls = 0;
    loop {
        match channel::read(&mut bytes, cap) {
            Frame::Data(frame) => match serde_json::from_slice::<ToolCall>(&frame) {
                Ok(_) => calls += 1,
                Err(_) => return (calls, true),
            },
            Frame::End => return (calls, false),
            Frame::Broken(_) => return (calls, true),
        }
    }
}

/// The host's side of one execution's tool channel.
pub trait ToolBridge: Send + Sync + std::fmt::Debug {
    /// The `tools` package the runner builds (plain data: servers, functions, parameters,
    /// docs), for the calls this bridge will answer and nothing else.
    fn package(&self) -> serde_json::Value;

    /// Serves `channel` until it closes (the engine shuts it down once the sandbox is gone);
    /// then cancels what is still running upstream. A frame that breaks the protocol calls
    /// `breach` with the reason, which ends the execution.
    fn serve(&self, channel: UnixStream, breach: &(dyn Fn(String) + Sync));

    /// Calls received so far.
    fn calls(&self) -> u64;

    /// Names the execution the calls that follow belong to (for the audit log).
    fn bind(&self, execution_id: &str);
}

/// What a tool call gives the code: plain data, bytes (an image), or a list of them.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolValue {
    Json(serde_json::Value),
    Bytes(Vec<u8>),
    List(Vec<ToolValue>),
}

impl ToolValue {
    fn marshal(&self) -> crate::marshal::Value<'_> {
        use crate::marshal::Value;
        match self {
            ToolValue::Json(v) => Value::Json(v),
            ToolValue::Bytes(b) => Value::Bytes(b),
            ToolValue::List(items) => Value::List(items.iter().map(ToolValue::marshal).collect()),
        }
    }
}

/// One answer on the tool channel, a frame ([`crate::channel`]) of marshal: `{"id", "value"}`,
/// or `{"id", "error", "kind"}` for a call that raises `tools.ToolError`.
pub fn tool_answer(id: u64, answer: Result<&ToolValue, (&str, &str)>) -> Result<Vec<u8>, String> {
    use crate::marshal::Value;
    let id = serde_json::Value::from(id);
    let mut fields = vec![("id", Value::Json(&id))];
    match answer {
        Ok(value) => fields.push(("value", value.marshal())),
        Err((kind, message)) => {
            fields.push(("error", Value::Str(message)));
            fields.push(("kind", Value::Str(kind)));
        }
    }
    let body = crate::marshal::encode(&Value::Dict(fields))?;
    crate::channel::frame(&body).map_err(|e| e.to_string())
}

/// Why a sandbox's tool channel was cut, once the code broke its protocol.
#[derive(Debug, Default)]
pub(crate) struct Breach(std::sync::Mutex<Option<String>>);

impl Breach {
    /// Serves the host's end of the channel with `bridge` until it closes; a breach is kept
    /// (the first one) and kills the sandbox.
    pub(crate) fn serve(
        &self,
        bridge: &dyn ToolBridge,
        channel: std::io::Result<UnixStream>,
        killer: &airlock_sandbox::Killer,
    ) {
        let on_breach = |why: String| {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(why);
            killer.kill(airlock_sandbox::KillReason::Protocol);
        };
        match channel {
            Ok(channel) => bridge.serve(channel, &on_breach),
            Err(e) => on_breach(format!("the tool channel failed: {e}")),
        }
    }

    /// A sandbox the host killed for a breach ends with the breach as its error.
    pub(crate) fn explain(
        &self,
        killed: Option<airlock_sandbox::KillReason>,
        verdict: &mut crate::verdict::Verdict,
    ) {
        let why = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(why), Some(airlock_sandbox::KillReason::Protocol)) = (why, killed) {
            verdict.error = Some(airlock_api::ErrorInfo {
                kind: "ToolChannelError".into(),
                message: why,
                traceback: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_s_calls_are_read_up_to_the_first_breach() {
        let call = br#"{"id":1,"server":"s","tool":"t","arguments":{}}"#;
        let framed = crate::channel::frame(call).unwrap();
        assert_eq!(read_calls(&framed, 100), (1, false));
        // A frame that is not a call (`{}` lacks every field) ends it as a breach, as does
        // one over the cap.
        assert_eq!(
            read_calls(&[&framed[..], b"\x02\x00\x00\x00{}"].concat(), 100),
            (1, true)
        );
        assert_eq!(read_calls(&framed, 10), (0, true));
        // A field the runner never sends is refused, not ignored.
        let extra = br#"{"id":1,"server":"s","tool":"t","arguments":{},"as":"root"}"#;
        assert_eq!(
            read_calls(&crate::channel::frame(extra).unwrap(), 100),
            (0, true)
        );
    }
}
