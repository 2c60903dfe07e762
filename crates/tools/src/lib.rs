//! Code mode: sandboxed code calls the operator's MCP tools through airlock, and no
//! credential ever enters the sandbox.
//!
//! The operator declares tool servers ([`ToolsConfig`]); the [`Registry`] starts and
//! supervises them with rmcp's client. Each key has [`Grants`]. An execution with tools gets a
//! [`ToolSet`]: the `tools` package the runner builds inside the sandbox (only what the key
//! may call), and the host's side of the channel its calls arrive on.
#![forbid(unsafe_code)]

mod approvals;
mod broker;
mod config;
mod grants;
mod package;
mod shown;
mod slots;
mod source;

pub use approvals::{Approvals, Resolution, Watch, Watcher};
pub use broker::{
    ApprovalRecord, CallRecord, NoObserver, Observer, Outcome, Registry, ToolSet, TraceContext,
};
pub use config::{ApprovalRule, Secret, SourceConfig, ToolsConfig};
pub use grants::Grants;
pub use package::{python_stubs, Granted, ToolApi};
pub use shown::printable;
pub use source::{SourceState, SourceStatus, ToolInfo};
