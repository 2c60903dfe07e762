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

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a stream holds back: any form of the secret up to this long is masked whole, even
/// when it arrives in pieces. Constant, so that what goes on when tells nothing.
pub const HOLD: usize = 64 * 1024;

/// How long a stream's bytes may wait before they go on, whatever they are: a stream of
/// events goes on this much later than it came.
pub const FLUSH_AFTER: Duration = Duration::from_millis(50);

/// Recognizes every form of a set of secrets in a stream of bytes.
pub struct Scrubber {
    secrets: Vec<Vec<u8>>,
    /// Per value a layer may decode first, the goals a form of some secret could go on
    /// with after it.
    first: Vec<Vec<Goal>>,
    /// Per raw byte, whether a form of some secret could start with it.
    starts: [bool; 256],
}

/// What a thread looks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Goal {
    /// The secret's byte at this index.
    Plain { secret: u16, at: u32 },
    /// The hex digit at this index (two a byte, the high one first).
    Hex { secret: u16, at: u32 },
    /// The base64 character of the six bits from this bit offset.
    Base64 { secret: u16, bit: u32 },
}

/// Where a thread is in reading one encoded byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Dec {
    /// Between two: the next byte is itself or starts an escape.
    Ready,
    /// After `%`, with `digits` hex digits of the value read; `in_run`: the `%` is inside
    /// a run of backslashes, where only an escaped backslash (`%5C`) may come.
    Percent { digits: u8, value: u8, in_run: bool },
    /// After one or more backslashes.
    Backslashes,
    /// After `\u`, `\U` or `\x`, with `left` hex digits still to come.
    Code { left: u8, value: u8 },
    /// After `&` (or an escape of it).
    Ampersand,
    /// After `&#`.
    Number,
    /// After `&#` (`&#x` when `hex`) and `count` digits.
    Digits { hex: bool, count: u8, value: u8 },
    /// After `&` and the start of a name: a node of [`NAMES`]' trie.
    Name(u8),
}

/// How many encodings of any kinds, one inside the other, are read (`%26%2343%3B`: an HTML
/// reference, percent-encoded; `%5Cu002B`: a JSON escape, percent-encoded). Within one, a
/// kind's own nesting has no bound: JSON quoted again and again (runs of backslashes),
/// `%2525...`, `&amp;amp;...`, and an escape character written as an escape of its own
/// kind or another (`\u0026#43;`).
const LAYERS: usize = 2;

/// Each layer's decoder state, the outermost encoding's first.
type Decs = [Dec; LAYERS];

const READY: Decs = [Dec::Ready; LAYERS];

/// A way of reading the bytes since `start` as the start of a form of a secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Thread {
    goal: Goal,
    decs: Decs,
    start: u64,
}

/// A form of a secret, ending at the byte just scanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Found {
    /// Where it started, in the stream's bytes.
    start: u64,
    /// It was base64 text: the characters on each side hold bits of the secret too.
    base64: bool,
}

/// HTML's named character references of ASCII characters (HTML5's list), lower-cased:
/// names are matched in any case (`&QUOT;`, `&AMP;` are valid too).
const NAMES: &[(&str, u8)] = &[
    ("tab", b'\t'),
    ("newline", b'\n'),
    ("excl", b'!'),
    ("quot", b'"'),
    ("num", b'#'),
    ("dollar", b'$'),
    ("percnt", b'%'),
    ("amp", b'&'),
    ("apos", b'\''),
    ("lpar", b'('),
    ("rpar", b')'),
    ("ast", b'*'),
    ("midast", b'*'),
    ("plus", b'+'),
    ("comma", b','),
    ("period", b'.'),
    ("sol", b'/'),
    ("colon", b':'),
    ("semi", b';'),
    ("lt", b'<'),
    ("equals", b'='),
    ("gt", b'>'),
    ("quest", b'?'),
    ("commat", b'@'),
    ("lsqb", b'['),
    ("lbrack", b'['),
    ("bsol", b'\\'),
    ("rsqb", b']'),
    ("rbrack", b']'),
    ("hat", b'^'),
    ("lowbar", b'_'),
    ("underbar", b'_'),
    ("grave", b'`'),
    ("diacriticalgrave", b'`'),
    ("lcub", b'{'),
    ("lbrace", b'{'),
    ("verbar", b'|'),
    ("vert", b'|'),
    ("verticalline", b'|'),
    ("rcub", b'}'),
    ("rbrace", b'}'),
];

/// The trie of [`NAMES`]: node 0 is the root; each node's children by letter, and the
/// character its name stands for when one ends there.
struct Trie {
    children: Vec<[u8; 26]>,
    value: Vec<Option<u8>>,
}

fn trie() -> &'static Trie {
    static TRIE: std::sync::OnceLock<Trie> = std::sync::OnceLock::new();
    TRIE.get_or_init(|| {
        let mut t = Trie {
            children: vec![[0; 26]],
            value: vec![None],
        };
        for (name, value) in NAMES {
            let mut node = 0usize;
            for b in name.bytes() {
                let slot = usize::from(b - b'a');
                if t.children[node][slot] == 0 {
                    t.children.push([0; 26]);
                    t.value.push(None);
                    t.children[node][slot] =
                        u8::try_from(t.children.len() - 1).expect("under 256 nodes");
                }
                node = usize::from(t.children[node][slot]);
            }
            t.value[node] = Some(*value);
        }
        t
    })
}

fn hex_value(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// The six bits a base64 or base64url character stands for.
fn sextet(c: u8) -> Option<u32> {
    Some(u32::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' | b'-' => 62,
        b'/' | b'_' => 63,
        _ => return None,
    }))
}

pub(crate) fn base64_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"+/-_".contains(&b)
}

/// What reading one raw byte makes of a decoder state: a further state, or a decoded value.
/// Values are ASCII: the secrets are (an escape of anything else cannot be part of one).
#[derive(Clone, Copy)]
enum Next {
    Dec(Dec),
    Value(u8),
}

/// The kinds of encoding.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A byte as it is (not an escape).
    Raw,
    Percent,
    /// JSON's and Python's backslash escapes.
    Backslash,
    /// HTML's character references.
    Html,
}

/// The kind of escape `dec` is inside.
fn kind(dec: Dec) -> Kind {
    match dec {
        Dec::Ready => Kind::Raw,
        Dec::Percent { .. } => Kind::Percent,
        Dec::Backslashes | Dec::Code { .. } => Kind::Backslash,
        Dec::Ampersand | Dec::Number | Dec::Digits { .. } | Dec::Name(_) => Kind::Html,
    }
}

/// The escape a `%`, `\` or `&` starts, and its kind.
fn escape_of(value: u8) -> Option<(Dec, Kind)> {
    match value {
        b'%' => Some((
            Dec::Percent {
                digits: 0,
                value: 0,
                in_run: false,
            },
            Kind::Percent,
        )),
        b'\\' => Some((Dec::Backslashes, Kind::Backslash)),
        b'&' => Some((Dec::Ampersand, Kind::Html)),
        _ => None,
    }
}

/// What reading a byte through the layers makes of them.
#[derive(Clone, Copy)]
enum Read {
    /// Still inside an escape, in some layer.
    Decs(Decs),
    /// A value out of the innermost layer (every layer is between two encoded bytes).
    Value(u8),
}

/// Reads byte `c` through the layers of `decs` into `out`: a value a layer decodes is the
/// next layer's byte. Each way of reading is followed once: a raw escape character may
/// start an escape in any layer between two (HTML's `\&quot;` is JSON's `\"` escaped
/// again), unless a deeper layer is inside an escape of the same kind (that is the deeper
/// layer's own nesting); an escape character an escape decoded starts its escape in the
/// same layer when the kinds are the same (JSON quoted again, `%25`, `&amp;`), in a deeper
/// one when they differ (`%26` then `#43;`).
fn read(decs: Decs, c: u8, out: &mut Vec<Read>) {
    // What is still to read, and whether it is a raw byte (or an escape character another
    // kind decoded), which may start an escape.
    let mut work = [(decs, 0usize, c, true); 2 * LAYERS + 1];
    let mut len = 1;
    while len > 0 {
        len -= 1;
        let (decs, layer, c, may_start) = work[len];
        let from = kind(decs[layer]);
        for next in decode(decs[layer], c).into_iter().flatten() {
            match next {
                Next::Dec(dec) => {
                    let mut decs = decs;
                    decs[layer] = dec;
                    out.push(Read::Decs(decs));
                }
                Next::Value(v) => {
                    let mut ready = decs;
                    ready[layer] = Dec::Ready;
                    // Whether the next layer may start an escape with `v`.
                    let mut deeper = from == Kind::Raw && may_start;
                    if let Some((dec, k)) = escape_of(v) {
                        let here = if from == Kind::Raw {
                            may_start && !decs[layer + 1..].iter().any(|d| kind(*d) == k)
                        } else {
                            deeper = k != from;
                            k == from
                        };
                        if here {
                            let mut decs = ready;
                            decs[layer] = dec;
                            out.push(Read::Decs(decs));
                        }
                    }
                    if layer + 1 == LAYERS {
                        out.push(Read::Value(v));
                    } else {
                        work[len] = (ready, layer + 1, v, deeper);
                        len += 1;
                    }
                }
            }
        }
    }
}

/// A raw byte that every layer, between two, reads as itself and nothing else.
fn plain_byte(c: u8) -> bool {
    !matches!(c, b'%' | b'\\' | b'&' | b'+')
}

/// Reads raw byte `c` in state `dec`: each way it can go on.
fn decode(dec: Dec, c: u8) -> [Option<Next>; 2] {
    let one = |n: Next| [Some(n), None];
    let value = |v: u8| one(Next::Value(v));
    const NONE: [Option<Next>; 2] = [None, None];
    match dec {
        Dec::Ready if c == b'+' => [Some(Next::Value(c)), Some(Next::Value(b' '))],
        Dec::Ready => value(c),
        Dec::Percent {
            digits,
            value: high,
            in_run,
        } => {
            let Some(d) = hex_value(c) else { return NONE };
            let v = high << 4 | d;
            if digits == 0 {
                one(Next::Dec(Dec::Percent {
                    digits: 1,
                    value: d,
                    in_run,
                }))
            } else if (!in_run || v == b'\\') && v.is_ascii() {
                value(v)
            } else {
                NONE
            }
        }
        Dec::Backslashes => match c {
            b'\\' | b'"' | b'/' | b'\'' => value(c),
            b'%' => one(Next::Dec(Dec::Percent {
                digits: 0,
                value: 0,
                in_run: true,
            })),
            b'u' => one(Next::Dec(Dec::Code { left: 4, value: 0 })),
            b'U' => one(Next::Dec(Dec::Code { left: 8, value: 0 })),
            b'x' => one(Next::Dec(Dec::Code { left: 2, value: 0 })),
            b'n' => value(b'\n'),
            b'r' => value(b'\r'),
            b't' => value(b'\t'),
            b'b' => value(0x08),
            b'f' => value(0x0c),
            _ => NONE,
        },
        Dec::Code { left, value: v } => {
            let Some(d) = hex_value(c) else { return NONE };
            // Past ASCII, no digit to come can bring it back.
            let v = u32::from(v) << 4 | u32::from(d);
            let Ok(v) = u8::try_from(v) else { return NONE };
            if !v.is_ascii() {
                NONE
            } else if left == 1 {
                value(v)
            } else {
                one(Next::Dec(Dec::Code {
                    left: left - 1,
                    value: v,
                }))
            }
        }
        Dec::Ampersand if c == b'#' => one(Next::Dec(Dec::Number)),
        Dec::Ampersand => name(0, c),
        Dec::Number if c == b'x' || c == b'X' => one(Next::Dec(Dec::Digits {
            hex: true,
            count: 0,
            value: 0,
        })),
        Dec::Number if c.is_ascii_digit() => one(Next::Dec(Dec::Digits {
            hex: false,
            count: 1,
            value: c - b'0',
        })),
        Dec::Number => NONE,
        Dec::Digits {
            count, value: v, ..
        } if c == b';' => {
            if count > 0 {
                value(v)
            } else {
                NONE
            }
        }
        Dec::Digits {
            hex,
            count,
            value: v,
        } => {
            let digit = if hex {
                hex_value(c)
            } else {
                c.is_ascii_digit().then(|| c - b'0')
            };
            let Some(d) = digit else { return NONE };
            // Leading zeros may be many; past ASCII, no digit brings the value back.
            let v = u32::from(v) * if hex { 16 } else { 10 } + u32::from(d);
            match u8::try_from(v) {
                Ok(v) if v.is_ascii() && count < 16 => one(Next::Dec(Dec::Digits {
                    hex,
                    count: count + 1,
                    value: v,
                })),
                _ => NONE,
            }
        }
        Dec::Name(node) if c == b';' => trie().value[usize::from(node)].map_or(NONE, value),
        Dec::Name(node) => name(node, c),
    }
}

/// A name's next letter, from trie node `node`.
fn name(node: u8, c: u8) -> [Option<Next>; 2] {
    if !c.is_ascii_alphabetic() {
        return [None, None];
    }
    let child = trie().children[usize::from(node)][usize::from(c.to_ascii_lowercase() - b'a')];
    [(child != 0).then_some(Next::Dec(Dec::Name(child))), None]
}

/// What a goal makes of decoded value `v`.
enum Taken {
    Dead,
    Next(Goal),
    /// The form is whole; `base64`: it was base64 text.
    Done {
        base64: bool,
    },
}

impl Scrubber {
    /// A scrubber of `secrets`, each at least a few bytes long (shorter ones are left out:
    /// they could not be told from ordinary text).
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Scrubber {
        let secrets: Vec<Vec<u8>> = secrets
            .into_iter()
            .filter(|s| s.len() >= 4)
            .map(<[u8]>::to_vec)
            .collect();
        let mut scrubber = Scrubber {
            secrets,
            first: Vec::new(),
            starts: [false; 256],
        };
        // The secret as it is, in hex, and in base64 at the three bit offsets where its
        // first character wholly of the secret begins (no byte before it, two, or one).
        let mut starting = Vec::new();
        for secret in 0..scrubber.secrets.len() as u16 {
            starting.extend([
                Goal::Plain { secret, at: 0 },
                Goal::Hex { secret, at: 0 },
                Goal::Base64 { secret, bit: 0 },
                Goal::Base64 { secret, bit: 4 },
                Goal::Base64 { secret, bit: 2 },
            ]);
        }
        scrubber.first = (0..=255u8)
            .map(|v| {
                starting
                    .iter()
                    .filter_map(|&g| match scrubber.take(g, v) {
                        Taken::Next(goal) => Some(goal),
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        let mut reads = Vec::new();
        for c in 0..=255u8 {
            reads.clear();
            read(READY, c, &mut reads);
            scrubber.starts[usize::from(c)] = reads.iter().any(|r| match *r {
                Read::Decs(_) => true,
                Read::Value(v) => !scrubber.first[usize::from(v)].is_empty(),
            });
        }
        scrubber
    }

    /// Where `goal` goes with decoded value `v`.
    fn take(&self, goal: Goal, v: u8) -> Taken {
        match goal {
            Goal::Plain { secret, at } => {
                let bytes = &self.secrets[usize::from(secret)];
                if !v.eq_ignore_ascii_case(&bytes[at as usize]) {
                    Taken::Dead
                } else if at as usize + 1 == bytes.len() {
                    Taken::Done { base64: false }
                } else {
                    Taken::Next(Goal::Plain { secret, at: at + 1 })
                }
            }
            Goal::Hex { secret, at } => {
                let bytes = &self.secrets[usize::from(secret)];
                let byte = bytes[(at / 2) as usize];
                let nibble = if at % 2 == 0 { byte >> 4 } else { byte & 0xf };
                if hex_value(v) != Some(nibble) {
                    Taken::Dead
                } else if at as usize + 1 == 2 * bytes.len() {
                    Taken::Done { base64: false }
                } else {
                    Taken::Next(Goal::Hex { secret, at: at + 1 })
                }
            }
            Goal::Base64 { secret, bit } => {
                let bytes = &self.secrets[usize::from(secret)];
                // A line break between two characters (never before the first).
                if (v == b'\n' || v == b'\r') && bit >= 6 {
                    return Taken::Next(goal);
                }
                if sextet(v) != Some(bits(bytes, bit)) {
                    Taken::Dead
                } else if bit as usize + 12 > 8 * bytes.len() {
                    // The last character wholly of the secret: the next holds bits of
                    // what follows.
                    Taken::Done { base64: true }
                } else {
                    Taken::Next(Goal::Base64 {
                        secret,
                        bit: bit + 6,
                    })
                }
            }
        }
    }

    /// Masks every occurrence in `data` (overlapping ones too); how many there were.
    pub fn mask(&self, data: &mut [u8]) -> u64 {
        let mut spans = Vec::new();
        Scan::default().run(self, data, |end, found| spans.push((found, end)));
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
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

/// The six bits of `secret` from bit `bit` (the first bit is the first byte's highest).
fn bits(secret: &[u8], bit: u32) -> u32 {
    let at = (bit / 8) as usize;
    let pair = u32::from(secret[at]) << 8 | u32::from(secret.get(at + 1).copied().unwrap_or(0));
    pair >> (10 - bit % 8) & 0x3f
}

/// What the bytes scanned so far leave under way.
struct Scan {
    /// Reads that wait for a form's first value (an escape begun): the set of their
    /// decoder states, as `learnt` numbers it, and where each began.
    set: u32,
    begun: Vec<u64>,
    begun_next: Vec<u64>,
    learnt: Learnt,
    /// Reads past a form's first value.
    threads: Vec<Thread>,
    next: Vec<Thread>,
    /// What a byte is read as from decoder states other than [`READY`], learnt as the
    /// stream goes: `(states, byte)` → a range of `read_as`.
    reads: HashMap<(u64, u8), (u32, u32), std::hash::BuildHasherDefault<Mix>>,
    read_as: Vec<Read>,
    /// The stream offset of the next byte.
    at: u64,
}

impl Default for Scan {
    fn default() -> Scan {
        Scan {
            set: Learnt::EMPTY,
            begun: Vec::new(),
            begun_next: Vec::new(),
            learnt: Learnt::new(),
            threads: Vec::new(),
            next: Vec::new(),
            reads: HashMap::default(),
            read_as: Vec::new(),
            at: 0,
        }
    }
}

impl Scan {
    /// Scans `data`, telling `found` the end (exclusive, in the stream's bytes) and the
    /// widest form of a secret that ends at each byte where one does.
    fn run(&mut self, scrubber: &Scrubber, data: &[u8], mut found: impl FnMut(u64, Found)) {
        let mut i = 0;
        while i < data.len() {
            if self.threads.is_empty() && self.set == Learnt::EMPTY {
                // Nothing under way: on to the next byte a form could start with.
                match data[i..]
                    .iter()
                    .position(|&c| scrubber.starts[usize::from(c)])
                {
                    Some(skip) => i += skip,
                    None => break,
                }
            }
            let at = self.at + i as u64;
            if let Some(f) = self.step(scrubber, data[i], at) {
                found(at + 1, f);
            }
            i += 1;
        }
        self.at += data.len() as u64;
    }

    /// Scans byte `c`, the stream's byte `at`.
    fn step(&mut self, scrubber: &Scrubber, c: u8, at: u64) -> Option<Found> {
        let mut found: Option<Found> = None;
        let next = &mut self.next;
        next.clear();
        for t in &self.threads {
            let plain = [Read::Value(c)];
            let reads = if t.decs == READY && plain_byte(c) {
                // The common case: a byte as it is.
                &plain[..]
            } else {
                learnt_read(&mut self.reads, &mut self.read_as, t.decs, c)
            };
            for r in reads {
                let v = match *r {
                    Read::Decs(decs) => {
                        keep(next, Thread { decs, ..*t });
                        continue;
                    }
                    Read::Value(v) => v,
                };
                match scrubber.take(t.goal, v) {
                    Taken::Dead => {}
                    Taken::Next(goal) => keep(
                        next,
                        Thread {
                            goal,
                            decs: READY,
                            start: t.start,
                        },
                    ),
                    Taken::Done { base64 } => {
                        found = Some(Found {
                            start: found.map_or(t.start, |f| f.start.min(t.start)),
                            base64: base64 || found.is_some_and(|f| f.base64),
                        });
                    }
                }
            }
        }
        // The reads that wait for a first value, all at once: the move from their set on
        // `c` is learnt once.
        let spawn = scrubber.starts[usize::from(c)];
        if self.set == Learnt::EMPTY && spawn && plain_byte(c) {
            // The common case: a form begins with a byte as it is.
            for &goal in &scrubber.first[usize::from(c)] {
                keep(
                    next,
                    Thread {
                        goal,
                        decs: READY,
                        start: at,
                    },
                );
            }
        } else if spawn || self.set != Learnt::EMPTY {
            let m = self.learnt.move_of(scrubber, self.set, c, spawn);
            let m = &self.learnt.moves[m];
            let begun = |s: u16| self.begun.get(usize::from(s)).copied().unwrap_or(at);
            for &(v, s) in &m.values {
                for &goal in &scrubber.first[usize::from(v)] {
                    keep(
                        next,
                        Thread {
                            goal,
                            decs: READY,
                            start: begun(s),
                        },
                    );
                }
            }
            let now = &mut self.begun_next;
            now.clear();
            now.resize(m.size, u64::MAX);
            for &(t, s) in &m.sources {
                now[usize::from(t)] = now[usize::from(t)].min(begun(s));
            }
            self.set = m.to;
            std::mem::swap(&mut self.begun, &mut self.begun_next);
        }
        if next.len() > FEW {
            next.sort_unstable();
            next.dedup_by(|b, a| a.goal == b.goal && a.decs == b.decs);
        }
        std::mem::swap(&mut self.threads, &mut self.next);
        found
    }
}

/// What byte `c` is read as from `decs`, learnt once per stream (`cache` indexes `read_as`).
fn learnt_read<'a>(
    cache: &mut HashMap<(u64, u8), (u32, u32), std::hash::BuildHasherDefault<Mix>>,
    read_as: &'a mut Vec<Read>,
    decs: Decs,
    c: u8,
) -> &'a [Read] {
    let key = (pack(decs), c);
    if let Some(&(from, to)) = cache.get(&key) {
        return &read_as[from as usize..to as usize];
    }
    // A hostile stream could make it grow without end: forgotten past a bound.
    if read_as.len() > 1 << 16 {
        cache.clear();
        read_as.clear();
    }
    let from = read_as.len();
    read(decs, c, read_as);
    cache.insert(key, (from as u32, read_as.len() as u32));
    &read_as[from..]
}

/// Decoder states as one number, for [`Mix`] to hash: 32 bits a layer.
fn pack(decs: Decs) -> u64 {
    const _: () = assert!(LAYERS <= 2, "32 bits a layer");
    let one = |d: Dec| -> u64 {
        let (tag, a, b, c) = match d {
            Dec::Ready => (0, 0, 0, 0),
            Dec::Percent {
                digits,
                value,
                in_run,
            } => (1, digits, value, u8::from(in_run)),
            Dec::Backslashes => (2, 0, 0, 0),
            Dec::Code { left, value } => (3, left, value, 0),
            Dec::Ampersand => (4, 0, 0, 0),
            Dec::Number => (5, 0, 0, 0),
            Dec::Digits { hex, count, value } => (6, u8::from(hex), count, value),
            Dec::Name(node) => (7, node, 0, 0),
        };
        u64::from(u32::from_le_bytes([tag, a, b, c]))
    };
    decs.iter().fold(0, |packed, d| packed << 32 | one(*d))
}

/// The sets of decoder states of reads that wait for a form's first value, and the moves
/// between them, learnt as a stream goes (a lazy DFA): they depend on no secret but through
/// which first values matter, and a stream meets few, so a flood of escape characters
/// costs a lookup a byte.
struct Learnt {
    sets: Vec<Vec<Decs>>,
    ids: HashMap<Vec<Decs>, u32>,
    moves: Vec<Move>,
    /// `set << 8 | byte` → the move.
    index: HashMap<u64, u32, std::hash::BuildHasherDefault<Mix>>,
    /// The last move looked up (a flood repeats one).
    last: Option<(u64, u32)>,
}

/// A hasher for [`Learnt`]'s keys: a multiply, not SipHash (the keys are this stream's own
/// small numbers, not chosen by anyone to collide: a set's number is its order of meeting).
#[derive(Default)]
struct Mix(u64);

impl std::hash::Hasher for Mix {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0 ^ self.0 >> 29
    }
}

/// One move of [`Learnt`].
struct Move {
    to: u32,
    /// The size of set `to`.
    size: usize,
    /// Each state of `to` (by index) and a state it came from (by index in the set it came
    /// from; one past its end: a read that began with this byte).
    sources: Vec<(u16, u16)>,
    /// First values read, and the state each came from.
    values: Vec<(u8, u16)>,
}

impl Learnt {
    const EMPTY: u32 = 0;
    /// Past this many sets, all is forgotten (a stream that meets so many is hostile; it
    /// is scanned all the same, at the cost of learning again).
    const MOST: usize = 4096;

    fn new() -> Learnt {
        let mut learnt = Learnt {
            sets: Vec::new(),
            ids: HashMap::new(),
            moves: Vec::new(),
            index: HashMap::default(),
            last: None,
        };
        learnt.id(Vec::new());
        learnt
    }

    fn id(&mut self, set: Vec<Decs>) -> u32 {
        if let Some(&id) = self.ids.get(&set) {
            return id;
        }
        let id = self.sets.len() as u32;
        self.sets.push(set.clone());
        self.ids.insert(set, id);
        id
    }

    /// The move from `set` on byte `c` (`spawn`: a read may begin with `c`), learnt if new.
    fn move_of(&mut self, scrubber: &Scrubber, set: u32, c: u8, spawn: bool) -> usize {
        let key = u64::from(set) << 8 | u64::from(c);
        if let Some((k, m)) = self.last {
            if k == key {
                return m as usize;
            }
        }
        if let Some(&m) = self.index.get(&key) {
            self.last = Some((key, m));
            return m as usize;
        }
        let mut from = self.sets[set as usize].clone();
        if self.sets.len() > Learnt::MOST {
            *self = Learnt::new();
            self.id(from.clone());
        }
        let set = self.id(from.clone());
        if spawn {
            from.push(READY);
        }
        let (mut edges, mut values, mut reads) = (Vec::new(), Vec::new(), Vec::new());
        for (i, decs) in from.iter().enumerate() {
            reads.clear();
            read(*decs, c, &mut reads);
            for r in &reads {
                match *r {
                    Read::Decs(d) => edges.push((d, i as u16)),
                    Read::Value(v) if !scrubber.first[usize::from(v)].is_empty() => {
                        values.push((v, i as u16));
                    }
                    Read::Value(_) => {}
                }
            }
        }
        let mut to: Vec<Decs> = edges.iter().map(|e| e.0).collect();
        to.sort_unstable();
        to.dedup();
        let sources = edges
            .iter()
            .map(|(d, i)| (to.binary_search(d).expect("in the set") as u16, *i))
            .collect();
        let size = to.len();
        let to = self.id(to);
        self.moves.push(Move {
            to,
            size,
            sources,
            values,
        });
        let m = self.moves.len() - 1;
        self.index
            .insert(u64::from(set) << 8 | u64::from(c), m as u32);
        m
    }
}

/// Up to this many threads, each new one is merged with its twin as it comes; past it,
/// they are sorted and merged once the byte is read.
const FEW: usize = 16;

/// Adds `t` to `threads`, or keeps the earlier start of its twin (the widest mask).
fn keep(threads: &mut Vec<Thread>, t: Thread) {
    if threads.len() <= FEW {
        if let Some(twin) = threads
            .iter_mut()
            .find(|o| o.goal == t.goal && o.decs == t.decs)
        {
            twin.start = twin.start.min(t.start);
            return;
        }
    }
    threads.push(t);
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
        self.scan
            .run(&self.scrubber, data, |end, found| spans.push((found, end)));
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
