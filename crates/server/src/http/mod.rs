//! The HTTP adapter: the route table ([`routes`]: every route once, with its handler,
//! OpenAPI operation and scope), the guard every request passes ([`guard`]), then one
//! handler per route, each a call into [`airlock_service`]; what HTTP alone knows: the
//! status of each error ([`error`]), answers written out and counted ([`answer`]), bodies
//! handed to the services ([`body`]), server-sent events ([`sse`]), and MCP's streamable
//! HTTP transport ([`mcp`]); a request's span, when traces are on ([`trace`]).

pub(crate) mod answer;
pub(crate) mod approvals;
pub(crate) mod body;
pub(crate) mod environments;
pub(crate) mod error;
pub(crate) mod eval;
pub(crate) mod executions;
pub(crate) mod guard;
pub(crate) mod mcp;
pub(crate) mod pickle;
pub(crate) mod routes;
pub(crate) mod sessions;
pub(crate) mod sse;
pub(crate) mod status;
pub(crate) mod tools;
pub(crate) mod trace;
pub(crate) mod volumes;

use axum::Router;

use airlock_service::SharedServices;

/// The HTTP service: the routes of the table ([`routes`]), the answers for unknown paths and
/// methods, all behind the guard.
pub fn app(state: SharedServices) -> Router {
    routes::router(&state)
        .fallback(status::not_found)
        .method_not_allowed_fallback(status::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            guard::Guarded::new(state.clone()),
            guard::guard,
        ))
        .with_state(state)
}
