//! The requests of one intercepted connection, relayed one by one: each judged on its own
//! (its `Host`, and an absolute target's authority, must be the name the `CONNECT` asked for
//! and the proxy checked; anything else is answered 421 and the connection closed), sent
//! with the credential's headers set (whatever the code sent under those names is dropped),
//! and its answer relayed with every form of the secret masked before the code reads it.
//! Redirects are passed to the code, never followed: its next request goes where it asks,
//! checked like any other.

use std::io::{Read, Write};
use std::sync::Arc;

use airlock_api::egress::normalize;

use crate::answer::{answer_head, plan, relay_body, OutFraming, Plan};
use crate::credentials::{Credential, CredentialRecord, HOP_BY_HOP};
use crate::framing::Body;
use crate::head::{Head, Role};
use crate::scrub::Scrubber;
use crate::side::{read_head, Side, Timed};
use crate::stop::{Meter, Stop};

/// Where the code's requests on one intercepted connection go, and what each is told.
pub(crate) struct Relay<'a> {
    pub credential: &'a Credential,
    /// Takes the credential's secrets out of every answer.
    pub scrubber: &'a Arc<Scrubber>,
    pub host: &'a str,
    pub port: u16,
    /// Told about each request that carried the credential.
    pub record: &'a mut dyn FnMut(CredentialRecord),
    /// The record's fields this connection fills in for each request.
    pub template: CredentialRecord,
}

impl Relay<'_> {
    /// Relays requests from `down` (the code) to `up` (the real host) until either closes.
    pub fn run<D: Read + Write, U: Read + Write + Timed>(
        &mut self,
        down: &mut Side<D>,
        up: &mut Side<U>,
        meter: &mut Meter<'_>,
    ) -> Result<(), Stop> {
        loop {
            let Some(head) = read_head(down, Role::Request, None)? else {
                return Ok(());
            };
            let (out_head, mut body, path, keep) = self.request(&head)?;
            if head.tokens("expect").iter().any(|t| t == "100-continue") {
                // Answered here: the upstream is asked nothing it would wait on.
                down.io
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    .map_err(Stop::io)?;
            }
            let mut record = self.template.clone();
            record.method = head.first.chars().take(32).collect();
            record.path = path;
            let before = (meter.out, meter.inn);
            let result = self.exchange(down, up, meter, &head, out_head, &mut body, &mut record);
            record.bytes_out = meter.out - before.0;
            record.bytes_in = meter.inn - before.1;
            (self.record)(record);
            let upstream_keeps = result?;
            if !(keep && upstream_keeps) {
                return Ok(());
            }
        }
    }

    /// Checks a request of the code's and makes the head the upstream gets; with its body's
    /// framing, its path for the audit log, and whether the code keeps the connection.
    #[allow(clippy::type_complexity)]
    fn request(&self, head: &Head) -> Result<(Vec<u8>, Body, String, bool), Stop> {
        let method = head.first.as_str();
        if method == "CONNECT" {
            return Err(Stop::reply(
                "405 Method Not Allowed",
                "bad_request",
                "CONNECT inside a tunnel",
            ));
        }
        if head.get("upgrade").next().is_some() {
            return Err(Stop::reply(
                "501 Not Implemented",
                "bad_request",
                "protocol upgrades are not relayed on a connection that carries a credential",
            ));
        }
        let authority = |a: &str| -> Result<(), Stop> {
            let mismatch = || {
                Stop::denied(
                    "421 Misdirected Request",
                    "host_mismatch",
                    format!(
                        "{a:?} is not {}:{}, the host this connection was checked for",
                        self.host, self.port
                    ),
                )
            };
            let (name, port) = match a.rsplit_once(':') {
                Some((n, p)) if !n.contains(':') => (n, p.parse::<u16>().map_err(|_| mismatch())?),
                None => (a, 443),
                _ => return Err(mismatch()),
            };
            let same = normalize(name).as_deref() == Some(self.host) && port == self.port;
            if same {
                Ok(())
            } else {
                Err(mismatch())
            }
        };
        let hosts: Vec<&[u8]> = head.get("host").collect();
        let [host] = hosts.as_slice() else {
            return Err(Stop::reply(
                "400 Bad Request",
                "bad_request",
                "a request needs exactly one Host",
            ));
        };
        authority(std::str::from_utf8(host).unwrap_or("\u{fffd}").trim())?;
        let target = head.second.as_str();
        let path = if target.starts_with('/') {
            target.to_owned()
        } else if let Some(rest) = target.strip_prefix("https://") {
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            if rest[..end].contains('@') {
                return Err(Stop::reply(
                    "400 Bad Request",
                    "bad_request",
                    "user info in a target",
                ));
            }
            authority(&rest[..end])?;
            match &rest[end..] {
                "" => "/".to_owned(),
                p if p.starts_with('?') => format!("/{p}"),
                p => p.to_owned(),
            }
        } else {
            return Err(Stop::denied(
                "421 Misdirected Request",
                "host_mismatch",
                format!("{target:?}: only a path, or https:// this host"),
            ));
        };
        let body = Body::of(&head.as_httparse())
            .map_err(|e| Stop::reply("400 Bad Request", "bad_request", e.to_string()))?;
        let connection = head.tokens("connection");
        let keep = if head.minor == 0 {
            connection.iter().any(|t| t == "keep-alive")
        } else {
            !connection.iter().any(|t| t == "close")
        };
        let authority_text = if self.port == 443 {
            self.host.to_owned()
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let mut out =
            format!("{method} {path} HTTP/1.1\r\nHost: {authority_text}\r\n").into_bytes();
        // Headers the code's `Connection` names are this hop's, never relayed.
        let named = head.tokens("connection");
        for (name, value) in &head.headers {
            let set_here = self
                .credential
                .headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case(name));
            // Ranges are dropped: two ranges of an answer that echoes the secret, each split
            // inside it, would each hold a part too short to be recognized.
            let dropped = set_here
                || named.iter().any(|n| name.eq_ignore_ascii_case(n))
                || name.eq_ignore_ascii_case("accept-encoding")
                || name.eq_ignore_ascii_case("expect")
                || name.eq_ignore_ascii_case("range")
                || name.eq_ignore_ascii_case("if-range")
                || (HOP_BY_HOP.iter().any(|n| name.eq_ignore_ascii_case(n))
                    && !name.eq_ignore_ascii_case("content-length")
                    && !name.eq_ignore_ascii_case("transfer-encoding"));
            if !dropped {
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
        }
        for h in &self.credential.headers {
            out.extend_from_slice(format!("{}: {}\r\n", h.name, h.value).as_bytes());
        }
        // Answers uncompressed: how well an answer that echoes the secret beside the code's
        // guesses compresses would tell the code the secret (BREACH), in its size and in
        // the pieces it comes in. One compressed anyway is decoded before it is scanned.
        out.extend_from_slice(b"Accept-Encoding: identity\r\n");
        if !keep {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        let audited = path
            .split('?')
            .next()
            .unwrap_or("")
            .chars()
            .take(256)
            .collect();
        Ok((out, body, audited, keep))
    }

    /// Sends one request and relays its answer; whether the connection may go on.
    #[allow(clippy::too_many_arguments)]
    fn exchange<D: Read + Write, U: Read + Write + Timed>(
        &self,
        down: &mut Side<D>,
        up: &mut Side<U>,
        meter: &mut Meter<'_>,
        request: &Head,
        out_head: Vec<u8>,
        body: &mut Body,
        record: &mut CredentialRecord,
    ) -> Result<bool, Stop> {
        // The head and the body's first bytes in one write: one TLS record for a small
        // request.
        let mut chunk = out_head;
        loop {
            if !body.done() && down.pending().is_empty() {
                if !chunk.is_empty() {
                    meter.sent(chunk.len())?;
                    up.io.write_all(&chunk).map_err(Stop::io)?;
                    chunk.clear();
                }
                if down.fill().map_err(Stop::io)? == 0 {
                    return Err(Stop::cut(
                        "connection_lost",
                        "the request's body was cut short",
                    ));
                }
            }
            let n = body
                .take(down.pending())
                .map_err(|e| Stop::cut("bad_request", e.to_string()))?;
            chunk.extend_from_slice(&down.pending()[..n]);
            down.consume(n);
            if body.done() {
                break;
            }
        }
        meter.sent(chunk.len())?;
        up.io.write_all(&chunk).map_err(Stop::io)?;
        up.io.flush().map_err(Stop::io)?;

        let scrubber = self.scrubber;
        loop {
            let Some(answer) = read_head(up, Role::Answer, Some(meter))? else {
                return Err(Stop::cut(
                    "connection_lost",
                    "the upstream closed before answering",
                ));
            };
            let status = answer.status();
            record.status = Some(status);
            if status == 101 {
                return Err(Stop::cut("bad_answer", "the upstream switched protocols"));
            }
            let head_only =
                request.first == "HEAD" || status == 204 || status == 304 || status < 200;
            let plan = if head_only {
                Plan::NoBody
            } else {
                plan(&answer)?
            };
            if let Plan::Refuse(coding) = &plan {
                return Err(Stop::reply(
                    "502 Bad Gateway",
                    "unscannable_encoding",
                    format!(
                        "the answer's Content-Encoding {coding:?} cannot be scanned for the \
                         credential's secret (gzip and deflate can)"
                    ),
                ));
            }
            let client_chunked = request.minor >= 1;
            let (mut out, framing) = answer_head(&answer, &plan, client_chunked);
            let upstream_closes = answer.tokens("connection").iter().any(|t| t == "close")
                || answer.minor == 0
                    && !answer
                        .tokens("connection")
                        .iter()
                        .any(|t| t == "keep-alive");
            let mut keep = !upstream_closes && framing != OutFraming::UntilClose;
            if status >= 200 && !keep {
                out.extend_from_slice(b"Connection: close\r\n");
            }
            out.extend_from_slice(b"\r\n");
            record.scrubbed += scrubber.mask(&mut out);
            down.io.write_all(&out).map_err(Stop::io)?;
            if status < 200 {
                continue;
            }
            if !head_only {
                let found = relay_body(down, up, meter, &plan, framing, scrubber)?;
                record.scrubbed += found;
            }
            down.io.flush().map_err(Stop::io)?;
            if framing == OutFraming::UntilClose {
                keep = false;
            }
            return Ok(keep);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::SetHeader;
    use crate::intercept::upstream_config;
    use std::io::{self, Read};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    const SECRET: &str = "s3cr3t/Tok+en=42";
    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: api.test\r\nAccept-Encoding: gzip, br\r\n\r\n";

    /// A peer that gives its bytes `step` at a time and keeps (the start of) what it is sent.
    struct Peer {
        input: Vec<u8>,
        at: usize,
        step: usize,
        output: Vec<u8>,
        largest_write: usize,
        /// The size of each write, in order.
        writes: Vec<usize>,
    }

    impl Timed for Peer {
        fn read_timeout(&self, _: Duration) {}
    }

    impl Read for Peer {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = (self.input.len() - self.at).min(buf.len()).min(self.step);
            buf[..n].copy_from_slice(&self.input[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    impl Write for Peer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.output.len() < 1 << 20 {
                self.output.extend_from_slice(buf);
            }
            self.largest_write = self.largest_write.max(buf.len());
            self.writes.push(buf.len());
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn peer(input: &[u8], step: usize) -> Side<Peer> {
        Side::new(Peer {
            input: input.to_vec(),
            at: 0,
            step,
            output: Vec::new(),
            largest_write: 0,
            writes: Vec::new(),
        })
    }

    fn credential() -> Credential {
        let upstream = upstream_config(rustls::RootCertStore::empty()).unwrap();
        Credential::new(
            "api",
            vec![airlock_api::egress::HostRule {
                host: "api.test".into(),
                ports: vec![443],
            }],
            vec![SetHeader {
                name: "Authorization".into(),
                value: format!("Bearer {SECRET}"),
                secret: SECRET.into(),
            }],
            Arc::new(upstream),
        )
        .unwrap()
    }

    struct Relayed {
        code: Side<Peer>,
        upstream: Side<Peer>,
        result: Result<(), Stop>,
        counted_in: u64,
    }

    /// The code sends `requests`, the upstream answers `answers`, each `step` bytes a read.
    fn relay(requests: &[u8], answers: &[u8], step: usize, max_in: u64) -> Relayed {
        let credential = credential();
        let mut told = |_: CredentialRecord| {};
        let (out, inn) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut meter = Meter {
            bytes_out: &out,
            bytes_in: &inn,
            max_out: u64::MAX,
            max_in,
            idle: Duration::from_secs(10),
            out: 0,
            inn: 0,
        };
        let mut code = peer(requests, step);
        let mut upstream = peer(answers, step);
        let scrubber = Arc::new(Scrubber::new(credential.secrets()));
        let result = Relay {
            credential: &credential,
            scrubber: &scrubber,
            host: "api.test",
            port: 443,
            record: &mut told,
            template: CredentialRecord::template(None, None, "k", "api", "api.test", 443),
        }
        .run(&mut code, &mut upstream, &mut meter);
        Relayed {
            code,
            upstream,
            result,
            counted_in: inn.load(Ordering::Relaxed),
        }
    }

    fn answer(coding: &str, body: &[u8]) -> Vec<u8> {
        let mut a = format!(
            "HTTP/1.1 200 OK\r\nContent-Encoding: {coding}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        a.extend_from_slice(body);
        a
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// The body the code got, de-chunked.
    fn body(code: &[u8]) -> Vec<u8> {
        let text = code.split(|&b| b == 0).next().unwrap();
        let at = text.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let mut rest = &text[at..];
        let mut out = Vec::new();
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
            if size == 0 {
                return out;
            }
            out.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
            rest = &rest[line_end + 2 + size + 2..];
        }
    }

    #[test]
    fn the_upstream_is_asked_for_answers_it_need_not_compress() {
        let r = relay(GET, &answer("identity", b"ok"), 1 << 15, 1 << 30);
        r.result.unwrap();
        let sent = String::from_utf8(r.upstream.io.output).unwrap();
        assert!(sent.contains("Accept-Encoding: identity\r\n"), "{sent}");
        assert!(!sent.contains("gzip"), "{sent}");
        assert!(sent.contains(&format!("Authorization: Bearer {SECRET}\r\n")));
    }

    #[test]
    fn a_coded_answer_inflates_in_bounded_pieces_counted_as_decoded() {
        // 64 MiB of zeros in 65 KB of gzip: never held whole, counted as what the code gets.
        let zeros = gzip(&vec![0u8; 64 << 20]);
        let r = relay(GET, &answer("gzip", &zeros), 1 << 15, 1 << 30);
        r.result.unwrap();
        assert!(
            r.code.io.largest_write <= 64 << 10,
            "{}",
            r.code.io.largest_write
        );
        assert!(r.counted_in >= 64 << 20, "{}", r.counted_in);
        // Past the budget, decoded bytes cut the connection.
        let r = relay(GET, &answer("gzip", &zeros), 1 << 15, 8 << 20);
        assert!(
            matches!(
                r.result,
                Err(Stop::Cut {
                    reason: "bytes_in_budget",
                    ..
                })
            ),
            "{:?}",
            r.result
        );
    }

    #[test]
    fn every_valid_coding_is_relayed_whole() {
        let mut two = gzip(b"first member, ");
        two.extend(gzip(b"second member"));
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(b"zlib, a byte at a time").unwrap();
        let zlib = z.finish().unwrap();
        let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        d.write_all(b"raw deflate").unwrap();
        let raw = d.finish().unwrap();
        for (coding, coded, plain, step) in [
            ("gzip", two, &b"first member, second member"[..], 1 << 15),
            ("deflate", zlib, b"zlib, a byte at a time", 1),
            ("deflate", raw, b"raw deflate", 1 << 15),
            ("gzip", Vec::new(), b"", 1 << 15),
        ] {
            let r = relay(GET, &answer(coding, &coded), step, 1 << 30);
            assert!(r.result.is_ok(), "{coding}: {:?}", r.result);
            assert_eq!(body(&r.code.io.output), plain, "{coding}");
        }
    }

    #[test]
    fn a_secret_in_a_coded_or_streamed_answer_is_masked_and_events_are_not_held() {
        let echo = format!("{{\"authorization\": \"Bearer {SECRET}\"}}");
        let r = relay(GET, &answer("gzip", &gzip(echo.as_bytes())), 3, 1 << 30);
        r.result.unwrap();
        let got = String::from_utf8(body(&r.code.io.output)).unwrap();
        assert_eq!(
            got,
            format!(
                "{{\"authorization\": \"Bearer {}\"}}",
                "*".repeat(SECRET.len())
            )
        );
    }

    #[test]
    fn the_pieces_of_an_answer_never_depend_on_whether_it_ends_with_part_of_the_secret() {
        // The code asks for answers that end with its guess: a prefix of the secret, and
        // another of the same length. Content-Length, chunked and close-delimited answers,
        // read in pieces of every size: the code gets the same writes of the same sizes.
        let pattern = |guess: &str, framing: &str, step: usize| -> Vec<usize> {
            let body = format!("hello {guess}");
            let answer = match framing {
                "length" => format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
                "chunked" => format!(
                    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n{:x}\r\n{guess}\r\n0\r\n\r\n",
                    guess.len()
                ),
                _ => format!("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{body}"),
            };
            let r = relay(GET, answer.as_bytes(), step, 1 << 30);
            r.result.unwrap();
            assert!(String::from_utf8_lossy(&r.code.io.output).contains(guess));
            r.code.io.writes
        };
        for framing in ["length", "chunked", "close"] {
            for step in [1, 2, 3, 5, 9, 64, 1 << 15] {
                for (right, wrong) in [("s3cr", "zzzz"), ("s3cr3t/Tok+en=4", "xxxxxxxxxxxxxxx")] {
                    assert_eq!(
                        pattern(right, framing, step),
                        pattern(wrong, framing, step),
                        "{framing}, {step} a read: {right:?} against {wrong:?}"
                    );
                }
            }
        }
    }
}
