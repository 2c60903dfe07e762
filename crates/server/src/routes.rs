//! The route table: paths to the HTTP handlers ([`crate::http`]) and the MCP transport
//! ([`crate::mcp`]), behind the guard ([`guard::guard`]). Nothing else lives here.

use axum::routing::{any, get, post};
use axum::{Extension, Router};

use crate::http::{environments, eval, executions, guard, pickle, sessions, status, tools};
use crate::SharedState;

pub fn app(state: SharedState) -> Router {
    let mut router = Router::new();
    if state.config.mcp.enabled {
        let service = crate::http::mcp::service(state.clone());
        router = router.route(
            "/mcp",
            any(crate::http::mcp::route).layer(Extension(service)),
        );
    }
    router
        .route("/healthz", get(status::healthz))
        .route("/readyz", get(status::readyz))
        .route("/metrics", get(status::metrics))
        .route("/openapi.json", get(status::openapi))
        .route("/v1/execute", post(executions::execute))
        .route("/v1/eval", post(eval::eval))
        .route("/v1/pickle/scan", post(pickle::scan))
        .route("/v1/tools", get(tools::list))
        .route("/v1/executions/{id}", get(executions::execution))
        .route(
            "/v1/environments",
            get(environments::list).post(environments::create),
        )
        .route(
            "/v1/environments/{name}",
            get(environments::get).delete(environments::delete),
        )
        .route("/v1/sessions", get(sessions::list).post(sessions::create))
        .route(
            "/v1/sessions/{id}",
            get(sessions::get).delete(sessions::delete),
        )
        .route("/v1/sessions/{id}/execute", post(sessions::execute))
        .route("/v1/sessions/{id}/files", get(sessions::list_files))
        .route(
            "/v1/sessions/{id}/files/{*path}",
            get(sessions::get_file).put(sessions::put_file),
        )
        .fallback(status::not_found)
        .method_not_allowed_fallback(status::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::guard,
        ))
        .with_state(state)
}
