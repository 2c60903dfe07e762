//! An intercepted answer on its way to the code: how its body is read (its framing and
//! content coding, [`plan`]), the head the code gets ([`answer_head`]), and its body relayed
//! ([`relay_body`]): decoded in bounded pieces, counted, scrubbed of the credential's secrets,
//! and framed again.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::head::Head;
use crate::scrub::{ScrubStream, Scrubber};
use crate::side::{Side, Timed};
use crate::stop::{Meter, Stop};

/// The pieces a decoded answer goes on in.
const CODED_UNIT: usize = 16 * 1024;

/// How an answer's body is read, and what it is decoded from.
pub(crate) enum Plan {
    NoBody,
    Body {
        framing: InFraming,
        coding: Coding,
    },
    /// A content coding the proxy cannot read.
    Refuse(String),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum InFraming {
    Length(u64),
    Chunked,
    UntilClose,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum OutFraming {
    None,
    /// The same length (masking keeps lengths).
    Length,
    Chunked,
    UntilClose,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Coding {
    Identity,
    Gzip,
    Deflate,
}

pub(crate) fn plan(answer: &Head) -> Result<Plan, Stop> {
    let te = answer.tokens("transfer-encoding");
    let lengths: Vec<&[u8]> = answer.get("content-length").collect();
    let framing = if !te.is_empty() {
        if te.last().map(String::as_str) != Some("chunked") || te.len() > 1 {
            return Err(Stop::cut(
                "bad_answer",
                format!("Transfer-Encoding {te:?}: only chunked is relayed"),
            ));
        }
        InFraming::Chunked
    } else if let Some(first) = lengths.first() {
        let parse = |v: &[u8]| {
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        let n = parse(first)
            .ok_or_else(|| Stop::cut("bad_answer", "a Content-Length that is not a number"))?;
        if lengths.iter().any(|v| parse(v) != Some(n)) {
            return Err(Stop::cut("bad_answer", "Content-Lengths that differ"));
        }
        InFraming::Length(n)
    } else {
        InFraming::UntilClose
    };
    let codings: Vec<String> = answer
        .tokens("content-encoding")
        .into_iter()
        .filter(|c| c != "identity")
        .collect();
    let coding = match codings.as_slice() {
        [] => Coding::Identity,
        [c] if c == "gzip" || c == "x-gzip" => Coding::Gzip,
        [c] if c == "deflate" => Coding::Deflate,
        _ => return Ok(Plan::Refuse(codings.join(", "))),
    };
    Ok(Plan::Body { framing, coding })
}

/// The head the code gets: the upstream's, less what the proxy changes of its framing.
pub(crate) fn answer_head(
    answer: &Head,
    plan: &Plan,
    client_chunked: bool,
) -> (Vec<u8>, OutFraming) {
    let framing = match plan {
        Plan::NoBody | Plan::Refuse(_) => OutFraming::None,
        Plan::Body {
            framing: InFraming::Length(_),
            coding: Coding::Identity,
        } => OutFraming::Length,
        Plan::Body {
            framing: InFraming::UntilClose,
            ..
        } => OutFraming::UntilClose,
        Plan::Body { .. } if client_chunked => OutFraming::Chunked,
        Plan::Body { .. } => OutFraming::UntilClose,
    };
    let decoded = matches!(plan, Plan::Body { coding, .. } if *coding != Coding::Identity);
    let mut out = format!("HTTP/1.1 {} {}\r\n", answer.first, answer.second).into_bytes();
    for (name, value) in &answer.headers {
        let lower = name.to_ascii_lowercase();
        let dropped = match lower.as_str() {
            "connection" | "keep-alive" | "proxy-connection" | "trailer" | "upgrade" => true,
            "transfer-encoding" => framing != OutFraming::None,
            "content-length" => framing != OutFraming::None && framing != OutFraming::Length,
            "content-encoding" | "content-md5" | "digest" | "repr-digest" | "content-digest" => {
                decoded
            }
            _ => false,
        };
        if !dropped {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
    if framing == OutFraming::Chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    (out, framing)
}

/// Where an answer's decoded bytes go, as they come: counted (when the answer was coded: the
/// decoded bytes count against the bytes-in budget, not the compressed ones), scrubbed and
/// framed for the code. A decoder writes at most its buffer's worth at a time, so an answer
/// that inflates a thousandfold is never held whole.
struct Emitter<'a, D> {
    down: &'a mut Side<D>,
    scrub: ScrubStream,
    framing: OutFraming,
    /// The execution's bytes-in account and budget, for a coded answer's decoded bytes.
    counted: Option<(&'a AtomicU64, u64)>,
    decoded: u64,
    /// A coded answer goes on in pieces of this size only (the last one excepted): how a
    /// compressed stream's pieces inflate would tell how well the secret beside the code's
    /// guesses compresses.
    unit: Option<usize>,
    pending: Vec<u8>,
    /// Why writing stopped (the decoder sees only an `io::Error`).
    stop: Option<Stop>,
}

impl<D: Read + Write> Emitter<'_, D> {
    fn send(&mut self, clean: Vec<u8>, last: bool) -> Result<(), Stop> {
        let (clean, unit) = match self.unit {
            Some(unit) => {
                self.pending.extend_from_slice(&clean);
                let whole = if last {
                    self.pending.len()
                } else {
                    self.pending.len() / unit * unit
                };
                let rest = self.pending.split_off(whole);
                (std::mem::replace(&mut self.pending, rest), unit)
            }
            None => (clean, usize::MAX),
        };
        // A coded answer's units each go in a write of their own.
        let mut pieces = clean.chunks(unit).peekable();
        while pieces.peek().is_some() || last {
            let piece = pieces.next().unwrap_or_default();
            let end = last && pieces.peek().is_none();
            let mut out = Vec::with_capacity(piece.len() + 16);
            if self.framing == OutFraming::Chunked {
                if !piece.is_empty() {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                }
                if end {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
            } else {
                out.extend_from_slice(piece);
            }
            if !out.is_empty() {
                self.down.io.write_all(&out).map_err(Stop::io)?;
                // What may be all of a streamed event goes now, not with the next one.
                self.down.io.flush().map_err(Stop::io)?;
            }
            if end {
                break;
            }
        }
        Ok(())
    }

    fn take(&mut self, data: &[u8]) -> Result<(), Stop> {
        let n = data.len() as u64;
        self.decoded += n;
        if let Some((account, max)) = self.counted {
            if account.fetch_add(n, Ordering::Relaxed) + n > max {
                return Err(Stop::Cut {
                    denied: true,
                    reason: "bytes_in_budget",
                    detail: Some("the decoded answer is over the bytes-in budget".into()),
                });
            }
        }
        let clean = self.scrub.feed(data, Instant::now());
        self.send(clean, false)
    }

    /// What the scrubber held long enough goes on.
    fn due(&mut self, now: Instant) -> Result<(), Stop> {
        let clean = self.scrub.due(now);
        self.send(clean, false)
    }

    /// The answer ended: the rest, and the last chunk.
    fn end(&mut self) -> Result<(), Stop> {
        let clean = self.scrub.finish();
        self.send(clean, true)
    }
}

impl<D: Read + Write> Write for Emitter<'_, D> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.stop.is_some() {
            return Err(io::Error::other("stopped"));
        }
        match self.take(data) {
            Ok(()) => Ok(data.len()),
            Err(stop) => {
                self.stop = Some(stop);
                Err(io::Error::other("stopped"))
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Decodes a content coding into `W` as its bytes come.
enum Decoder<W: Write> {
    Identity(W),
    Gzip(flate2::write::MultiGzDecoder<W>),
    Zlib(flate2::write::ZlibDecoder<W>),
    Raw(flate2::write::DeflateDecoder<W>),
    /// Deflate before its first two bytes tell zlib from raw.
    Deflate(Vec<u8>, Option<W>),
}

impl<W: Write> Decoder<W> {
    fn new(coding: Coding, sink: W) -> Self {
        match coding {
            Coding::Identity => Decoder::Identity(sink),
            Coding::Gzip => Decoder::Gzip(flate2::write::MultiGzDecoder::new(sink)),
            Coding::Deflate => Decoder::Deflate(Vec::new(), Some(sink)),
        }
    }

    fn sink(&mut self) -> &mut W {
        match self {
            Decoder::Identity(w) => w,
            Decoder::Gzip(d) => d.get_mut(),
            Decoder::Zlib(d) => d.get_mut(),
            Decoder::Raw(d) => d.get_mut(),
            Decoder::Deflate(_, w) => w.as_mut().expect("the sink until decided"),
        }
    }

    fn feed(&mut self, data: &[u8]) -> io::Result<()> {
        if let Decoder::Deflate(first, sink) = self {
            first.extend_from_slice(data);
            if first.len() < 2 {
                return Ok(());
            }
            // A zlib stream starts with a header whose check bits make it a multiple of 31.
            let zlib =
                first[0] & 0x0f == 8 && (u16::from(first[0]) << 8 | u16::from(first[1])) % 31 == 0;
            let first = std::mem::take(first);
            let sink = sink.take().expect("the sink until decided");
            *self = if zlib {
                Decoder::Zlib(flate2::write::ZlibDecoder::new(sink))
            } else {
                Decoder::Raw(flate2::write::DeflateDecoder::new(sink))
            };
            return self.feed(&first);
        }
        match self {
            Decoder::Identity(w) => w.write_all(data),
            Decoder::Gzip(d) => d.write_all(data),
            Decoder::Zlib(d) => d.write_all(data),
            Decoder::Raw(d) => d.write_all(data),
            Decoder::Deflate(..) => unreachable!("decided above"),
        }
    }

    /// The coded stream ended; `fed`: whether it had any byte (an empty body is empty
    /// whatever its coding says).
    fn finish(&mut self, fed: bool) -> io::Result<()> {
        match self {
            _ if !fed => Ok(()),
            Decoder::Identity(_) => Ok(()),
            Decoder::Gzip(d) => d.try_finish(),
            Decoder::Zlib(d) => d.try_finish(),
            Decoder::Raw(d) => d.try_finish(),
            Decoder::Deflate(..) => Err(io::Error::other("a deflate stream of one byte")),
        }
    }
}

impl<D: Read + Write> Decoder<Emitter<'_, D>> {
    /// Why decoding (or writing what it decoded) failed with `e`: the emitter's own reason,
    /// or the answer's coding.
    fn stop(&mut self, e: io::Error) -> Stop {
        self.sink()
            .stop
            .take()
            .unwrap_or_else(|| Stop::cut("bad_answer", format!("decoding the answer: {e}")))
    }
}

/// Relays an answer's body: read as its framing says, decoded, scrubbed, framed for the
/// code. Returns how many occurrences of the secret were masked.
pub(crate) fn relay_body<D: Read + Write, U: Read + Write + Timed>(
    down: &mut Side<D>,
    up: &mut Side<U>,
    meter: &mut Meter<'_>,
    plan: &Plan,
    framing: OutFraming,
    scrubber: &Arc<Scrubber>,
) -> Result<u64, Stop> {
    let Plan::Body {
        framing: in_framing,
        coding,
    } = plan
    else {
        return Ok(0);
    };
    let coded = *coding != Coding::Identity;
    let emitter = Emitter {
        down,
        scrub: scrubber.stream(),
        framing,
        counted: coded.then_some((meter.bytes_in, meter.max_in)),
        decoded: 0,
        unit: coded.then_some(CODED_UNIT),
        pending: Vec::new(),
        stop: None,
    };
    let mut decoder = Decoder::new(*coding, emitter);
    let mut fed = false;
    let result = (|| -> Result<(), Stop> {
        // Reads more of the answer (`body`: of its body, not its framing). While the
        // scrubber holds bytes, a read waits only until they are due, sends them on, and
        // reads again, up to the idle timeout in all.
        let fill = |up: &mut Side<U>,
                    decoder: &mut Decoder<Emitter<'_, D>>,
                    meter: &mut Meter<'_>,
                    body: bool|
         -> Result<usize, Stop> {
            let asked = Instant::now();
            let n = loop {
                let now = Instant::now();
                let idle_left = meter.idle.saturating_sub(now - asked);
                let due = decoder.sink().scrub.next_due();
                let wait = due.map_or(idle_left, |d| {
                    idle_left.min(d.saturating_duration_since(now))
                });
                up.io.read_timeout(wait);
                match up.fill() {
                    Ok(n) => break n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) && due.is_some()
                            && asked.elapsed() < meter.idle =>
                    {
                        decoder.sink().due(Instant::now())?;
                    }
                    Err(e) => return Err(Stop::io(e)),
                }
            };
            if coded && body {
                // A coded answer's compressed bytes are not counted: its decoded ones are.
                meter.inn += n as u64;
            } else {
                meter.received(n)?;
            }
            Ok(n)
        };
        // A chunk-size or trailer line.
        let line = |up: &mut Side<U>,
                    decoder: &mut Decoder<Emitter<'_, D>>,
                    meter: &mut Meter<'_>|
         -> Result<Vec<u8>, Stop> {
            loop {
                if let Some(line) = up.take_line()? {
                    return Ok(line);
                }
                if fill(up, decoder, meter, false)? == 0 {
                    return Err(Stop::cut(
                        "bad_answer",
                        "the answer ended inside a chunk line",
                    ));
                }
            }
        };
        let pass = |decoder: &mut Decoder<Emitter<'_, D>>,
                    fed: &mut bool,
                    piece: &[u8]|
         -> Result<(), Stop> {
            *fed |= !piece.is_empty();
            decoder.feed(piece).map_err(|e| decoder.stop(e))
        };
        // `left` bytes of body (a length's or a chunk's), or all until the close.
        let mut relay = |up: &mut Side<U>,
                         decoder: &mut Decoder<Emitter<'_, D>>,
                         meter: &mut Meter<'_>,
                         left: Option<u64>|
         -> Result<(), Stop> {
            let mut left = left;
            while left != Some(0) {
                if up.pending().is_empty() && fill(up, decoder, meter, true)? == 0 {
                    return match left {
                        None => Ok(()),
                        Some(_) => Err(Stop::cut(
                            "connection_lost",
                            "the answer's body was cut short",
                        )),
                    };
                }
                let n = left.map_or(up.pending().len(), |l| {
                    (up.pending().len() as u64).min(l) as usize
                });
                pass(decoder, &mut fed, &up.pending()[..n])?;
                up.consume(n);
                left = left.map(|l| l - n as u64);
            }
            Ok(())
        };
        match *in_framing {
            InFraming::Length(left) => relay(up, &mut decoder, meter, Some(left))?,
            InFraming::UntilClose => relay(up, &mut decoder, meter, None)?,
            InFraming::Chunked => loop {
                let line_bytes = line(up, &mut decoder, meter)?;
                let text = String::from_utf8_lossy(&line_bytes);
                let size = text.split(';').next().unwrap_or("").trim();
                let left = u64::from_str_radix(size, 16)
                    .map_err(|_| Stop::cut("bad_answer", "a chunk size that is not hex"))?;
                if left == 0 {
                    // Trailers are dropped: the code gets the body, re-framed.
                    while !line(up, &mut decoder, meter)?.is_empty() {}
                    break;
                }
                relay(up, &mut decoder, meter, Some(left))?;
                if !line(up, &mut decoder, meter)?.is_empty() {
                    return Err(Stop::cut("bad_answer", "a chunk not followed by CRLF"));
                }
            },
        }
        decoder.finish(fed).map_err(|e| decoder.stop(e))?;
        decoder.sink().end()
    })();
    // The next answer's head is read with the idle timeout again.
    up.io.read_timeout(meter.idle);
    let found = decoder.sink().scrub.found;
    result.map(|()| found)
}
