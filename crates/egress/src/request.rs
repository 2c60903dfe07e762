//! The head a connection to the proxy opens with: a `CONNECT host:port` for a tunnel, or a
//! plain HTTP request by its absolute URI or `Host`, made into the head the upstream gets
//! (origin form, the authority that was checked, no proxy headers, `Connection: close`);
//! and the proxy's own answer when it refuses one ([`Refusal`]).

use std::io::{self, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::framing::{self, Body};
use crate::head::{Head, Role};
use crate::policy::Denied;

/// The whole head must arrive within this, however slowly it trickles.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// What one connection asked for.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) host: String,
    pub(crate) port: u16,
    /// For plain HTTP: the head to send upstream (origin-form, `Connection: close`) and
    /// where its body ends; `None` for a `CONNECT` tunnel.
    pub(crate) plain: Option<(Vec<u8>, Body)>,
    /// Bytes read past the head (a body's start, or a client's first TLS bytes).
    pub(crate) rest: Vec<u8>,
}

/// Why the proxy answers with an error instead of a tunnel.
pub(crate) struct Refusal {
    pub(crate) status: &'static str,
    pub(crate) outcome: &'static str,
    pub(crate) reason: &'static str,
    pub(crate) detail: String,
}

impl Refusal {
    pub(crate) fn denied(d: &Denied) -> Self {
        Refusal {
            status: "403 Forbidden",
            outcome: "denied",
            reason: d.reason(),
            detail: d.to_string(),
        }
    }

    pub(crate) fn failed(status: &'static str, reason: &'static str, detail: String) -> Self {
        Refusal {
            status,
            outcome: "failed",
            reason,
            detail,
        }
    }

    /// The HTTP answer the code reads.
    pub(crate) fn answer(&self) -> String {
        let body = format!(
            "airlock egress {}: {} ({})\n",
            self.outcome, self.detail, self.reason
        );
        format!(
            "HTTP/1.1 {}\r\nContent-Type: text/plain; charset=utf-8\r\n\
             X-Airlock-Egress: {}; reason={}\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            self.status,
            self.outcome,
            self.reason,
            body.len()
        )
    }
}

/// Reads and parses one request head.
pub(crate) fn read_request(client: &mut TcpStream) -> Result<Request, Refusal> {
    let bad = |detail: String| Refusal::failed("400 Bad Request", "bad_request", detail);
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + HEAD_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Refusal::failed(
                "408 Request Timeout",
                "bad_request",
                format!("no whole request head within {HEAD_TIMEOUT:?}"),
            ));
        }
        let _ = client.set_read_timeout(Some(left));
        let n = match client.read(&mut chunk) {
            Ok(0) => return Err(bad("the connection closed before a request".into())),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(bad(format!("reading the request: {e}"))),
        };
        buf.extend_from_slice(&chunk[..n]);
        match Head::parse(Role::Request, &buf) {
            Ok(Some((len, head))) => return build_request(&head, &buf[len..]),
            Ok(None) if buf.len() < Role::Request.max_head() => {}
            Ok(None) => {
                return Err(Refusal::failed(
                    "431 Request Header Fields Too Large",
                    "bad_request",
                    format!("a request head over {} bytes", Role::Request.max_head()),
                ))
            }
            Err(e) => return Err(bad(format!("not an HTTP request: {e}"))),
        }
    }
}

fn build_request(req: &Head, rest: &[u8]) -> Result<Request, Refusal> {
    let bad = |detail: String| Refusal::failed("400 Bad Request", "bad_request", detail);
    let method = req.first.clone();
    let target = req.second.as_str();
    let headers = req.as_httparse();
    if method == "CONNECT" {
        let (host, port) = split_authority(target, None)
            .ok_or_else(|| bad(format!("CONNECT needs host:port, not {target:?}")))?;
        return Ok(Request {
            method,
            host,
            port,
            plain: None,
            rest: rest.to_vec(),
        });
    }
    let (authority, path) = if let Some(after) = target.strip_prefix("http://") {
        let end = after.find(['/', '?']).unwrap_or(after.len());
        let path = &after[end..];
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else if path.is_empty() {
            "/".to_owned()
        } else {
            path.to_owned()
        };
        (after[..end].to_owned(), path)
    } else if target.starts_with('/') {
        let host = req
            .get("host")
            .next()
            .and_then(|value| std::str::from_utf8(value).ok())
            .ok_or_else(|| bad("a request without a Host".into()))?;
        (host.to_owned(), target.to_owned())
    } else {
        return Err(Refusal::failed(
            "400 Bad Request",
            "bad_request",
            format!("{target:?}: only http:// requests and CONNECT tunnels (use https:// through CONNECT)"),
        ));
    };
    let (host, port) = split_authority(&authority, Some(80))
        .ok_or_else(|| bad(format!("{authority:?} is not host[:port]")))?;
    let body = Body::of(&headers).map_err(|e| bad(e.to_string()))?;
    // Upstream sees the origin form, the authority that was checked, and no proxy headers.
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\n").into_bytes();
    framing::end_head(
        &mut head,
        &headers,
        &[
            "host",
            "connection",
            "proxy-connection",
            "proxy-authorization",
            "keep-alive",
            "upgrade",
        ],
    );
    Ok(Request {
        method,
        host,
        port,
        plain: Some((head, body)),
        rest: rest.to_vec(),
    })
}

/// `host:port`, `[v6]:port`, or without the port when `default` is given. No user info.
fn split_authority(authority: &str, default: Option<u16>) -> Option<(String, u16)> {
    if authority.is_empty() || authority.contains(['@', '/', ' ']) {
        return None;
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return None,
        };
        (format!("[{v6}]"), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (authority.to_owned(), None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0)?,
        None => default?,
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_strictly() {
        let s = |a: &str, d| split_authority(a, d);
        assert_eq!(s("pypi.org:443", None), Some(("pypi.org".into(), 443)));
        assert_eq!(s("[::1]:8080", None), Some(("[::1]".into(), 8080)));
        assert_eq!(s("example.com", Some(80)), Some(("example.com".into(), 80)));
        for bad in [
            "pypi.org",
            "user@pypi.org:443",
            "pypi.org:0",
            "pypi.org:x",
            "",
            "[::1]x",
        ] {
            assert_eq!(s(bad, None), None, "{bad}");
        }
    }
}
