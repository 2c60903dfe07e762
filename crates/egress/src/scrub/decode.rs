//! Escapes read as the values they stand for, every way at once: percent-encoding, JSON's
//! and Python's backslash escapes, HTML's character references, each nested in itself and
//! two kinds one inside the other. Secret-independent: what the scan (`scan.rs`) does with
//! a value is its own business.

/// Where a thread is in reading one encoded byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Dec {
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
pub(super) const LAYERS: usize = 2;

/// Each layer's decoder state, the outermost encoding's first.
pub(super) type Decs = [Dec; LAYERS];

pub(super) const READY: Decs = [Dec::Ready; LAYERS];

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

pub(super) fn hex_value(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
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
pub(super) enum Read {
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
pub(super) fn read(decs: Decs, c: u8, out: &mut Vec<Read>) {
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
pub(super) fn plain_byte(c: u8) -> bool {
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

/// Decoder states as one number, for a hasher: 32 bits a layer.
pub(super) fn pack(decs: Decs) -> u64 {
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
