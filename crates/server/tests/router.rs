//! The router in process: `app()` answered with `oneshot`, no listener, no root. The engine
//! is real (the interpreter found, nothing started) and never reached: every request here is
//! answered by the guard, a handler or a service before any sandbox would start, which the
//! audit log (no line written) confirms. The end-to-end tests in `crates/cli/tests` run the
//! same paths through a real server and real sandboxes.

use std::path::PathBuf;
use std::sync::Arc;

use airlock_server::audit::AuditLog;
use airlock_server::config::{Config, KeyConfig, Scope};
use airlock_server::keys::{hash_key, KeyStore};
use airlock_server::{app, Services, SharedServices};
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

const KEY: &str = "router-test-key-with-every-scope";
const READER: &str = "router-test-key-that-may-only-read";
const SLOW: &str = "router-test-key-with-one-request-a-minute";
const NO_SCOPE: &str = "router-test-key-with-no-scope-at-all";

/// A state directory removed with the server.
struct Server {
    state: SharedServices,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn server(tweak: impl FnOnce(&mut Config)) -> Server {
    let dir = std::env::temp_dir().join(format!(
        "airlock-router-{}-{}",
        std::process::id(),
        airlock_server::keys::random_id("")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = Config {
        state_dir: Some(dir.clone()),
        ..Config::default()
    };
    config.http.max_body_bytes = 4096;
    tweak(&mut config);
    let reader = KeyConfig {
        scopes: vec![Scope::Read],
        ..KeyConfig::new("reader", hash_key(READER))
    };
    let slow = KeyConfig {
        rate_per_minute: 1,
        ..KeyConfig::new("slow", hash_key(SLOW))
    };
    let none = KeyConfig {
        scopes: Vec::new(),
        ..KeyConfig::new("none", hash_key(NO_SCOPE))
    };
    let keys = KeyStore::new(vec![
        KeyConfig::new("full", hash_key(KEY)),
        reader,
        slow,
        none,
    ])
    .unwrap();
    let engine = airlock_engine::Engine::new(config.engine.clone()).unwrap();
    let (audit, _) = AuditLog::open(&config).unwrap();
    let environments = Arc::new(airlock_engine::environments::Environments::open(&dir).unwrap());
    let state = Arc::new(Services::new(
        config,
        engine,
        keys,
        audit,
        None,
        environments,
    ));
    Server { state, dir }
}

impl Server {
    async fn send(&self, req: Request<Body>) -> (StatusCode, Response, Value) {
        let response = app(self.state.clone()).oneshot(req).await.unwrap();
        let status = response.status();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, Response::from_parts(parts, Body::empty()), value)
    }

    /// Every line the audit log holds: none, when nothing reached the engine.
    fn audit_lines(&self) -> usize {
        std::fs::read_to_string(self.dir.join("audit.jsonl"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }
}

fn request(method: Method, path: &str, key: Option<&str>, body: Option<Value>) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "localhost");
    if let Some(key) = key {
        b = b.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    match body {
        Some(v) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(v.to_string()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    }
}

fn execute(body: Value) -> Request<Body> {
    request(Method::POST, "/v1/execute", Some(KEY), Some(body))
}

/// The error's code and field, checking the shape every error has.
fn error(body: &Value) -> (&str, Option<&str>) {
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    (e["code"].as_str().unwrap(), e["field"].as_str())
}

#[tokio::test]
async fn keys_decide_who_gets_in_and_what_they_may_do() {
    let s = server(|_| {});
    let (status, response, _) = s.send(request(Method::GET, "/healthz", None, None)).await;
    assert_eq!(status, StatusCode::OK, "/healthz needs no key");
    assert!(response.headers().contains_key("x-request-id"));

    let (status, response, body) = s.send(request(Method::GET, "/v1/tools", None, None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(error(&body).0, "unauthorized");
    // RFC 6750: no key presented, no error code in the challenge.
    assert_eq!(
        response.headers()[header::WWW_AUTHENTICATE],
        "Bearer realm=\"airlock\""
    );
    // Every error carries the request's id, as its header does.
    assert_eq!(
        body["error"]["request_id"],
        response.headers()["x-request-id"].to_str().unwrap()
    );

    let (status, response, body) = s
        .send(request(Method::GET, "/v1/tools", Some("not-a-key"), None))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(error(&body).1.is_none());
    let challenge = response.headers()[header::WWW_AUTHENTICATE]
        .to_str()
        .unwrap();
    assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");

    // The scheme is case-insensitive (RFC 9110); the key is not.
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let mut r = request(Method::GET, "/v1/tools", None, None);
        r.headers_mut().insert(
            header::AUTHORIZATION,
            format!("{scheme} {KEY}").parse().unwrap(),
        );
        assert_eq!(s.send(r).await.0, StatusCode::OK, "{scheme}");
    }
    let (status, _, _) = s
        .send(request(
            Method::GET,
            "/v1/tools",
            Some(&KEY.to_uppercase()),
            None,
        ))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // The API's description needs no key.
    let (status, _, body) = s
        .send(request(Method::GET, "/openapi.json", None, None))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["paths"]["/v1/execute"]["post"]["operationId"],
        "execute"
    );

    let mut basic = request(Method::GET, "/v1/tools", None, None);
    basic.headers_mut().insert(
        header::AUTHORIZATION,
        format!("Basic {KEY}").parse().unwrap(),
    );
    assert_eq!(s.send(basic).await.0, StatusCode::UNAUTHORIZED);

    let (status, _, body) = s
        .send(request(Method::GET, "/v1/tools", Some(KEY), None))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tools"], json!([]));

    // A key without the scope: 403 before its body is read.
    let (status, _, body) = s
        .send(request(
            Method::POST,
            "/v1/execute",
            Some(READER),
            Some(json!({"code": "1"})),
        ))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(error(&body).0, "forbidden");
    assert_eq!(s.audit_lines(), 0);
}

#[tokio::test]
async fn every_route_but_the_open_ones_refuses_a_key_without_its_scope() {
    // The route table names each route's scope once: a key with none is refused on every
    // route that names one, before its handler reads a byte, and nothing reaches the engine.
    let s = server(|_| {});
    let mut refused = 0;
    for (method, path) in airlock_server::ROUTES {
        let path = path
            .replace("{id}", "se_x")
            .replace("{name}", "x")
            .replace("{path}", "x");
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let (status, _, body) = s
            .send(request(
                method.clone(),
                &path,
                Some(NO_SCOPE),
                Some(json!({"code": "1"})),
            ))
            .await;
        match path.as_str() {
            // Public, or open to any valid key.
            "/healthz" | "/openapi.json" | "/readyz" => {
                assert_ne!(status, StatusCode::FORBIDDEN, "{method} {path}: {body}")
            }
            _ => {
                assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {body}");
                assert_eq!(error(&body).0, "forbidden", "{method} {path}");
                refused += 1;
            }
        }
    }
    assert_eq!(refused, airlock_server::ROUTES.len() - 3);
    assert_eq!(s.audit_lines(), 0);
}

#[tokio::test]
async fn hosts_and_origins_not_listed_are_refused() {
    let s = server(|_| {});
    let mut evil = request(Method::GET, "/v1/tools", Some(KEY), None);
    evil.headers_mut()
        .insert(header::HOST, "evil.example:8080".parse().unwrap());
    let (status, _, body) = s.send(evil).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{body}");
    assert_eq!(error(&body).0, "misdirected_request");

    let mut cross = request(
        Method::POST,
        "/v1/execute",
        Some(KEY),
        Some(json!({"code": "1"})),
    );
    cross
        .headers_mut()
        .insert(header::ORIGIN, "https://evil.example".parse().unwrap());
    let (status, response, _) = s.send(cross).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(!response
        .headers()
        .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN));
    assert_eq!(s.audit_lines(), 0);
}

#[tokio::test]
async fn bodies_and_limits_are_refused_naming_the_field() {
    let s = server(|_| {});
    let ceiling = s.state.engine.config().ceilings.timeout_ms;
    let mut files: Vec<Value> = Vec::new();
    for i in 0..=airlock_engine::MAX_FILES {
        files.push(json!({"path": format!("f{i}"), "content": ""}));
    }
    let cases: Vec<(Request<Body>, StatusCode, &str, Option<&str>)> = vec![
        (
            execute(json!({"code": "1", "limits": {"timeout_ms": ceiling + 1}})),
            StatusCode::BAD_REQUEST,
            "limit_above_ceiling",
            Some("limits.timeout_ms"),
        ),
        (
            execute(json!({"code": "1", "limits": {"memory_mb": 0}})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            Some("limits.memory_mb"),
        ),
        (
            execute(json!({"code": 1})),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            Some("code"),
        ),
        (
            execute(json!({"code": "1", "inputs": {"a": 1}})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            Some("inputs"),
        ),
        (
            execute(json!({"code": "1", "files": [
                {"path": "a.txt", "content": "x"}, {"path": "a.txt", "content": "y"}]})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            Some("files[1].path"),
        ),
        (
            execute(json!({"code": "1", "files": [
                {"path": "a.bin", "content": "%%%", "encoding": "base64"}]})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            Some("files[0].content"),
        ),
        (
            execute(json!({"code": "1", "files": [{"path": "../up", "content": ""}]})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            Some("files[0].path"),
        ),
        (
            execute(json!({"code": "x".repeat(5000)})),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            Some("body"),
        ),
    ];
    for (req, want_status, want_code, want_field) in cases {
        let (status, _, body) = s.send(req).await;
        assert_eq!(status, want_status, "{body}");
        assert_eq!(error(&body), (want_code, want_field), "{body}");
    }

    // Too many files: refused by the engine's count check before one of them is decoded.
    let big = server(|c| c.http.max_body_bytes = 1 << 20);
    let (status, _, body) = big
        .send(execute(json!({"code": "1", "files": files})))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(error(&body).1, Some("files"));

    let mut text = execute(json!({"code": "1"}));
    text.headers_mut()
        .insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
    let (status, _, body) = s.send(text).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(error(&body).0, "unsupported_media_type");
    assert_eq!(s.audit_lines() + big.audit_lines(), 0);
}

#[tokio::test]
async fn refusals_map_to_their_status_and_retry_after() {
    let s = server(|_| {});
    let (status, _, body) = s
        .send(request(Method::GET, "/v1/no-such-route", Some(KEY), None))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error(&body).0, "not_found");

    let (status, _, body) = s
        .send(request(Method::DELETE, "/v1/execute", Some(KEY), None))
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error(&body).0, "method_not_allowed");

    // Another key's session, or none: 404 either way.
    let (status, _, body) = s
        .send(request(
            Method::GET,
            "/v1/sessions/se_nothing",
            Some(KEY),
            None,
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // One request a minute: the first (refused for its body) spends it, the second waits.
    let slow = |body: Value| request(Method::POST, "/v1/execute", Some(SLOW), Some(body));
    let (status, _, _) = s.send(slow(json!({"code": 1}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, response, body) = s.send(slow(json!({"code": "1"}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(error(&body).0, "rate_limited");
    assert!(response.headers().contains_key(header::RETRY_AFTER));

    // Shutting down: new work is refused with a hint to come back.
    s.state.begin_shutdown();
    let (status, response, body) = s.send(execute(json!({"code": "1"}))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error(&body).0, "shutting_down");
    assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), "5");
    let (status, _, body) = s
        .send(request(
            Method::POST,
            "/v1/eval",
            Some(KEY),
            Some(json!({"expression": "1"})),
        ))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error(&body).0, "shutting_down");
    // Readiness says so too, with the same hint.
    let (status, response, body) = s
        .send(request(Method::GET, "/readyz", Some(KEY), None))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), "5");
    assert_eq!(s.audit_lines(), 0);
}

#[tokio::test]
async fn an_audit_log_that_cannot_be_written_refuses_work_saying_when_to_come_back() {
    // The log on a device that takes nothing (every write fails with ENOSPC): a full disk.
    let s = server(|config| {
        let path = config.state_dir.as_ref().unwrap().join("audit.jsonl");
        std::os::unix::fs::symlink("/dev/full", path).unwrap();
    });
    // The first execution fails to write its `started` line; the next is refused at once;
    // readiness names the log. Each 503 says when to ask again: the second after which the
    // log is tried again.
    for _ in 0..2 {
        let (status, response, body) = s.send(execute(json!({"code": "1"}))).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(error(&body).0, "unavailable");
        assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), "1");
    }
    let (status, response, body) = s
        .send(request(Method::GET, "/readyz", Some(KEY), None))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body["reasons"].to_string().contains("audit log"), "{body}");
    assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), "1");
}

#[tokio::test]
async fn services_answer_without_a_sandbox_where_none_is_needed() {
    let s = server(|_| {});
    let (status, _, body) = s
        .send(request(
            Method::POST,
            "/v1/eval",
            Some(KEY),
            Some(json!({"expression": "[2 ** 10 + 3, {1, 1}]"})),
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ok"], json!(true));
    assert_eq!(body["repr"], json!("[1027, {1}]"));

    let (status, _, body) = s
        .send(request(Method::GET, "/v1/sessions", Some(KEY), None))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"sessions": []}));

    let (status, _, body) = s
        .send(request(Method::GET, "/v1/environments", Some(KEY), None))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!([]));
    // An environment that does not exist, named by a request: the field at fault.
    let (status, _, body) = s
        .send(execute(json!({"code": "1", "environment": "nope"})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(error(&body).1, Some("environment"));

    // Metrics: for keys with the scope, in Prometheus' text format.
    let (status, _, _) = s
        .send(request(Method::GET, "/metrics", Some(READER), None))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let response = app(s.state.clone())
        .oneshot(request(Method::GET, "/metrics", Some(KEY), None))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(text.to_vec()).unwrap();
    let budget = s.state.config.http.max_buffered_bytes;
    assert!(
        text.contains(&format!("\nairlock_memory_budget_bytes {budget}\n")),
        "{text}"
    );
    assert!(
        text.contains("# TYPE airlock_sessions_open gauge"),
        "{text}"
    );

    let (status, _, body) = s
        .send(request(Method::GET, "/openapi.json", Some(KEY), None))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["paths"]["/v1/execute"]["post"].is_object());
    assert_eq!(s.audit_lines(), 0);
}
