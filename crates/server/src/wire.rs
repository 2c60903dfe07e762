//! A look at each request head on the wire, before hyper parses it. hyper accepts a request
//! carrying both `Transfer-Encoding` and `Content-Length` (it drops the length and reads
//! chunks); a proxy in front might read the length instead, and the difference is request
//! smuggling. So such a request is flagged here and refused by the service.
//!
//! To find the next head on a keep-alive connection the scanner skips `Content-Length` bytes
//! of body; it does not decode chunked bodies, so after a chunked request the service closes
//! the connection instead.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest head the scanner looks at; hyper is configured to refuse larger ones (`serve.rs`).
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header lines in a head, here and in hyper's parser alike.
const MAX_HEADERS: usize = 100;

/// What the scanner found, shared with the connection's service.
#[derive(Debug, Default)]
pub struct Findings {
    /// A head had both Transfer-Encoding and Content-Length.
    pub smuggling: AtomicBool,
    /// A head had a chunked body: the scanner stopped, the connection must close after it.
    pub close_after: AtomicBool,
}

/// How writes to the client go: what the socket took, and whether the last write had to
/// wait (the client is not taking what is sent). `serve.rs` cuts off slow readers with it.
#[derive(Debug, Default)]
pub struct Flow {
    written: AtomicU64,
    blocked: AtomicBool,
}

impl Flow {
    /// Bytes the socket has taken so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Whether the last write found the socket full.
    pub fn blocked(&self) -> bool {
        self.blocked.load(Ordering::Acquire)
    }

    fn after<T>(&self, poll: &Poll<io::Result<T>>, taken: impl Fn(&T) -> usize) {
        match poll {
            Poll::Pending => self.blocked.store(true, Ordering::Release),
            Poll::Ready(Ok(n)) => {
                self.written.fetch_add(taken(n) as u64, Ordering::AcqRel);
                self.blocked.store(false, Ordering::Release);
            }
            Poll::Ready(Err(_)) => {}
        }
    }
}

enum Scan {
    Head(Vec<u8>),
    Body(u64),
    Stopped,
}

pub struct Guarded<S> {
    inner: S,
    scan: Scan,
    findings: Arc<Findings>,
    flow: Arc<Flow>,
}

impl<S> Guarded<S> {
    pub fn new(inner: S, findings: Arc<Findings>, flow: Arc<Flow>) -> Self {
        Guarded {
            inner,
            scan: Scan::Head(Vec::new()),
            findings,
            flow,
        }
    }

    fn observe(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.scan {
                Scan::Stopped => return,
                Scan::Body(left) => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    if *left == 0 {
                        self.scan = Scan::Head(Vec::new());
                    }
                }
                Scan::Head(head) => {
                    let before = head.len();
                    head.extend_from_slice(bytes);
                    // A head ends at a newline: only then is it worth parsing again.
                    if !bytes.contains(&b'\n') {
                        if head.len() > MAX_HEAD {
                            self.stop();
                        }
                        return;
                    }
                    let end = match head_end(head) {
                        HeadEnd::Complete(end) => end,
                        HeadEnd::Partial if head.len() <= MAX_HEAD => return,
                        HeadEnd::Partial | HeadEnd::Invalid => {
                            // hyper refuses it too; nothing after it on this connection.
                            self.stop();
                            return;
                        }
                    };
                    let consumed = end - before;
                    let next = match inspect(&head[..end]) {
                        Head::Smuggling => {
                            self.findings.smuggling.store(true, Ordering::SeqCst);
                            Scan::Stopped
                        }
                        Head::Chunked | Head::Unparsable => {
                            self.findings.close_after.store(true, Ordering::SeqCst);
                            Scan::Stopped
                        }
                        Head::Length(0) => Scan::Head(Vec::new()),
                        Head::Length(n) => Scan::Body(n),
                    };
                    self.scan = next;
                    bytes = &bytes[consumed..];
                }
            }
        }
    }

    /// Stops scanning; the connection closes after the request in progress.
    fn stop(&mut self) {
        self.findings.close_after.store(true, Ordering::SeqCst);
        self.scan = Scan::Stopped;
    }
}

enum HeadEnd {
    Complete(usize),
    Partial,
    Invalid,
}

/// Where a head ends, found the way hyper finds it (httparse: bare LF line ends included).
fn head_end(buf: &[u8]) -> HeadEnd {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => HeadEnd::Complete(n),
        Ok(httparse::Status::Partial) => HeadEnd::Partial,
        Err(_) => HeadEnd::Invalid,
    }
}

enum Head {
    Smuggling,
    Chunked,
    Unparsable,
    Length(u64),
}

fn inspect(head: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(head), Ok(httparse::Status::Complete(_))) {
        return Head::Unparsable;
    }
    let mut te = false;
    let mut cl = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            te = true;
        } else if h.name.eq_ignore_ascii_case("content-length") {
            cl = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .or(Some(u64::MAX));
        }
    }
    match (te, cl) {
        (true, Some(_)) => Head::Smuggling,
        (true, None) => Head::Chunked,
        (false, Some(u64::MAX)) => Head::Unparsable,
        (false, Some(n)) => Head::Length(n),
        (false, None) => Head::Length(0),
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &poll {
            let new = buf.filled()[before..].to_vec();
            self.observe(&new);
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.flow.after(&poll, |n| *n);
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.flow.after(&poll, |n| *n);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&[u8]]) -> (bool, bool) {
        let findings = Arc::new(Findings::default());
        let mut g = Guarded::new((), findings.clone(), Arc::default());
        for c in chunks {
            g.observe(c);
        }
        (
            findings.smuggling.load(Ordering::SeqCst),
            findings.close_after.load(Ordering::SeqCst),
        )
    }

    #[test]
    fn both_lengths_are_flagged_even_split_across_reads() {
        let req = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(scan(&[req]), (true, false));
        let (a, b) = req.split_at(30);
        assert_eq!(scan(&[a, b]), (true, false));
    }

    #[test]
    fn keep_alive_heads_are_found_past_length_bodies() {
        let first = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcd";
        let second = b"POST / HTTP/1.1\r\nHost: x\r\ncontent-length: 1\r\nTRANSFER-ENCODING: chunked\r\n\r\n";
        assert_eq!(scan(&[first, second]), (true, false));
        assert_eq!(scan(&[first]), (false, false));
    }

    #[test]
    fn bare_lf_heads_are_read_as_hyper_reads_them() {
        let req =
            b"POST / HTTP/1.1\nHost: x\nContent-Length: 5\nTransfer-Encoding: chunked\n\n0\r\n\r\n";
        assert_eq!(scan(&[req]), (true, false));
    }

    #[test]
    fn a_head_too_large_to_scan_closes_the_connection() {
        let mut big = b"GET / HTTP/1.1\r\nX-Pad: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        assert_eq!(scan(&[&big]), (false, true));
        let dripped: Vec<&[u8]> = big.chunks(1000).collect();
        assert_eq!(scan(&dripped), (false, true));
    }

    #[test]
    fn chunked_requests_close_the_connection_after_them() {
        let req = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n";
        assert_eq!(scan(&[req]), (false, true));
    }
}
