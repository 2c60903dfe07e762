//! Taking a secret out of what an upstream answers, whatever form it is echoed in.
//!
//! [`Scrubber`] recognizes a secret byte by byte: each of its bytes may be written in any of
//! its escaped forms, mixed freely. Rather than a list of spellings (which grows with the
//! secret's symbols and had to be capped), a small decoder reads the bytes as they come,
//! following every way they could be read at once (as in a Thompson NFA simulation), and a
//! goal checks each decoded value against the secret:
//! - a byte as it is (ASCII case ignored), `+` for a space, percent-encoding (`%2B`),
//!   JSON and Python escapes (`\u002B`, `\x2b`, `\U0000002b`, `\/`, `\"`, `\n`, ...), HTML
//!   character references (`&#43;`, `&#x2B;`, `&plus;`, `&quot;`, ...);
//! - each kind nested in itself to any depth (JSON quoted again and again, `%252B`,
//!   `&amp;#43;`), and two kinds one inside the other (`\u0026#43;`, Go's JSON of a
//!   template's output; `%26%2343%3B`; `%5Cu002B`);
//! - hex (two digits a byte);
//! - base64 and base64url at each of the three alignments, its characters escaped as above,
//!   with line breaks (raw or escaped) anywhere between them (MIME's and GitHub's wrapped
//!   base64).
//!
//! [`ScrubStream`] scrubs a stream given in pieces. What it sends on never depends on the
//! secret: it holds back a constant amount ([`HOLD`]) and lets go of what it held
//! [`FLUSH_AFTER`] after it came, whatever those bytes are. A hold-back that depended on
//! whether the last bytes could begin the secret would tell the code, by the sizes of the
//! pieces it reads, whether its guess was a prefix of the secret.

mod decode;
mod scan;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use scan::base64_char;
use scan::{Found, Goals, Scan};

/// What a stream holds back: any form of the secret up to this long is masked whole, even
/// when it arrives in pieces. Constant, so that what goes on when tells nothing.
pub const HOLD: usize = 64 * 1024;

/// How long a stream's bytes may wait before they go on, whatever they are: a stream of
/// events goes on this much later than it came.
pub const FLUSH_AFTER: Duration = Duration::from_millis(50);

/// Recognizes every form of a set of secrets in a stream of bytes.
pub struct Scrubber {
    goals: Goals,
}

impl Scrubber {
    /// A scrubber of `secrets`, each at least a few bytes long (shorter ones are left out:
    /// they could not be told from ordinary text).
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Scrubber {
        Scrubber {
            goals: Goals::new(secrets),
        }
    }

    /// Masks every occurrence in `data` (overlapping ones too); how many there were.
    pub fn mask(&self, data: &mut [u8]) -> u64 {
        let mut spans = Vec::new();
        Scan::default().run(&self.goals, data, |end, found| spans.push((found, end)));
        for &(found, end) in &spans {
            let (start, end) = widened(data, found, found.start as usize, end as usize);
            data[start..end].fill(b'*');
        }
        spans.len() as u64
    }

    /// `text` with every occurrence masked.
    pub fn masked(&self, text: &str) -> String {
        let mut bytes = text.as_bytes().to_vec();
        self.mask(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A stream's scrubbing, across pieces.
    pub fn stream(self: &Arc<Self>) -> ScrubStream {
        ScrubStream {
            scrubber: self.clone(),
            scan: Scan::default(),
            held: Vec::new(),
            sent: 0,
            arrivals: VecDeque::new(),
            mask_next: false,
            found: 0,
        }
    }
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets.
        f.debug_struct("Scrubber")
            .field("secrets", &self.goals.secrets.len())
            .finish_non_exhaustive()
    }
}

/// A form's span `start..end` in `data`, with the base64 character on each side when it
/// is base64 text (those hold bits of the secret too).
fn widened(data: &[u8], found: Found, start: usize, end: usize) -> (usize, usize) {
    if !found.base64 {
        return (start, end);
    }
    let start = if start > 0 && base64_char(data[start - 1]) {
        start - 1
    } else {
        start
    };
    let end = if end < data.len() && base64_char(data[end]) {
        end + 1
    } else {
        end
    };
    (start, end)
}

/// Scrubs a stream given in pieces: a form of the secret split across pieces is found
/// whole. What goes on, and when, depends only on the sizes and times of the pieces that
/// came: everything but the last [`HOLD`] bytes at once, and the rest [`FLUSH_AFTER`] it
/// came (or at the end).
pub struct ScrubStream {
    scrubber: Arc<Scrubber>,
    scan: Scan,
    /// Scanned bytes not yet sent on; the first is the stream's byte `sent`.
    held: Vec<u8>,
    sent: u64,
    /// When each piece came, and the stream offset just past it; oldest first.
    arrivals: VecDeque<(Instant, u64)>,
    /// The next byte follows a base64 form: it holds bits of the secret.
    mask_next: bool,
    pub found: u64,
}

impl std::fmt::Debug for ScrubStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrubStream")
            .field("held", &self.held.len())
            .field("sent", &self.sent)
            .field("found", &self.found)
            .finish_non_exhaustive()
    }
}

impl ScrubStream {
    /// Scans `data`, which came at `now`; what may go on now.
    pub fn feed(&mut self, data: &[u8], now: Instant) -> Vec<u8> {
        let from = self.scan.at;
        self.held.extend(data);
        if self.mask_next && data.first().is_some_and(|&c| base64_char(c)) {
            let first = (from - self.sent) as usize;
            self.held[first] = b'*';
        }
        self.mask_next = false;
        let mut spans = Vec::new();
        self.scan.run(&self.scrubber.goals, data, |end, found| {
            spans.push((found, end))
        });
        self.found += spans.len() as u64;
        let held = &mut self.held;
        for &(found, end) in &spans {
            // What already went on cannot be masked (nor widened into); what is held is.
            let (start, end) = widened(
                held,
                found,
                (found.start.max(self.sent) - self.sent) as usize,
                (end - self.sent) as usize,
            );
            held[start..end].fill(b'*');
            // A base64 form that ends the piece: the next byte to come holds bits of it.
            self.mask_next |= found.base64 && end == held.len();
        }
        self.arrivals.push_back((now, self.scan.at));
        // Past the hold at once; and what has waited long enough, though more keeps coming.
        let mut out = self.take(self.held.len().saturating_sub(HOLD));
        out.extend(self.due(now));
        out
    }

    /// What has waited [`FLUSH_AFTER`] by `now`.
    pub fn due(&mut self, now: Instant) -> Vec<u8> {
        let mut until = self.sent;
        for &(came, end) in &self.arrivals {
            if now.duration_since(came) < FLUSH_AFTER {
                break;
            }
            until = end;
        }
        self.take((until - self.sent) as usize)
    }

    /// When the oldest byte held is due, if any is held.
    pub fn next_due(&self) -> Option<Instant> {
        self.arrivals
            .iter()
            .find(|(_, end)| *end > self.sent)
            .map(|(came, _)| *came + FLUSH_AFTER)
    }

    /// The stream ended: the rest.
    pub fn finish(&mut self) -> Vec<u8> {
        self.take(self.held.len())
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        self.sent += n as u64;
        while self
            .arrivals
            .front()
            .is_some_and(|(_, end)| *end <= self.sent)
        {
            self.arrivals.pop_front();
        }
        let out = self.held[..n].to_vec();
        self.held.drain(..n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    const SECRET: &str = "s3cr3t/Tok+en=42";

    /// Every printable ASCII symbol, with letters and digits between.
    fn every_symbol(len: usize) -> String {
        let symbols: Vec<char> = (0x20u8..0x7f)
            .filter(|b| !b.is_ascii_alphanumeric())
            .map(char::from)
            .collect();
        let mut rng = Rng(0x5eed_0000 + len as u64);
        (0..len)
            .map(|i| {
                if i % 2 == 0 {
                    symbols[(i / 2) % symbols.len()]
                } else {
                    b"ABCxyz019QZqz7"[rng.below(14)] as char
                }
            })
            .collect()
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// `data` scrubbed as a stream in pieces of `step` bytes, and how many were found.
    fn scrub(secret: &str, data: &[u8], step: usize) -> (Vec<u8>, u64) {
        let s = Arc::new(Scrubber::new([secret.as_bytes()]));
        let mut stream = s.stream();
        let now = Instant::now();
        let mut out = Vec::new();
        for piece in data.chunks(step) {
            out.extend(stream.feed(piece, now));
        }
        out.extend(stream.finish());
        (out, stream.found)
    }

    /// Each byte of `s` other than a letter or digit written by `f` (or as it is).
    fn each(s: &str, f: impl Fn(u8) -> Option<String>) -> String {
        s.bytes()
            .map(|b| match f(b) {
                Some(e) if !b.is_ascii_alphanumeric() => e,
                _ => char::from(b).to_string(),
            })
            .collect()
    }

    fn json(s: &str) -> String {
        each(s, |b| match b {
            b'"' => Some("\\\"".into()),
            b'\\' => Some("\\\\".into()),
            _ => None,
        })
    }
    /// PHP's json_encode: `/` escaped too.
    fn php_json(s: &str) -> String {
        each(s, |b| match b {
            b'"' | b'\\' | b'/' => Some(format!("\\{}", char::from(b))),
            _ => None,
        })
    }
    /// Go's encoding/json: HTML's characters as `\u00XX`.
    fn go_json(s: &str) -> String {
        each(s, |b| match b {
            b'"' | b'\\' => Some(format!("\\{}", char::from(b))),
            b'<' | b'>' | b'&' => Some(format!("\\u{b:04x}")),
            _ => None,
        })
    }
    /// .NET's System.Text.Json (its default encoder: HTML-sensitive characters upper-case).
    fn dotnet_json(s: &str) -> String {
        each(s, |b| match b {
            b'\\' => Some("\\\\".into()),
            b'"' | b'&' | b'\'' | b'+' | b'<' | b'>' | b'`' => Some(format!("\\u{b:04X}")),
            _ => None,
        })
    }
    /// Each byte of `s` in `table` written its way.
    fn replacing(s: &str, table: &[(u8, &str)]) -> String {
        each(s, |b| {
            table
                .iter()
                .find(|(c, _)| *c == b)
                .map(|(_, e)| (*e).to_owned())
        })
    }
    /// Python's html.escape.
    fn html_escape(s: &str) -> String {
        replacing(
            s,
            &[
                (b'&', "&amp;"),
                (b'<', "&lt;"),
                (b'>', "&gt;"),
                (b'"', "&quot;"),
                (b'\'', "&#x27;"),
            ],
        )
    }
    /// Go's html/template.
    fn go_html(s: &str) -> String {
        replacing(
            s,
            &[
                (b'&', "&amp;"),
                (b'<', "&lt;"),
                (b'>', "&gt;"),
                (b'"', "&#34;"),
                (b'\'', "&#39;"),
                (b'+', "&#43;"),
            ],
        )
    }
    /// Python's urllib.parse.quote with `safe`.
    fn quote(s: &str, safe: &str) -> String {
        each(s, |b| {
            (!b"_.-~".contains(&b) && !safe.as_bytes().contains(&b)).then(|| format!("%{b:02X}"))
        })
    }
    fn quote_plus(s: &str) -> String {
        quote(s, " ").replace(' ', "+")
    }

    fn base64_wrapped(text: &str, width: usize, brk: &str) -> String {
        text.as_bytes()
            .chunks(width)
            .map(|c| String::from_utf8_lossy(c).into_owned() + brk)
            .collect()
    }

    /// Every encoder and depth of quoting the docs name, over `secret` (in a value with
    /// text before and after it where the form is base64 of a longer value).
    fn forms(secret: &str) -> Vec<(String, String)> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let url = base64::engine::general_purpose::URL_SAFE;
        let mut out: Vec<(String, String)> = vec![
            ("as it is".into(), secret.into()),
            ("upper case".into(), secret.to_ascii_uppercase()),
            ("json".into(), json(secret)),
            ("php json".into(), php_json(secret)),
            ("go json".into(), go_json(secret)),
            (".net json".into(), dotnet_json(secret)),
            ("json in json".into(), json(&json(secret))),
            ("go json in .net json".into(), dotnet_json(&go_json(secret))),
            (
                "php json thrice".into(),
                php_json(&php_json(&php_json(secret))),
            ),
            (
                "json five deep".into(),
                (0..5).fold(secret.to_owned(), |s, _| json(&s)),
            ),
            ("html.escape".into(), html_escape(secret)),
            ("go html/template".into(), go_html(secret)),
            (
                "html.escape twice".into(),
                html_escape(&html_escape(secret)),
            ),
            ("go json of a template".into(), go_json(&go_html(secret))),
            ("html of json".into(), html_escape(&php_json(secret))),
            (
                "template of .net json".into(),
                go_html(&dotnet_json(secret)),
            ),
            ("quote of html".into(), quote(&html_escape(secret), "")),
            (
                "decimal entities".into(),
                each(secret, |b| Some(format!("&#{b};"))),
            ),
            (
                "hex entities, zeros".into(),
                each(secret, |b| Some(format!("&#x00{b:X};"))),
            ),
            ("quote".into(), quote(secret, "/")),
            ("quote, nothing safe".into(), quote(secret, "")),
            ("quote lower".into(), quote(secret, "").to_lowercase()),
            ("quote_plus".into(), quote_plus(secret)),
            ("quoted twice".into(), quote(&quote(secret, ""), "")),
            (
                "quoted thrice".into(),
                quote(&quote(&quote(secret, ""), ""), ""),
            ),
            ("json in a url".into(), quote(&json(secret), "")),
            (
                "python repr escapes".into(),
                each(secret, |b| Some(format!("\\x{b:02x}"))),
            ),
            (
                "all \\u escapes".into(),
                each(secret, |b| Some(format!("\\u{b:04x}"))),
            ),
            (
                "hex".into(),
                secret.bytes().map(|b| format!("{b:02x}")).collect(),
            ),
            (
                "HEX".into(),
                secret.bytes().map(|b| format!("{b:02X}")).collect(),
            ),
        ];
        for prefix in ["", "B", "Be", "Bearer ", "user:"] {
            let value = format!("{prefix}{secret}");
            out.push((format!("base64 of {prefix:?}+"), b64.encode(&value)));
            out.push((
                format!("base64url of {prefix:?}+"),
                url.encode(format!("{value}??")),
            ));
            out.push((
                format!("base64 of {prefix:?}+, php json"),
                php_json(&b64.encode(format!("{value}!"))),
            ));
            for (width, brk) in [(76, "\r\n"), (60, "\n"), (64, "\n"), (76, "\\n")] {
                let text = b64.encode(format!("Authorization: {value}\r\n").repeat(2));
                out.push((
                    format!("base64 of {prefix:?}+ wrapped at {width} by {brk:?}"),
                    base64_wrapped(&text, width, brk),
                ));
            }
        }
        out
    }

    /// Nothing of `secret` is readable in `out`: no form of it is found there, and no run of
    /// a third of its letters and digits is left.
    fn absent(secret: &str, out: &[u8], what: &str) {
        let mut again = out.to_vec();
        let s = Scrubber::new([secret.as_bytes()]);
        assert_eq!(
            s.mask(&mut again),
            0,
            "{what}: {}",
            String::from_utf8_lossy(out)
        );
        let text = String::from_utf8_lossy(out).to_ascii_lowercase();
        let plain: Vec<char> = secret.to_ascii_lowercase().chars().collect();
        let run = (plain.len() / 3).max(4);
        for w in plain.windows(run) {
            let w: String = w.iter().collect();
            if w.chars().all(|c| c.is_ascii_alphanumeric()) {
                assert!(!text.contains(&w), "{what}: {w:?} in {text}");
            }
        }
    }

    #[test]
    fn every_encoder_s_form_of_secrets_up_to_256_bytes_is_masked_across_any_split() {
        let github = format!(
            "github_pat_{}",
            (0..82)
                .map(|i| b"ABCDEFGHJKabcdefghjk0123456789_"[(i * 7 + 3) % 31] as char)
                .collect::<String>()
        );
        assert_eq!(github.len(), 93);
        let secrets = [
            SECRET.to_owned(),
            "pa\"ss/w\\rd<&>'+".to_owned(),
            github,
            every_symbol(40),
            every_symbol(98),
            every_symbol(256),
        ];
        for secret in &secrets {
            for (name, form) in forms(secret) {
                let data = format!("<<{form}>>");
                for step in [1, 7, 4096] {
                    let (out, found) = scrub(secret, data.as_bytes(), step);
                    let what = format!("{name} of {secret:?}, {step} a piece");
                    assert!(found >= 1, "{what}: {data}");
                    assert_eq!(out.len(), data.len(), "{what}: lengths stay true");
                    absent(secret, &out, &what);
                }
            }
        }
    }

    #[test]
    fn each_byte_may_be_written_any_way_mixed_freely() {
        // A random way for each byte, among all the decoder reads, nested at random.
        let ways: &[fn(u8) -> String] = &[
            |b| char::from(b).to_string(),
            |b| format!("%{b:02X}"),
            |b| format!("%25{b:02x}"),
            |b| format!("\\u{b:04x}"),
            |b| format!("\\\\u{b:04X}"),
            |b| format!("\\\\\\\\\\\\\\\\u{b:04x}"),
            |b| format!("\\U{b:08x}"),
            |b| format!("\\x{b:02x}"),
            |b| format!("&#{b};"),
            |b| format!("&#0000{b};"),
            |b| format!("&#X{b:x};"),
            |b| format!("&amp;#{b};"),
            |b| format!("&amp;amp;#x{b:x};"),
            |b| format!("\\u0026#{b};"),
            |b| format!("%26%23{b};"),
            |b| format!("%5Cu{b:04x}"),
            |b| format!("\\u005cu{b:04x}"),
        ];
        let mut rng = Rng(42);
        for round in 0..300 {
            let len = 8 + rng.below(120);
            let secret: String = (0..len)
                .map(|_| char::from(0x20 + rng.below(95) as u8))
                .collect();
            let secret = secret.trim().to_owned();
            if secret.len() < 8 {
                continue;
            }
            let form: String = secret
                .bytes()
                .map(|b| ways[rng.below(ways.len())](b))
                .collect();
            let data = format!("x{form}y");
            let (out, found) = scrub(&secret, data.as_bytes(), 1 + rng.below(9));
            assert!(found >= 1, "round {round}: {secret:?} as {form}");
            assert_eq!(&out[1..out.len() - 1], "*".repeat(form.len()).as_bytes());
        }
    }

    #[test]
    fn named_references_and_escapes_decode_as_html_and_json_do() {
        let secret = "a&b\"c<d>e'f+g/h\\i`j{k}l|m";
        for form in [
            "a&amp;b&quot;c&lt;d&gt;e&apos;f&plus;g&sol;h&bsol;i&grave;j&lcub;k&rcub;l&verbar;m",
            "a&AMP;b&QUOT;c&LT;d&GT;e&#39;f&#43;g&#47;h&#92;i&#96;j&lbrace;k&rbrace;l&vert;m",
            "a\\u0026b\\\"c\\u003cd\\u003ee\\u0027f\\u002Bg\\/h\\\\i\\u0060j{k}l|m",
        ] {
            let (out, found) = scrub(secret, form.as_bytes(), 3);
            assert_eq!(found, 1, "{form}");
            assert_eq!(out, "*".repeat(form.len()).as_bytes(), "{form}");
        }
        // A near miss is left alone: one byte wrong, an unknown name, a bare escape.
        for text in [
            "a&amp;b&quot;c&lt;d&gt;e&apos;f&plus;g&sol;h&bsol;i&grave;j&lcub;k&rcub;l&verbar;n",
            "a&ampx;b\"c<d>e'f+g/h\\i`j{k}l|m",
            "a\\&b\"c<d>e'f+g/h\\i`j{k}l|m",
        ] {
            let (out, found) = scrub(secret, text.as_bytes(), 3);
            assert_eq!((found, out.as_slice()), (0, text.as_bytes()), "{text}");
        }
    }

    #[test]
    fn the_base64_characters_on_each_side_are_masked_and_nothing_else() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let text = b64.encode(format!("xy{SECRET}!?"));
        let (out, _) = scrub(SECRET, text.as_bytes(), 1);
        let out = String::from_utf8(out).unwrap();
        let stars = out.find('*').unwrap();
        assert_eq!(&out[..stars], &text[..stars]);
        assert!(
            stars <= 2 && out[stars..].trim_start_matches('*').len() <= 3,
            "{text} -> {out}"
        );
        let (out, found) = scrub(SECRET, b"nothing to see here, not even s3cr3t/Tok", 1);
        assert_eq!(found, 0);
        assert_eq!(out, b"nothing to see here, not even s3cr3t/Tok");
    }

    #[test]
    fn what_goes_on_and_when_never_depends_on_the_secret() {
        let s = Arc::new(Scrubber::new([SECRET.as_bytes()]));
        let t0 = Instant::now();
        // A guess that is a prefix of the secret and one that is not, at the end of an
        // answer and alone: the same pieces at the same times.
        for guess in ["s3cr", "zzzz", "s3cr3t/Tok+en=4", "zzzzzzzzzzzzzzz"] {
            let mut stream = s.stream();
            assert!(stream
                .feed(format!("hello {guess}").as_bytes(), t0)
                .is_empty());
            assert_eq!(stream.next_due(), Some(t0 + FLUSH_AFTER));
            assert!(stream
                .due(t0 + FLUSH_AFTER - Duration::from_millis(1))
                .is_empty());
            assert_eq!(
                stream.due(t0 + FLUSH_AFTER),
                format!("hello {guess}").into_bytes(),
                "{guess}"
            );
            assert_eq!(stream.next_due(), None);
            assert!(stream.feed(b" and more", t0).is_empty());
            assert_eq!(stream.finish(), b" and more");
        }
        // Past the hold, the excess goes at once, whatever it is.
        for fill in [b'a', b's'] {
            let mut stream = s.stream();
            let sent = stream.feed(&vec![fill; HOLD + 100], t0);
            assert_eq!(sent.len(), 100);
            assert_eq!(stream.feed(b"12345", t0).len(), 5);
        }
        // A stream that never pauses goes on all the same, each piece when it is due.
        let mut stream = s.stream();
        let ms = Duration::from_millis;
        assert!(stream.feed(b"data: 1\n\n", t0).is_empty());
        assert!(stream.feed(b"data: 2\n\n", t0 + ms(30)).is_empty());
        assert_eq!(stream.feed(b"data: 3\n\n", t0 + ms(60)), b"data: 1\n\n");
        assert_eq!(stream.feed(b"data: 4\n\n", t0 + ms(90)), b"data: 2\n\n");
        // A secret whose start went on at its time is masked in what is still held.
        let mut stream = s.stream();
        assert!(stream.feed(b"s3cr3t/T", t0).is_empty());
        assert_eq!(stream.due(t0 + FLUSH_AFTER), b"s3cr3t/T");
        assert!(stream.feed(b"ok+en=42 ok", t0 + FLUSH_AFTER).is_empty());
        assert_eq!(stream.finish(), b"******** ok");
        assert_eq!(stream.found, 1);
    }
}
