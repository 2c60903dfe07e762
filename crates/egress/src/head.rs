//! One reader of HTTP/1.1 heads for the proxy's every direction, behind a role (as hyper's
//! `role.rs`): the request a connection opens with, the requests on an intercepted
//! connection, and the upstream's answers to both. A head is parsed whole once its end has
//! come, under the limits of its role.

/// Largest request head (request line and headers).
const MAX_REQUEST_HEAD: usize = 16 * 1024;
const MAX_REQUEST_HEADERS: usize = 64;
/// Largest answer head.
const MAX_ANSWER_HEAD: usize = 64 * 1024;
const MAX_ANSWER_HEADERS: usize = 128;

/// Which head is read, and so its first line and its limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// The code's request.
    Request,
    /// The upstream's answer.
    Answer,
}

impl Role {
    /// The most bytes a head of this role may take.
    pub fn max_head(self) -> usize {
        match self {
            Role::Request => MAX_REQUEST_HEAD,
            Role::Answer => MAX_ANSWER_HEAD,
        }
    }

    fn max_headers(self) -> usize {
        match self {
            Role::Request => MAX_REQUEST_HEADERS,
            Role::Answer => MAX_ANSWER_HEADERS,
        }
    }
}

/// A head as read: its first line's parts and its headers.
#[derive(Debug)]
pub(crate) struct Head {
    /// The method, or for an answer the status code.
    pub first: String,
    /// The target, or for an answer the reason phrase.
    pub second: String,
    pub minor: u8,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Head {
    /// The head `bytes` begin with, and its length in them; `None` while its end has not
    /// come. An error for bytes that are no head of `role` (or have too many headers).
    pub fn parse(role: Role, bytes: &[u8]) -> Result<Option<(usize, Head)>, httparse::Error> {
        let mut storage = [httparse::EMPTY_HEADER; MAX_ANSWER_HEADERS];
        let headers = &mut storage[..role.max_headers()];
        let complete = |status| match status {
            httparse::Status::Complete(len) => Some(len),
            httparse::Status::Partial => None,
        };
        match role {
            Role::Request => {
                let mut req = httparse::Request::new(headers);
                let Some(len) = complete(req.parse(bytes)?) else {
                    return Ok(None);
                };
                let (method, target) = (req.method.unwrap_or_default(), req.path);
                let head = Head::new(method, target.unwrap_or_default(), req.version, req.headers);
                Ok(Some((len, head)))
            }
            Role::Answer => {
                let mut res = httparse::Response::new(headers);
                let Some(len) = complete(res.parse(bytes)?) else {
                    return Ok(None);
                };
                let code = res.code.unwrap_or_default().to_string();
                let head = Head::new(
                    &code,
                    res.reason.unwrap_or_default(),
                    res.version,
                    res.headers,
                );
                Ok(Some((len, head)))
            }
        }
    }

    fn new(
        first: &str,
        second: &str,
        version: Option<u8>,
        headers: &[httparse::Header<'_>],
    ) -> Head {
        Head {
            first: first.to_owned(),
            second: second.to_owned(),
            minor: version.unwrap_or(1),
            headers: headers
                .iter()
                .map(|h| (h.name.to_owned(), h.value.to_vec()))
                .collect(),
        }
    }

    /// An answer's status code (0 for a request).
    pub fn status(&self) -> u16 {
        self.first.parse().unwrap_or(0)
    }

    /// The values of every `name` header, in order.
    pub fn get<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// Comma-separated tokens of every `name` header, lower-case.
    pub fn tokens(&self, name: &str) -> Vec<String> {
        self.get(name)
            .flat_map(|v| {
                String::from_utf8_lossy(v)
                    .split(',')
                    .map(|t| t.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .filter(|t| !t.is_empty())
            .collect()
    }

    /// The headers as the body's framing reads them.
    pub fn as_httparse(&self) -> Vec<httparse::Header<'_>> {
        self.headers
            .iter()
            .map(|(n, v)| httparse::Header {
                name: n.as_str(),
                value: v.as_slice(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_headers(first: &str, n: usize) -> Vec<u8> {
        let mut head = format!("{first}\r\n");
        for i in 0..n {
            head.push_str(&format!("X-{i}: {i}\r\n"));
        }
        head.push_str("\r\n");
        head.into_bytes()
    }

    #[test]
    fn each_role_reads_its_own_first_line_under_its_own_limits() {
        let request = with_headers("GET /a?b HTTP/1.0", MAX_REQUEST_HEADERS);
        let (len, head) = Head::parse(Role::Request, &request).unwrap().unwrap();
        assert_eq!(len, request.len());
        assert_eq!((head.first.as_str(), head.second.as_str()), ("GET", "/a?b"));
        assert_eq!((head.minor, head.headers.len()), (0, MAX_REQUEST_HEADERS));
        assert_eq!(head.get("x-3").collect::<Vec<_>>(), [b"3"]);
        let over = with_headers("GET / HTTP/1.1", MAX_REQUEST_HEADERS + 1);
        assert!(Head::parse(Role::Request, &over).is_err());

        let answer = with_headers("HTTP/1.1 404 Not Found", MAX_ANSWER_HEADERS);
        let (_, head) = Head::parse(Role::Answer, &answer).unwrap().unwrap();
        assert_eq!((head.status(), head.second.as_str()), (404, "Not Found"));
        assert_eq!(head.headers.len(), MAX_ANSWER_HEADERS);
        let over = with_headers("HTTP/1.1 200 OK", MAX_ANSWER_HEADERS + 1);
        assert!(Head::parse(Role::Answer, &over).is_err());

        assert!(
            Head::parse(Role::Answer, &request).is_err(),
            "a request is no answer"
        );
        let partial = &answer[..answer.len() - 1];
        assert!(Head::parse(Role::Answer, partial).unwrap().is_none());
    }
}
