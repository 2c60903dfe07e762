//! Scans and decodes Python pickles without ever running them.
//!
//! The stream is parsed opcode by opcode (protocols 0 to 5) and interpreted symbolically: the
//! stack, the marks and the memo hold descriptions of values, never objects. A global is
//! allowed only as an exact `module.qualname` in the allow-list; anything that would call or
//! import something else makes the pickle `unsafe`, and `decode` then refuses it. Nothing is
//! executed, imported or called, whatever the input.

mod compat;
mod container;
mod json;
mod text;
mod vm;

use std::collections::BTreeSet;

pub use container::{scan_file, FileReport, Member};
pub use vm::{decode, scan};

/// What the scanner allows and how much work it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Globals allowed, as exact `module.qualname`. Only these have a decoded form; others
    /// added here decode as `{"$call": name, "args": [...]}`.
    pub allow: BTreeSet<String>,
    /// Deepest nesting `decode` follows.
    pub max_depth: usize,
    /// Largest pickle accepted, in bytes.
    pub max_bytes: usize,
}

/// The allow-list by default: the constructors CPython itself uses to pickle plain data
/// (sets, frozensets, bytearrays, complex numbers, ordered dicts, and bytes in protocols 0-2).
/// Protocols 0-2 name them `__builtin__.set` and so on, which CPython loads as `builtins.set`:
/// names are checked as CPython resolves them.
pub const DEFAULT_ALLOW: &[&str] = &[
    "builtins.set",
    "builtins.frozenset",
    "builtins.bytearray",
    "builtins.bytes",
    "builtins.complex",
    "_codecs.encode",
    "collections.OrderedDict",
];

impl Default for Options {
    fn default() -> Options {
        Options {
            allow: DEFAULT_ALLOW.iter().map(|s| s.to_string()).collect(),
            max_depth: 200,
            max_bytes: 256 << 20,
        }
    }
}

/// A global the pickle names, as CPython would import it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Global {
    pub module: String,
    pub name: String,
    /// The name as written, when CPython maps it (a Python 2 name below protocol 3).
    pub written: Option<String>,
    /// Offset of the opcode that named it.
    pub offset: usize,
    pub allowed: bool,
}

impl Global {
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.module, self.name)
    }
}

/// An opcode that calls, builds or looks something up (REDUCE, INST, OBJ, NEWOBJ, NEWOBJ_EX,
/// BUILD, EXT1/2/4, PERSID, BINPERSID, buffers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSite {
    pub opcode: &'static str,
    pub offset: usize,
    /// The callable's name, when it is a known global.
    pub target: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Plain data and allow-listed constructors only.
    Safe,
    /// Loading it would call or import something not allowed.
    Unsafe { reasons: Vec<String> },
    /// Not a pickle CPython could load, at this offset.
    Malformed { offset: usize, reason: String },
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Safe => "safe",
            Verdict::Unsafe { .. } => "unsafe",
            Verdict::Malformed { .. } => "malformed",
        }
    }
}

/// Everything the scan saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The PROTO opcode's protocol, if any (protocols 0 and 1 have none).
    pub protocol: Option<u8>,
    pub size: usize,
    /// Pickles one after another in the data (the first is the value; each is scanned).
    pub pickles: usize,
    /// Bytes after the last pickle that are no pickle (CPython ignores them).
    pub trailing_bytes: usize,
    pub opcodes: usize,
    pub globals: Vec<Global>,
    pub calls: Vec<CallSite>,
    pub verdict: Verdict,
}

impl Report {
    /// Nothing seen yet in `size` bytes.
    pub(crate) fn new(size: usize) -> Report {
        Report {
            protocol: None,
            size,
            pickles: 0,
            trailing_bytes: 0,
            opcodes: 0,
            globals: Vec::new(),
            calls: Vec::new(),
            verdict: Verdict::Safe,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "verdict": self.verdict.name(),
            "protocol": self.protocol,
            "size": self.size,
            "pickles": self.pickles,
            "trailing_bytes": self.trailing_bytes,
            "opcodes": self.opcodes,
            "globals": self.globals.iter().map(|g| serde_json::json!({
                "module": g.module, "name": g.name, "written": g.written,
                "offset": g.offset, "allowed": g.allowed,
            })).collect::<Vec<_>>(),
            "calls": self.calls.iter().map(|c| serde_json::json!({
                "opcode": c.opcode, "offset": c.offset, "target": c.target,
            })).collect::<Vec<_>>(),
        });
        match &self.verdict {
            Verdict::Safe => {}
            Verdict::Unsafe { reasons } => v["reasons"] = serde_json::json!(reasons),
            Verdict::Malformed { offset, reason } => {
                v["offset"] = serde_json::json!(offset);
                v["reason"] = serde_json::json!(reason);
            }
        }
        v
    }
}

/// Why `decode` gave no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Unsafe(Vec<String>),
    Malformed {
        offset: usize,
        reason: String,
    },
    /// Safe, but not representable: a cycle, or nesting deeper than `max_depth`.
    Unrepresentable(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Unsafe(r) => write!(f, "unsafe: {}", r.join("; ")),
            DecodeError::Malformed { offset, reason } => {
                write!(f, "malformed at offset {offset}: {reason}")
            }
            DecodeError::Unrepresentable(why) => write!(f, "not representable as JSON: {why}"),
        }
    }
}

impl std::error::Error for DecodeError {}
