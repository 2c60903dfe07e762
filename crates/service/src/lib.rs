//! airlock's services, free of any transport: what an execution, a session, an evaluation, a
//! scan, an environment, a volume, an approval and a tool listing are, written once for every
//! adapter (the HTTP API and MCP in `airlock-server`). They take transport-free requests and
//! bodies and give back transport-free outcomes, event streams and [`Error`]s: no route,
//! status code or response. This crate depends on no transport (axum, hyper, http, tower,
//! rmcp); Cargo enforces it.
//!
//! # Layers
//! Each module imports only from its own layer or the ones below:
//!
//! 1. **Services**: executions ([`execution`], [`pipeline`]: everything that runs code goes
//!    through the one pipeline, which owns the order of its steps), [`sessions`] and their
//!    [`snapshots`], [`background`] work, evaluation ([`eval`]), pickle scans ([`pickle`]),
//!    [`environments`], [`volumes`], [`approvals`], [`tools`], [`egress`], [`credentials`]
//!    and the server's [`status`]; with their requests' bodies ([`body`]) and event streams
//!    ([`stream`]).
//! 2. **[`Services`]** ([`services`]): the state they share, built once at start.
//! 3. **Stores and foundation**: paused sessions ([`paused`]), queued background work
//!    ([`parked`]), configuration (which imports no other module), keys and the [`caller`],
//!    admission, memory budgets and the size of answers, the audit log, its lines and its
//!    store, metrics, traces ([`telemetry`]) and the one error type ([`Error`]: a kind, a
//!    code, a message, the field, when to come back; no status). They know no layer above.
//!
//! Below them all is the engine ([`airlock_engine`]), which knows nothing of this crate.
#![forbid(unsafe_code)]

// Services.
pub mod approvals;
pub mod background;
pub mod body;
pub mod credentials;
pub mod egress;
pub mod environments;
pub mod eval;
pub mod execution;
pub mod pickle;
pub mod pipeline;
pub mod sessions;
pub mod snapshots;
pub mod status;
pub mod stream;
pub mod tools;
pub mod volumes;

// The state they share.
pub mod services;

// Stores and foundation.
pub mod admission;
pub mod answer;
pub mod audit;
pub mod audit_lines;
pub mod budget;
pub mod caller;
pub mod config;
pub mod error;
pub mod keys;
pub mod lifecycle;
pub mod metrics;
pub mod open_sessions;
pub mod parked;
pub mod paused;
pub mod store;
pub mod telemetry;

pub use credentials::{read as read_credential, Credentials};
pub use error::Error;
pub use services::{storage_beside_the_server, Services, SharedServices};
