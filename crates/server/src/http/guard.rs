//! What every request passes before a handler sees it, in this order: a request id; the Host
//! allow-list (against DNS rebinding); CORS and foreign origins; authentication and the
//! route's scope, as the route table says (`routes.rs`). Then one log line and the request
//! metrics, and the request's span when traces are on (`trace.rs`).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::http::error::{IntoHttp, REQUEST_ID};
use crate::http::routes::{self, Access};
use airlock_service::caller::{require, Caller, RequestId};
use airlock_service::config::Config;
use airlock_service::error::{Error, Kind};
use airlock_service::keys::{random_id, Key};
use airlock_service::metrics::event;
use airlock_service::SharedServices;

/// Set once a request on the connection presents a valid key (`serve.rs` keeps such
/// connections over anonymous ones at the connection cap).
#[derive(Clone, Debug)]
pub struct Authenticated(pub Arc<std::sync::atomic::AtomicBool>);

/// What the guard holds: the services, and the host names it answers for.
#[derive(Clone, Debug)]
pub struct Guarded {
    pub state: SharedServices,
    /// Lower-case host names (no port) accepted in the Host header.
    pub hosts: Arc<[String]>,
}

impl Guarded {
    pub fn new(state: SharedServices) -> Self {
        let hosts = allowed_hosts(&state.config).into();
        Guarded { state, hosts }
    }
}

/// localhost names, the listen address, and what the operator added.
fn allowed_hosts(config: &Config) -> Vec<String> {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let ip = config.listen.ip();
    if !ip.is_unspecified() {
        hosts.push(ip.to_string());
    }
    hosts.extend(config.allowed_hosts.iter().map(|h| h.to_ascii_lowercase()));
    hosts.sort();
    hosts.dedup();
    hosts
}

pub async fn guard(
    State(Guarded { state, hosts }): State<Guarded>,
    mut req: Request,
    next: Next,
) -> Response {
    let matched = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let route = matched.clone().unwrap_or_else(|| "unmatched".to_owned());
    let mut log = RequestLog {
        state: state.clone(),
        rid: random_id("rq_"),
        method: req.method().clone(),
        route,
        key: None,
        started: Instant::now(),
        status: None,
    };
    let origin = req.headers().get(header::ORIGIN).cloned();
    req.extensions_mut().insert(RequestId(log.rid.clone()));
    let span = crate::http::trace::begin(&state, &req, &log.route, &log.rid);

    let mut caller = None;
    // Errors made while answering carry the request's id (`http::error::REQUEST_ID`).
    let answered = REQUEST_ID.scope(log.rid.clone(), async {
        let checked = check(&state, &hosts, matched.as_deref(), &mut req);
        // A key without the route's scope is named in the log line, as any other.
        caller = req.extensions().get::<Caller>().map(|c| c.0.clone());
        log.key = caller.as_ref().map(|k| k.name().to_owned());
        match checked {
            Ok(Some(early)) => early,
            Ok(None) => next.run(req).await,
            Err(e) => e.into_http(),
        }
    });
    let response = answered.await;
    // The answer's memory counts until it is written out.
    let mut response = crate::http::answer::count(&state, caller.as_deref(), response);

    add_cors_headers(&state, origin, &mut response);
    if let Ok(v) = HeaderValue::from_str(&log.rid) {
        response.headers_mut().insert("x-request-id", v);
    }
    log.status = Some(response.status().as_u16());
    crate::http::trace::answered(&state, span, response)
}

/// The request's log line and metric, written when the request ends, also when it ends
/// because the client went away (the handler is then dropped mid-way).
struct RequestLog {
    state: SharedServices,
    rid: String,
    method: Method,
    route: String,
    key: Option<String>,
    started: Instant,
    status: Option<u16>,
}

/// The status recorded for a request whose client left before the answer (as nginx does).
const CLIENT_GONE: u16 = 499;

impl Drop for RequestLog {
    fn drop(&mut self) {
        let status = self.status.unwrap_or(CLIENT_GONE);
        self.state
            .metrics
            .http_requests
            .add(&[&self.route, &status.to_string()]);
        let took = self.started.elapsed();
        if self.status.is_some() {
            self.state
                .metrics
                .http_request_seconds
                .observe(&self.route, took);
        }
        let ms = took.as_millis() as u64;
        let key = self.key.as_deref().unwrap_or("-");
        if self.status.is_some() {
            tracing::info!(request_id = %self.rid, method = %self.method, route = %self.route, status, key, ms, "request");
        } else {
            tracing::warn!(request_id = %self.rid, method = %self.method, route = %self.route, status, key, ms, "request abandoned by the client");
        }
    }
}

/// `Ok(Some(response))` answers the request here (a CORS preflight); `Ok(None)` lets it on.
/// Who may call the route is the route table's to say (`routes::access`): no key for public
/// routes and those the configuration opens, else a valid key with the route's scope.
fn check(
    state: &SharedServices,
    hosts: &[String],
    matched: Option<&str>,
    req: &mut Request,
) -> Result<Option<Response>, Error> {
    let access = routes::access(matched, req.method());
    let keyless = match access {
        Access::Public => true,
        Access::Key { open, .. } => open.is_some_and(|open| open(&state.config, req.headers())),
    };
    // Keyless reads answer any Host: the kubelet and Prometheus send the pod's address, and
    // a page that rebinds a name to the server learns only what any client could.
    if !keyless {
        check_host(state, hosts, req.headers())?;
    }
    if let Some(response) = cors(state, req)? {
        return Ok(Some(response));
    }
    if !keyless {
        let key = authenticate(state, req.headers())?;
        if let Some(Authenticated(flag)) = req.extensions().get::<Authenticated>() {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let caller = Caller(key);
        req.extensions_mut().insert(caller.clone());
        if let Access::Key {
            scope: Some(scope), ..
        } = access
        {
            require(&caller, scope)?;
        }
    }
    Ok(None)
}

fn check_host(state: &SharedServices, hosts: &[String], headers: &HeaderMap) -> Result<(), Error> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let name = host_name(host).to_ascii_lowercase();
    if hosts.contains(&name) {
        return Ok(());
    }
    state.metrics.security_events.add(&[event::FOREIGN_HOST]);
    // Quoted (Debug): a Host value must not be able to add fields to a text log line.
    let shown: String = host.chars().take(100).collect();
    tracing::warn!(host = ?shown, "refused a request for a foreign Host");
    Err(Error::new(
        Kind::Misdirected,
        "misdirected_request",
        "this server does not answer for that Host (add it to allowed_hosts)",
    )
    .ends_connection())
}

/// The host part of a Host header: `name`, `name:port`, `[v6]` or `[v6]:port`. Anything
/// else after a `[v6]` leaves the header whole, which names no allowed host.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((name, "")) => name,
            Some((name, port))
                if port.len() > 1
                    && port.starts_with(':')
                    && port[1..].bytes().all(|b| b.is_ascii_digit()) =>
            {
                name
            }
            _ => host,
        };
    }
    host.rsplit_once(':').map_or(host, |(name, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            name
        } else {
            host
        }
    })
}

fn cors(state: &SharedServices, req: &Request) -> Result<Option<Response>, Error> {
    let Some(origin) = req.headers().get(header::ORIGIN) else {
        return Ok(None);
    };
    let origin = origin.to_str().unwrap_or("");
    let allowed = origin != "null"
        && state
            .config
            .cors
            .allowed_origins
            .iter()
            .any(|o| o == origin);
    if !allowed {
        // A browser on another site (or a sandboxed frame: `Origin: null`). Nothing here is
        // for it, preflight or not, and it gets no CORS headers.
        state.metrics.security_events.add(&[event::FOREIGN_ORIGIN]);
        return Err(Error::forbidden(
            "requests from this origin are not allowed",
        ));
    }
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if !preflight {
        return Ok(None);
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    let h = response.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        // MCP clients send their protocol version with every request.
        HeaderValue::from_static("authorization, content-type, mcp-protocol-version"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    Ok(Some(response))
}

/// The CORS headers for an allowed origin, on whatever the response is.
fn add_cors_headers(state: &SharedServices, origin: Option<HeaderValue>, response: &mut Response) {
    if state.config.cors.allowed_origins.is_empty() {
        return; // CORS is off: no CORS headers at all
    }
    let h = response.headers_mut();
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    let Some(origin) = origin else { return };
    let text = origin.to_str().unwrap_or("");
    if text != "null" && state.config.cors.allowed_origins.iter().any(|o| o == text) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        if state.config.cors.allow_credentials {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("x-request-id, retry-after"),
        );
    }
}

fn authenticate(state: &SharedServices, headers: &HeaderMap) -> Result<Arc<Key>, Error> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            // RFC 9110 11.1: the scheme is case-insensitive (`Bearer`, `bearer`, `BEARER`).
            let (scheme, key) = v.trim_start().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(key)
        })
        .map(str::trim);
    let (reason, error) = match presented {
        None => (
            "missing",
            Error::unauthorized("an API key is required: Authorization: Bearer <key>"),
        ),
        Some(key) => match state.keys.verify(key) {
            Some(k) => return Ok(k),
            None => ("invalid", Error::invalid_token("the API key is not valid")),
        },
    };
    state.metrics.security_events.add(&[event::AUTH_FAILURE]);
    // Never the key itself: only that it was missing or wrong.
    tracing::warn!(reason, "authentication failed");
    Err(error)
}

#[cfg(test)]
mod tests {
    use super::host_name;

    #[test]
    fn host_names_lose_their_port() {
        assert_eq!(host_name("localhost:8080"), "localhost");
        assert_eq!(host_name("LOCALHOST"), "LOCALHOST");
        assert_eq!(host_name("[::1]:8080"), "::1");
        assert_eq!(host_name("[::1]"), "::1");
        assert_eq!(host_name("evil.example:80"), "evil.example");
        assert_eq!(host_name("a:b"), "a:b");
    }
}
