//! The route table: paths to handlers, behind the guard. The handlers live in their own
//! modules and share one request pipeline (`pipeline`).

use axum::routing::{any, get, post};
use axum::{Extension, Router};

use crate::SharedState;

pub fn app(state: SharedState) -> Router {
    let mut router = Router::new();
    if state.config.mcp.enabled {
        let service = crate::mcp::http_service(state.clone());
        router = router.route("/mcp", any(crate::mcp::route).layer(Extension(service)));
    }
    router
        .route("/healthz", get(crate::status::healthz))
        .route("/readyz", get(crate::status::readyz))
        .route("/metrics", get(crate::status::metrics))
        .route("/openapi.json", get(crate::status::openapi))
        .route("/v1/execute", post(crate::executions::execute))
        .route("/v1/eval", post(crate::eval::eval))
        .route("/v1/pickle/scan", post(crate::pickle::scan))
        .route("/v1/tools", get(crate::tools::list))
        .route("/v1/executions/{id}", get(crate::executions::execution))
        .route(
            "/v1/environments",
            get(crate::environments::list).post(crate::environments::create),
        )
        .route(
            "/v1/environments/{name}",
            get(crate::environments::get).delete(crate::environments::delete),
        )
        .route(
            "/v1/sessions",
            get(crate::sessions::list).post(crate::sessions::create),
        )
        .route(
            "/v1/sessions/{id}",
            get(crate::sessions::get).delete(crate::sessions::delete),
        )
        .route("/v1/sessions/{id}/execute", post(crate::sessions::execute))
        .route("/v1/sessions/{id}/files", get(crate::sessions::list_files))
        .route(
            "/v1/sessions/{id}/files/{*path}",
            get(crate::sessions::get_file).put(crate::sessions::put_file),
        )
        .fallback(crate::status::not_found)
        .method_not_allowed_fallback(crate::status::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::guard::guard,
        ))
        .with_state(state)
}
