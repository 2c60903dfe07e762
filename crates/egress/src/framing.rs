//! Where HTTP/1.1 messages end, for the plain proxy, which relays one request per
//! connection: the end of a request's body ([`Body`], RFC 9112 §6), so that not a byte past
//! it reaches the upstream, and the head of the upstream's answer ([`Answer`]), given
//! `Connection: close` so that the client sends its next request on a new connection.
//!
//! The body's reader is strict where readers are known to differ (request smuggling): one
//! `Content-Length` of digits, or `Transfer-Encoding: chunked` alone, never both; a chunk
//! size is hex digits and CRLF (no extension, no whitespace, no bare LF); the last chunk is
//! followed by an empty trailer section. Anything else is refused, so the proxy can never
//! think a body goes on where the upstream reads a second request.

use crate::head::{Head, Role};

/// Hex digits of a chunk size (a `u64`).
const MAX_SIZE_DIGITS: u8 = 16;

/// Ends a message's `head` with `headers`, less those named in `dropped` (any case), and
/// `Connection: close`.
pub fn end_head(head: &mut Vec<u8>, headers: &[httparse::Header<'_>], dropped: &[&str]) {
    for h in headers {
        if !dropped.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
            head.extend_from_slice(h.name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(h.value);
            head.extend_from_slice(b"\r\n");
        }
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
}

/// Why a request cannot be relayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("more than one Content-Length")]
    TwoLengths,
    #[error("Content-Length {0:?} is not a number of bytes")]
    BadLength(String),
    #[error("Transfer-Encoding {0:?}: only `chunked` is relayed")]
    BadTransferEncoding(String),
    #[error("both Transfer-Encoding and Content-Length")]
    LengthAndChunked,
    #[error("a chunk size that is not hex digits and CRLF (extensions are not relayed)")]
    BadChunkSize,
    #[error("a chunk not followed by CRLF")]
    BadChunkEnd,
    #[error("trailer fields after the last chunk (not relayed)")]
    Trailers,
}

/// How a request's body ends, as its headers say; fed the bytes that follow the head, it
/// says how many belong to the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// This many bytes are left (no `Content-Length`: none).
    Length(u64),
    /// Chunks, read to the last one.
    Chunked(Chunked),
}

/// Where a chunked body's reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunked {
    Size {
        value: u64,
        digits: u8,
    },
    SizeLf {
        value: u64,
    },
    Data {
        left: u64,
    },
    DataCr,
    DataLf,
    /// After the last chunk: the empty trailer section's CRLF.
    EndCr,
    EndLf,
    Done,
}

impl Body {
    /// The body a request head announces (`headers` as parsed).
    pub fn of(headers: &[httparse::Header<'_>]) -> Result<Body, Malformed> {
        let mut length = None;
        let mut chunked = false;
        for h in headers {
            let value = String::from_utf8_lossy(h.value);
            let value = value.trim_matches([' ', '\t']);
            if h.name.eq_ignore_ascii_case("content-length") {
                if length.is_some() {
                    return Err(Malformed::TwoLengths);
                }
                let digits = !value.is_empty()
                    && value.len() <= 19
                    && value.bytes().all(|b| b.is_ascii_digit());
                length = Some(
                    digits
                        .then(|| value.parse::<u64>().ok())
                        .flatten()
                        .ok_or_else(|| Malformed::BadLength(value.to_owned()))?,
                );
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                if chunked || !value.eq_ignore_ascii_case("chunked") {
                    return Err(Malformed::BadTransferEncoding(value.to_owned()));
                }
                chunked = true;
            }
        }
        match (chunked, length) {
            (true, Some(_)) => Err(Malformed::LengthAndChunked),
            (true, None) => Ok(Body::Chunked(Chunked::Size {
                value: 0,
                digits: 0,
            })),
            (false, n) => Ok(Body::Length(n.unwrap_or(0))),
        }
    }

    /// Whether the body has ended.
    pub fn done(&self) -> bool {
        matches!(self, Body::Length(0) | Body::Chunked(Chunked::Done))
    }

    /// How many of `data`'s first bytes belong to the body; the rest come after it.
    pub fn take(&mut self, data: &[u8]) -> Result<usize, Malformed> {
        match self {
            Body::Length(left) => {
                let n = (*left).min(data.len() as u64);
                *left -= n;
                Ok(n as usize)
            }
            Body::Chunked(state) => state.take(data),
        }
    }
}

impl Chunked {
    fn take(&mut self, data: &[u8]) -> Result<usize, Malformed> {
        let mut i = 0;
        while i < data.len() && *self != Chunked::Done {
            let b = data[i];
            *self = match *self {
                Chunked::Size { value, digits } => match (b as char).to_digit(16) {
                    Some(d) if digits < MAX_SIZE_DIGITS => Chunked::Size {
                        value: value << 4 | u64::from(d),
                        digits: digits + 1,
                    },
                    None if b == b'\r' && digits > 0 => Chunked::SizeLf { value },
                    _ => return Err(Malformed::BadChunkSize),
                },
                Chunked::SizeLf { value } => match b {
                    b'\n' if value == 0 => Chunked::EndCr,
                    b'\n' => Chunked::Data { left: value },
                    _ => return Err(Malformed::BadChunkSize),
                },
                Chunked::Data { left } => {
                    let n = left.min((data.len() - i) as u64);
                    i += n as usize;
                    *self = match left - n {
                        0 => Chunked::DataCr,
                        left => Chunked::Data { left },
                    };
                    continue;
                }
                Chunked::DataCr if b == b'\r' => Chunked::DataLf,
                Chunked::DataLf if b == b'\n' => Chunked::Size {
                    value: 0,
                    digits: 0,
                },
                Chunked::DataCr | Chunked::DataLf => return Err(Malformed::BadChunkEnd),
                Chunked::EndCr if b == b'\r' => Chunked::EndLf,
                Chunked::EndLf if b == b'\n' => Chunked::Done,
                Chunked::EndCr | Chunked::EndLf => return Err(Malformed::Trailers),
                Chunked::Done => unreachable!("the loop stops at the end"),
            };
            i += 1;
        }
        Ok(i)
    }
}

/// The upstream's answer on its way to the client: interim (1xx) heads pass as they are,
/// the final head with `Connection: close` in place of its own connection headers, and the
/// rest as it is. A head that does not parse, or is longer than an answer's may be, passes
/// as it is: the client's own reader judges it.
#[derive(Debug, Default)]
pub struct Answer {
    head: Vec<u8>,
    passing: bool,
}

/// What the bytes held so far make.
enum Step {
    Interim(usize),
    Final(Vec<u8>, usize),
    Wait,
    AsItIs,
}

impl Answer {
    /// Appends to `out` what may go to the client of `data`, read from the upstream.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.passing {
            out.extend_from_slice(data);
            return;
        }
        self.head.extend_from_slice(data);
        loop {
            match self.step() {
                Step::Interim(len) => {
                    out.extend(self.head.drain(..len));
                }
                Step::Final(head, len) => {
                    out.extend_from_slice(&head);
                    out.extend_from_slice(&self.head[len..]);
                    self.head = Vec::new();
                    self.passing = true;
                    return;
                }
                Step::Wait => return,
                Step::AsItIs => {
                    self.finish(out);
                    return;
                }
            }
        }
    }

    /// The upstream has closed: what was held goes on as it is.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.head);
        self.passing = true;
    }

    fn step(&self) -> Step {
        match Head::parse(Role::Answer, &self.head) {
            Ok(Some((len, answer))) => {
                let code = answer.status();
                if (100..200).contains(&code) && code != 101 {
                    return Step::Interim(len);
                }
                let mut head =
                    format!("HTTP/1.{} {code} {}\r\n", answer.minor, answer.second).into_bytes();
                end_head(
                    &mut head,
                    &answer.as_httparse(),
                    &["connection", "keep-alive", "proxy-connection"],
                );
                Step::Final(head, len)
            }
            Ok(None) if self.head.len() <= Role::Answer.max_head() => Step::Wait,
            _ => Step::AsItIs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(head: &str) -> Result<Body, Malformed> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut headers);
        req.parse(head.as_bytes()).unwrap();
        Body::of(req.headers)
    }

    /// Feeds `data` whole, then byte by byte: both must end the body at the same place.
    fn taken(body: &Body, data: &[u8]) -> Result<usize, Malformed> {
        let mut whole = body.clone();
        let at_once = whole.take(data);
        let mut bytewise = body.clone();
        let mut n = 0;
        for b in data {
            if bytewise.done() {
                break;
            }
            n += bytewise.take(std::slice::from_ref(b))?;
        }
        assert_eq!(at_once.as_ref().ok(), Some(&n), "{data:?}");
        at_once
    }

    #[test]
    fn a_body_ends_where_its_headers_say() {
        let get = body_of("GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert!(get.done());
        assert_eq!(taken(&get, b"GET /second HTTP/1.1\r\n\r\n"), Ok(0));
        let post = body_of("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert_eq!(taken(&post, b"helloGET /second HTTP/1.1\r\n\r\n"), Ok(5));
        let chunked = body_of("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap();
        let data = b"5\r\nhello\r\nA\r\n0123456789\r\n0\r\n\r\nGET /second HTTP/1.1\r\n\r\n";
        assert_eq!(
            taken(&chunked, data),
            Ok(data.len() - b"GET /second HTTP/1.1\r\n\r\n".len())
        );
        let mut done = chunked.clone();
        done.take(data).unwrap();
        assert!(done.done());
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        for (head, why) in [
            (
                "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                Malformed::TwoLengths,
            ),
            (
                "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
                Malformed::BadLength("+5".into()),
            ),
            (
                "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
                Malformed::BadLength("5, 5".into()),
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                Malformed::BadTransferEncoding("gzip, chunked".into()),
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                Malformed::BadTransferEncoding("chunked".into()),
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                Malformed::LengthAndChunked,
            ),
        ] {
            assert_eq!(body_of(head), Err(why), "{head:?}");
        }
        let chunked = Body::Chunked(Chunked::Size {
            value: 0,
            digits: 0,
        });
        for (data, why) in [
            (
                &b"5;ext=1\r\nhello\r\n0\r\n\r\n"[..],
                Malformed::BadChunkSize,
            ),
            (b"5 \r\nhello\r\n0\r\n\r\n", Malformed::BadChunkSize),
            (b" 5\r\nhello\r\n0\r\n\r\n", Malformed::BadChunkSize),
            (b"5\nhello\r\n0\r\n\r\n", Malformed::BadChunkSize),
            (b"\r\n", Malformed::BadChunkSize),
            (b"0x5\r\nhello\r\n0\r\n\r\n", Malformed::BadChunkSize),
            (b"10000000000000000\r\n", Malformed::BadChunkSize),
            (b"5\r\nhelloX\r\n0\r\n\r\n", Malformed::BadChunkEnd),
            (b"5\r\nhello\n0\r\n\r\n", Malformed::BadChunkEnd),
            (b"0\r\nHost: evil\r\n\r\n", Malformed::Trailers),
            (b"0\r\n\n", Malformed::Trailers),
        ] {
            let mut body = chunked.clone();
            assert_eq!(
                body.take(data),
                Err(why),
                "{:?}",
                String::from_utf8_lossy(data)
            );
        }
    }

    fn answer(chunks: &[&[u8]]) -> String {
        let mut a = Answer::default();
        let mut out = Vec::new();
        for c in chunks {
            a.feed(c, &mut out);
        }
        a.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_final_answer_head_says_the_connection_closes() {
        let up = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\nhi";
        let want = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi";
        assert_eq!(answer(&[up.as_bytes()]), want);
        // Split anywhere, the same.
        for at in 1..up.len() {
            let (a, b) = up.as_bytes().split_at(at);
            assert_eq!(answer(&[a, b]), want, "split at {at}");
        }
        // Interim answers pass as they are, the final one is rewritten.
        let up = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            answer(&[up.as_bytes()]),
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        // What does not parse passes as it is.
        assert_eq!(answer(&[b"garbage\r\n\r\nmore"]), "garbage\r\n\r\nmore");
        assert_eq!(
            answer(&[b"HTTP/1.1 200 OK\r\nX: "]),
            "HTTP/1.1 200 OK\r\nX: "
        );
    }
}
