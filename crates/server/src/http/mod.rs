//! The HTTP adapter: the guard every request passes ([`guard`]), then one handler per
//! route, each a scope check and a call into [`crate::service`]; what HTTP alone knows: the
//! status of each error ([`error`]), answers written out and counted ([`answer`]), bodies
//! handed to the services ([`body`]), server-sent events ([`sse`]), and MCP's streamable
//! HTTP transport ([`mcp`]). The route table that maps paths to them is [`crate::routes`].

pub(crate) mod answer;
pub(crate) mod body;
pub(crate) mod environments;
pub(crate) mod error;
pub(crate) mod eval;
pub(crate) mod executions;
pub(crate) mod guard;
pub(crate) mod mcp;
pub(crate) mod pickle;
pub(crate) mod sessions;
pub(crate) mod sse;
pub(crate) mod status;
pub(crate) mod tools;
