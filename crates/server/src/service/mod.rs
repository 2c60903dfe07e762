//! The services: what an execution, a session, an evaluation, a scan, an environment and a
//! tool listing are, once, whichever adapter asks (the HTTP handlers in [`crate::http`], the
//! MCP tools in [`crate::mcp`]). They check, admit, audit and call the engine; they know
//! nothing of routes or transports.

pub(crate) mod egress;
pub(crate) mod environments;
pub(crate) mod eval;
pub(crate) mod execution;
pub(crate) mod pickle;
pub(crate) mod sessions;
pub(crate) mod status;
pub(crate) mod stream;
pub(crate) mod tools;
