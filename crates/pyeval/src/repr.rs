//! repr() and str() exactly as CPython 3.11 prints them, with a cap on the
//! length of the output.

use std::fmt::Write;

use num_bigint::BigInt;

use crate::budget::Budget;
use crate::error::{value_error, Error, ErrorKind, Result};
use crate::num::{complex_repr, float_repr};
use crate::printable::PRINTABLE;
use crate::value::Value;

/// CPython's default `sys.get_int_max_str_digits()`.
pub(crate) const INT_MAX_STR_DIGITS: usize = 4300;

/// CPython's words, but for its advice to call `sys.set_int_max_str_digits()`, which no
/// expression can: the limit is said instead ([`INT_DIGITS_LIMIT`]).
pub(crate) fn int_digits_error() -> Error {
    value_error(format!(
        "Exceeds the limit (4300 digits) for integer string conversion; {INT_DIGITS_LIMIT}"
    ))
}

/// Why an int's decimal form stops at 4300 digits here.
pub const INT_DIGITS_LIMIT: &str =
    "an int is written with at most 4300 decimal digits (CPython's default, which an expression cannot change)";

pub(crate) fn int_repr(n: &BigInt) -> Result<String> {
    // Decimal digits are at most bits*log10(2)+1: refuse before converting.
    if n.bits() > 14_300 {
        return Err(int_digits_error());
    }
    let s = n.to_string();
    let digits = s.len() - usize::from(s.starts_with('-'));
    if digits > INT_MAX_STR_DIGITS {
        return Err(int_digits_error());
    }
    Ok(s)
}

pub(crate) fn is_printable(c: char) -> bool {
    let c = c as u32;
    if c < 0x7f {
        return c >= 0x20;
    }
    in_ranges(PRINTABLE, c)
}

/// Whether CPython 3.11's Unicode database (14.0) assigns this code point.
pub(crate) fn is_assigned(c: char) -> bool {
    in_ranges(crate::printable::ASSIGNED, c as u32)
}

fn in_ranges(table: &[(u32, u32)], c: u32) -> bool {
    table
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

pub(crate) fn str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c => {
                let v = c as u32;
                let _ = if v < 0x100 {
                    write!(out, "\\x{v:02x}")
                } else if v < 0x1_0000 {
                    write!(out, "\\u{v:04x}")
                } else {
                    write!(out, "\\U{v:08x}")
                };
            }
        }
    }
    out.push(quote);
}

pub(crate) fn bytes_repr(b: &[u8], out: &mut String) {
    let quote = if b.contains(&b'\'') && !b.contains(&b'"') {
        '"'
    } else {
        '\''
    };
    out.push('b');
    out.push(quote);
    for &c in b {
        match c {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            c if c as char == quote => {
                out.push('\\');
                out.push(quote);
            }
            0x20..=0x7e => out.push(c as char),
            c => {
                let _ = write!(out, "\\x{c:02x}");
            }
        }
    }
    out.push(quote);
}

struct Writer<'b> {
    out: String,
    cap: usize,
    budget: &'b mut Budget,
}

impl Writer<'_> {
    fn check(&mut self) -> Result<()> {
        if self.out.len() > self.cap {
            return Err(Error::limit(
                ErrorKind::MemoryError,
                format!(
                    "result too large: its repr is longer than {} bytes",
                    self.cap
                ),
            ));
        }
        self.budget.tick()
    }

    fn value(&mut self, v: &Value) -> Result<()> {
        match v {
            Value::None => self.out.push_str("None"),
            Value::Ellipsis => self.out.push_str("Ellipsis"),
            Value::Bool(true) => self.out.push_str("True"),
            Value::Bool(false) => self.out.push_str("False"),
            Value::Int(n) => {
                let s = int_repr(n)?;
                self.out.push_str(&s);
            }
            Value::Float(f) => self.out.push_str(&float_repr(*f, true)),
            Value::Complex(re, im) => self.out.push_str(&complex_repr(*re, *im)),
            Value::Str(s) => {
                if s.len() > self.cap {
                    return self.check_len(s.len());
                }
                str_repr(s, &mut self.out)
            }
            Value::Bytes(b) => {
                if b.len() > self.cap {
                    return self.check_len(b.len());
                }
                bytes_repr(b, &mut self.out)
            }
            Value::List(items) => self.seq('[', ']', items, false)?,
            Value::Tuple(items) => self.seq('(', ')', items, items.len() == 1)?,
            Value::Set(set) => {
                if set.len() == 0 {
                    self.out.push_str("set()");
                } else {
                    self.out.push('{');
                    for (i, (_, item)) in set.iter().enumerate() {
                        if i > 0 {
                            self.out.push_str(", ");
                        }
                        self.nested(item)?;
                    }
                    self.out.push('}');
                }
            }
            Value::Dict(d) => {
                self.out.push('{');
                for (i, (_, k, v)) in d.entries().enumerate() {
                    if i > 0 {
                        self.out.push_str(", ");
                    }
                    self.nested(k)?;
                    self.out.push_str(": ");
                    self.nested(v)?;
                }
                self.out.push('}');
            }
            Value::Slice(parts) => {
                self.out.push_str("slice(");
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(", ");
                    }
                    self.nested(p)?;
                }
                self.out.push(')');
            }
        }
        self.check()
    }

    fn check_len(&mut self, len: usize) -> Result<()> {
        self.out.reserve(0);
        Err(Error::limit(
            ErrorKind::MemoryError,
            format!(
                "result too large: its repr is longer than {} bytes ({len} bytes of text)",
                self.cap
            ),
        ))
    }

    fn nested(&mut self, v: &Value) -> Result<()> {
        stacker::maybe_grow(64 << 10, 1 << 20, || self.value(v))
    }

    fn seq(
        &mut self,
        open: char,
        close: char,
        items: &[Value],
        trailing_comma: bool,
    ) -> Result<()> {
        self.out.push(open);
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            self.nested(item)?;
        }
        if trailing_comma {
            self.out.push(',');
        }
        self.out.push(close);
        Ok(())
    }
}

pub(crate) fn repr(v: &Value, budget: &mut Budget) -> Result<String> {
    let cap = budget.limits.max_result_bytes;
    let mut w = Writer {
        out: String::new(),
        cap,
        budget,
    };
    w.value(v)?;
    Ok(w.out)
}
