//! airlock's adapters over its services ([`airlock_service`]): the HTTP API (`POST
//! /v1/execute` and friends, authenticated and hardened), and the same operations as MCP
//! tools, over HTTP or stdio.
//!
//! # Layers
//! Each module belongs to one layer and imports only from its own layer or the ones below.
//! `tests/layers.rs` reads every `crate::` and `super::` path and fails on one that points up,
//! on an import between adapters other than `http` → `mcp`, and on a circle among the
//! top-level modules or among the submodules of `http/` and `mcp/`:
//!
//! 1. **Start-up** ([`serve`], [`stdio`]): builds the services, the listeners and the
//!    signals, and mounts the adapters on them.
//! 2. **Adapters** ([`http`], [`mcp`]): turn a transport's request into a service call and
//!    its outcome into an answer. `http` holds the one route table (`http::routes`: each
//!    route's method, path, handler, OpenAPI operation and scope, from which the router, the
//!    OpenAPI document and the guard's scope checks are made), the guard, the handlers, the
//!    HTTP form of errors (`http::error`, the one place an [`Error`] becomes a status),
//!    answers, bodies and server-sent events, and MCP's streamable HTTP transport, which
//!    mounts [`mcp`]'s tools: the one import between adapters. [`mcp`] holds the table of
//!    tools (each tool's name, schemas, description and handler, from which `tools/list`,
//!    the dispatch of `tools/call` and `airlock mcp --help` are made), and turns tool calls
//!    into service calls and results into tool results.
//! 3. **Foundation**: the connection layer ([`wire`]), sizing and the OpenAPI descriptions.
//!
//! Below them all are the services ([`airlock_service`]), which know no transport.
//!
//! # What is enforced
//! - Every route but `/healthz` and `/openapi.json` needs a valid key (`Authorization: Bearer
//!   ...`), and the key's scope for the route; `/metrics` and `/readyz` only when the
//!   configuration does not open them (`metrics.require_auth`, `http.readyz_without_key`).
//!   Keys are stored as SHA-256 hashes and compared in constant time.
//! - Host header allow-list (DNS rebinding), no CORS unless origins are listed, requests from
//!   foreign origins refused, only `application/json` bodies.
//! - Body size counted on the bytes received, header and body read timeouts, a cap on open
//!   connections, `Transfer-Encoding` with `Content-Length` refused.
//! - Global and per-key concurrency with bounded queues, per-key rate limits and ceilings.
#![forbid(unsafe_code)]
// The OpenAPI document is one `json!` literal, deeper than the default allows.
#![recursion_limit = "256"]

// Start-up.
mod serve;
mod stdio;

// Adapters.
mod http;
pub mod mcp;

// Foundation.
mod openapi;
pub mod sizing;
mod wire;

pub use airlock_service::{
    admission, audit, config, keys, metrics, read_credential, storage_beside_the_server,
    Credentials, Error, Services, SharedServices,
};
pub use http::app;
pub use http::routes::{openapi, ROUTES};
pub use serve::{init_logging, run, Reload, ServeError, Started};
pub use stdio::run_stdio;
