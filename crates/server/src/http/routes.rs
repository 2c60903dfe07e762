//! The route table: every route once ([`TABLE`]), with its method, path, handler, OpenAPI
//! operation id and tag, and who may call it. The router ([`router`], behind the guard in
//! `http::app`), the OpenAPI document ([`openapi`]), the guard's key and scope checks
//! ([`access`]) and the list of routes ([`ROUTES`]) are all made from it.

use axum::http::{header, HeaderMap};
use axum::routing::{any, on, MethodFilter, MethodRouter};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};

use crate::http::{
    approvals, environments, eval, executions, mcp, pickle, sessions, status, tools, volumes,
};
use airlock_service::config::{Config, Scope};
use airlock_service::SharedServices;

/// One route.
pub(crate) struct Route {
    pub method: Method,
    /// As OpenAPI writes it; a `{path}` parameter takes the rest of the path, slashes and all.
    pub path: &'static str,
    pub operation_id: &'static str,
    pub tag: &'static str,
    pub access: Access,
    /// Whether the configuration serves it (else it is 404 like any unknown path).
    served: fn(&Config) -> bool,
    handler: fn(MethodFilter, &SharedServices) -> MethodRouter<SharedServices>,
}

/// Who may call a route.
#[derive(Clone, Copy)]
pub(crate) enum Access {
    /// Anyone, with any Host: what it says is the same for everyone.
    Public,
    /// A valid key, with this scope when one is named; `open` says when the configuration
    /// lets a request without a key in (and then it answers any Host).
    Key {
        scope: Option<Scope>,
        open: Option<fn(&Config, &HeaderMap) -> bool>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    Get,
    Post,
    Put,
    Delete,
}

impl Method {
    const fn name(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Method::Get => MethodFilter::GET,
            Method::Post => MethodFilter::POST,
            Method::Put => MethodFilter::PUT,
            Method::Delete => MethodFilter::DELETE,
        }
    }
}

const fn key(scope: Scope) -> Access {
    Access::Key {
        scope: Some(scope),
        open: None,
    }
}

fn always(_: &Config) -> bool {
    true
}

/// `/readyz` without a key, for probes that cannot hold one (`http.readyz_without_key`);
/// anyone presenting a key is checked.
fn probe_without_key(config: &Config, headers: &HeaderMap) -> bool {
    config.http.readyz_without_key && !headers.contains_key(header::AUTHORIZATION)
}

/// `/metrics` for scrapers without a key (`metrics.require_auth = false`).
fn metrics_without_key(config: &Config, _: &HeaderMap) -> bool {
    !config.metrics.require_auth
}

/// Every route, in the order `docs/http-api.md` lists them.
pub(crate) const TABLE: &[Route] = &[
    Route {
        method: Method::Post,
        path: "/v1/execute",
        operation_id: "execute",
        tag: "executions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, executions::execute),
    },
    Route {
        method: Method::Post,
        path: "/v1/eval",
        operation_id: "evaluate",
        tag: "evaluation",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, eval::eval),
    },
    Route {
        method: Method::Post,
        path: "/v1/pickle/scan",
        operation_id: "scanPickle",
        tag: "pickles",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, pickle::scan),
    },
    Route {
        method: Method::Get,
        path: "/v1/tools",
        operation_id: "listTools",
        tag: "tools",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, tools::list),
    },
    Route {
        method: Method::Get,
        path: "/v1/approvals",
        operation_id: "listApprovals",
        tag: "tools",
        access: key(Scope::Approve),
        served: always,
        handler: |m, _| on(m, approvals::list),
    },
    Route {
        method: Method::Get,
        path: "/v1/approvals/{id}",
        operation_id: "getApproval",
        tag: "tools",
        access: key(Scope::Approve),
        served: always,
        handler: |m, _| on(m, approvals::get),
    },
    Route {
        method: Method::Post,
        path: "/v1/approvals/{id}",
        operation_id: "decideApproval",
        tag: "tools",
        access: key(Scope::Approve),
        served: always,
        handler: |m, _| on(m, approvals::decide),
    },
    Route {
        method: Method::Post,
        path: "/v1/executions",
        operation_id: "submitExecution",
        tag: "executions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, executions::submit),
    },
    Route {
        method: Method::Get,
        path: "/v1/executions/{id}",
        operation_id: "getExecution",
        tag: "executions",
        access: key(Scope::Read),
        served: always,
        handler: |m, _| on(m, executions::execution),
    },
    Route {
        method: Method::Delete,
        path: "/v1/executions/{id}",
        operation_id: "cancelExecution",
        tag: "executions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, executions::delete),
    },
    Route {
        method: Method::Get,
        path: "/v1/executions/{id}/events",
        operation_id: "executionEvents",
        tag: "executions",
        access: key(Scope::Read),
        served: always,
        handler: |m, _| on(m, executions::events),
    },
    Route {
        method: Method::Get,
        path: "/v1/environments",
        operation_id: "listEnvironments",
        tag: "environments",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, environments::list),
    },
    Route {
        method: Method::Post,
        path: "/v1/environments",
        operation_id: "createEnvironment",
        tag: "environments",
        access: key(Scope::Admin),
        served: always,
        handler: |m, _| on(m, environments::create),
    },
    Route {
        method: Method::Get,
        path: "/v1/environments/{name}",
        operation_id: "getEnvironment",
        tag: "environments",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, environments::get),
    },
    Route {
        method: Method::Delete,
        path: "/v1/environments/{name}",
        operation_id: "deleteEnvironment",
        tag: "environments",
        access: key(Scope::Admin),
        served: always,
        handler: |m, _| on(m, environments::delete),
    },
    Route {
        method: Method::Post,
        path: "/v1/sessions",
        operation_id: "createSession",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::create),
    },
    Route {
        method: Method::Get,
        path: "/v1/sessions",
        operation_id: "listSessions",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::list),
    },
    Route {
        method: Method::Get,
        path: "/v1/sessions/{id}",
        operation_id: "getSession",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::get),
    },
    Route {
        method: Method::Delete,
        path: "/v1/sessions/{id}",
        operation_id: "closeSession",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::delete),
    },
    Route {
        method: Method::Post,
        path: "/v1/sessions/{id}/execute",
        operation_id: "executeCell",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::execute),
    },
    Route {
        method: Method::Post,
        path: "/v1/sessions/{id}/pause",
        operation_id: "pauseSession",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::pause),
    },
    Route {
        method: Method::Post,
        path: "/v1/sessions/{id}/resume",
        operation_id: "resumeSession",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::resume),
    },
    Route {
        method: Method::Post,
        path: "/v1/sessions/{id}/fork",
        operation_id: "forkSession",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::fork),
    },
    Route {
        method: Method::Get,
        path: "/v1/sessions/{id}/files",
        operation_id: "listSessionFiles",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::list_files),
    },
    Route {
        method: Method::Get,
        path: "/v1/sessions/{id}/files/{path}",
        operation_id: "getSessionFile",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::get_file),
    },
    Route {
        method: Method::Put,
        path: "/v1/sessions/{id}/files/{path}",
        operation_id: "putSessionFile",
        tag: "sessions",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, sessions::put_file),
    },
    Route {
        method: Method::Post,
        path: "/v1/volumes",
        operation_id: "createVolume",
        tag: "volumes",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, volumes::create),
    },
    Route {
        method: Method::Get,
        path: "/v1/volumes",
        operation_id: "listVolumes",
        tag: "volumes",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, volumes::list),
    },
    Route {
        method: Method::Get,
        path: "/v1/volumes/{name}",
        operation_id: "getVolume",
        tag: "volumes",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, volumes::get),
    },
    Route {
        method: Method::Delete,
        path: "/v1/volumes/{name}",
        operation_id: "deleteVolume",
        tag: "volumes",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, volumes::delete),
    },
    Route {
        method: Method::Get,
        path: "/v1/volumes/{name}/files",
        operation_id: "listVolumeFiles",
        tag: "volumes",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, volumes::list_files),
    },
    Route {
        method: Method::Get,
        path: "/v1/volumes/{name}/files/{path}",
        operation_id: "getVolumeFile",
        tag: "volumes",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, volumes::get_file),
    },
    Route {
        method: Method::Put,
        path: "/v1/volumes/{name}/files/{path}",
        operation_id: "putVolumeFile",
        tag: "volumes",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, volumes::put_file),
    },
    Route {
        method: Method::Delete,
        path: "/v1/volumes/{name}/files/{path}",
        operation_id: "deleteVolumeFile",
        tag: "volumes",
        access: key(Scope::Execute),
        served: always,
        handler: |m, _| on(m, volumes::delete_file),
    },
    Route {
        method: Method::Post,
        path: "/mcp",
        operation_id: "mcp",
        tag: "mcp",
        access: key(Scope::Execute),
        served: |config| config.mcp.enabled,
        // Every method: rmcp answers the others itself (405: stateless, no GET stream).
        handler: |_, state| any(mcp::route).layer(Extension(mcp::service(state.clone()))),
    },
    Route {
        method: Method::Get,
        path: "/healthz",
        operation_id: "healthz",
        tag: "status",
        access: Access::Public,
        served: always,
        handler: |m, _| on(m, status::healthz),
    },
    Route {
        method: Method::Get,
        path: "/readyz",
        operation_id: "readyz",
        tag: "status",
        access: Access::Key {
            scope: None,
            open: Some(probe_without_key),
        },
        served: always,
        handler: |m, _| on(m, status::readyz),
    },
    Route {
        method: Method::Get,
        path: "/metrics",
        operation_id: "metrics",
        tag: "status",
        access: Access::Key {
            scope: Some(Scope::Metrics),
            open: Some(metrics_without_key),
        },
        served: always,
        handler: |m, _| on(m, status::metrics),
    },
    Route {
        method: Method::Get,
        path: "/openapi.json",
        operation_id: "openapi",
        tag: "status",
        access: Access::Public,
        served: always,
        handler: |m, _| on(m, openapi_json),
    },
];

const PAIRS: [(&str, &str); TABLE.len()] = {
    let mut pairs = [("", ""); TABLE.len()];
    let mut i = 0;
    while i < TABLE.len() {
        pairs[i] = (TABLE[i].method.name(), TABLE[i].path);
        i += 1;
    }
    pairs
};

/// Every route, as `METHOD path`; docs/http-api.md is checked against this list.
pub const ROUTES: &[(&str, &str)] = &PAIRS;

/// The path as the router matches it: a `{path}` parameter takes the rest.
fn router_path(path: &str) -> String {
    path.replace("{path}", "{*path}")
}

/// Who may call the route the router matched (`matched`, as `MatchedPath` gives it) with
/// `method`. A method the path does not take (405) needs what the path's routes need, but no
/// scope; a path that matched nothing (404) needs a key.
pub(crate) fn access(matched: Option<&str>, method: &axum::http::Method) -> Access {
    let same_path = |r: &&Route| matched.is_some_and(|m| router_path(r.path) == m);
    if let Some(route) = TABLE
        .iter()
        .filter(same_path)
        .find(|r| r.method.name() == method.as_str())
    {
        return route.access;
    }
    match TABLE.iter().find(same_path).map(|r| r.access) {
        Some(Access::Public) => Access::Public,
        Some(Access::Key { open, .. }) => Access::Key { scope: None, open },
        None => Access::Key {
            scope: None,
            open: None,
        },
    }
}

/// The routes the configuration serves, each with its handler (the guard and the fallbacks
/// are the adapter's: `http::app`).
pub(crate) fn router(state: &SharedServices) -> Router<SharedServices> {
    let mut router = Router::new();
    for route in TABLE.iter().filter(|r| (r.served)(&state.config)) {
        let handler = (route.handler)(route.method.filter(), state);
        router = router.route(&router_path(route.path), handler);
    }
    router
}

/// `GET /openapi.json`.
async fn openapi_json() -> Json<Value> {
    Json(openapi())
}

/// The OpenAPI document: the descriptions of `openapi.rs`, with each operation's id, tag and
/// security from the table.
pub fn openapi() -> Value {
    let mut doc = crate::openapi::document();
    for route in TABLE {
        let op = &mut doc["paths"][route.path][route.method.name().to_lowercase()];
        op["operationId"] = json!(route.operation_id);
        op["tags"] = json!([route.tag]);
        if let Access::Public = route.access {
            op["security"] = json!([]);
        }
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_described_and_every_reference_resolves() {
        let doc = openapi();
        for (method, path) in ROUTES {
            assert!(
                doc["paths"][path][method.to_lowercase()].is_object(),
                "{method} {path}"
            );
        }
        let methods: usize = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .map(|p| p.as_object().unwrap().len())
            .sum();
        assert_eq!(methods, ROUTES.len());
        assert_eq!(ROUTES.len(), TABLE.len());
        // One operationId per operation, each unique, and a tag on each.
        let mut ids = std::collections::BTreeSet::new();
        for (method, path) in ROUTES {
            let op = &doc["paths"][path][method.to_lowercase()];
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path}"));
            assert!(ids.insert(id.to_owned()), "{id} twice");
            assert!(op["tags"][0].is_string(), "{method} {path}");
        }
        // The public routes, and only they, need no key.
        for route in TABLE {
            let op = &doc["paths"][route.path][route.method.name().to_lowercase()];
            let public = matches!(route.access, Access::Public);
            assert_eq!(op["security"] == json!([]), public, "{}", route.path);
        }
        let text = doc.to_string();
        for piece in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = piece.split('"').next().unwrap();
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "dangling $ref to {name}"
            );
        }
        let req = &doc["components"]["schemas"]["ExecuteRequest"];
        assert_eq!(req["required"], json!(["code"]));
        assert_eq!(
            req["additionalProperties"],
            json!(false),
            "unknown fields are refused"
        );
    }

    #[test]
    fn access_follows_the_path_and_the_method() {
        let get = axum::http::Method::GET;
        let post = axum::http::Method::POST;
        assert!(matches!(access(Some("/healthz"), &get), Access::Public));
        // A method the path does not take: the path's access, without a scope.
        assert!(matches!(access(Some("/healthz"), &post), Access::Public));
        assert!(matches!(
            access(Some("/v1/environments"), &post),
            Access::Key {
                scope: Some(Scope::Admin),
                ..
            }
        ));
        assert!(matches!(
            access(Some("/v1/environments"), &axum::http::Method::PUT),
            Access::Key { scope: None, .. }
        ));
        assert!(matches!(
            access(Some("/v1/sessions/{id}/files/{*path}"), &get),
            Access::Key {
                scope: Some(Scope::Execute),
                ..
            }
        ));
        assert!(matches!(
            access(None, &get),
            Access::Key {
                scope: None,
                open: None
            }
        ));
    }
}
