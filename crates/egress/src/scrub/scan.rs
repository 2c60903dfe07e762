//! The scan: every way of reading the bytes so far as the start of a form of a secret
//! (threads), each checking the values the decoder gives against what it looks for next.

use std::collections::HashMap;

use super::decode::{hex_value, pack, plain_byte, read, Decs, Read, READY};

/// The secrets, and what each decoded value means for a form of one.
pub(super) struct Goals {
    pub(super) secrets: Vec<Vec<u8>>,
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

/// What a goal makes of decoded value `v`.
enum Taken {
    Dead,
    Next(Goal),
    /// The form is whole; `base64`: it was base64 text.
    Done {
        base64: bool,
    },
}

/// A way of reading the bytes since `start` as the start of a form of a secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Thread {
    goal: Goal,
    decs: Decs,
    start: u64,
}

/// A form of a secret, ending at the byte just scanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Found {
    /// Where it started, in the stream's bytes.
    pub(super) start: u64,
    /// It was base64 text: the characters on each side hold bits of the secret too.
    pub(super) base64: bool,
}

impl Goals {
    /// The goals of `secrets`, each at least a few bytes long (shorter ones are left out:
    /// they could not be told from ordinary text).
    pub(super) fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Goals {
        let secrets: Vec<Vec<u8>> = secrets
            .into_iter()
            .filter(|s| s.len() >= 4)
            .map(<[u8]>::to_vec)
            .collect();
        let mut scrubber = Goals {
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
}

/// The six bits of `secret` from bit `bit` (the first bit is the first byte's highest).
fn bits(secret: &[u8], bit: u32) -> u32 {
    let at = (bit / 8) as usize;
    let pair = u32::from(secret[at]) << 8 | u32::from(secret.get(at + 1).copied().unwrap_or(0));
    pair >> (10 - bit % 8) & 0x3f
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

/// What the bytes scanned so far leave under way.
pub(super) struct Scan {
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
    pub(super) at: u64,
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
    pub(super) fn run(&mut self, scrubber: &Goals, data: &[u8], mut found: impl FnMut(u64, Found)) {
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
    fn step(&mut self, scrubber: &Goals, c: u8, at: u64) -> Option<Found> {
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
    fn move_of(&mut self, scrubber: &Goals, set: u32, c: u8, spawn: bool) -> usize {
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
