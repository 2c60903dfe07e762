//! The text arguments of protocols 0 and 1, read exactly as CPython's C unpickler reads them:
//! `strtol`, `PyLong_FromString`, `PyOS_string_to_double` and the raw-unicode-escape and
//! surrogatepass decoders. A line is given without its `\n`; the C code sees it followed by
//! `\n\0`, so a NUL inside a line ends what most of these functions read.

use num_bigint::BigInt;
use num_traits::{ToPrimitive, Zero};

/// CPython refuses decimal integers of more than 4300 digits unless
/// `sys.set_int_max_str_digits` raised the limit: a reader's setting, not the stream's.
pub(crate) const TOO_MANY_DIGITS: &str = "an integer of more than 4300 digits";

/// What an INT line loads as.
pub(crate) enum Int {
    Bool(bool),
    Int(BigInt),
}

/// `isspace` in the C locale, and CPython's `Py_ISSPACE`.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Leading whitespace and a sign, as both C and CPython skip them: whether the number is
/// negative, and where its digits start.
fn spaces_and_sign(s: &[u8]) -> (bool, usize) {
    let mut i = 0;
    while i < s.len() && is_space(s[i]) {
        i += 1;
    }
    match s.get(i) {
        Some(b'-') => (true, i + 1),
        Some(b'+') => (false, i + 1),
        _ => (false, i),
    }
}

/// Up to the first NUL, where the C string ends.
fn c_str(l: &[u8]) -> &[u8] {
    l.split(|&b| b == 0).next().unwrap_or_default()
}

/// INT: `strtol(s, &end, 0)` first (C-style octal and hex), kept when it fits a long and
/// reaches the end of the line or a NUL; a two-character line of 0 or 1 is a bool. Anything
/// else goes to `PyLong_FromString(s, NULL, 0)`.
pub(crate) fn int(l: &[u8]) -> Result<Int, String> {
    if l.is_empty() {
        return Err("an empty line".into());
    }
    if let Some(x) = strtol0(l) {
        return Ok(if l.len() == 2 && (x == 0 || x == 1) {
            Int::Bool(x == 1)
        } else {
            Int::Int(x.into())
        });
    }
    long(l, true).map(Int::Int)
}

/// INT as pickle.py reads it: only "00" and "01" are bools, anything else is `int(l, 0)`
/// (the C unpickler also reads "+1", "-0" or " 1" as bools). Only for lines
/// [`python_int`] accepts.
pub(crate) fn python_int_value(l: &[u8]) -> Result<Int, String> {
    match l {
        b"00" => Ok(Int::Bool(false)),
        b"01" => Ok(Int::Bool(true)),
        _ => long(l, true).map(Int::Int),
    }
}

/// glibc's `strtol` with base 0: the value, if it fits an i64 and the digits stop at the end
/// of the line or at a NUL. `l` is not empty.
fn strtol0(l: &[u8]) -> Option<i64> {
    let (negative, i) = spaces_and_sign(l);
    let hex = l.get(i) == Some(&b'0')
        && matches!(l.get(i + 1), Some(b'x' | b'X'))
        && l.get(i + 2).is_some_and(u8::is_ascii_hexdigit);
    let (base, start) = match (hex, l.get(i)) {
        (true, _) => (16, i + 2),
        (false, Some(b'0')) => (8, i),
        _ => (10, i),
    };
    let mut value: u128 = 0;
    let mut j = start;
    while let Some(d) = l.get(j).and_then(|&c| (c as char).to_digit(base)) {
        value = (value * base as u128 + d as u128).min(1 << 64);
        j += 1;
    }
    if j == start {
        // No digits: the end is the line's start, fine only if the line starts with a NUL.
        return (l[0] == 0).then_some(0);
    }
    if j < l.len() && l[j] != 0 {
        return None;
    }
    let value = i128::try_from(value).ok()?;
    i64::try_from(if negative { -value } else { value }).ok()
}

/// `PyLong_FromString(s, NULL, base)` with base 0 (prefixes, and no leading zeros) or 10:
/// surrounding whitespace, a sign, single underscores between digits, and at most 4300
/// decimal digits (CPython's limit; hexadecimal, octal and binary have none).
pub(crate) fn long(l: &[u8], base0: bool) -> Result<BigInt, String> {
    let s = c_str(l);
    let invalid = || Err("not an integer as Python reads one".to_string());
    let (negative, mut i) = spaces_and_sign(s);
    let mut base = 10;
    let mut zero_only = false;
    if base0 && s.get(i) == Some(&b'0') {
        match s.get(i + 1).map(u8::to_ascii_lowercase) {
            Some(b'x') => base = 16,
            Some(b'o') => base = 8,
            Some(b'b') => base = 2,
            // "010": the old octal form, an error unless the value is zero.
            _ => zero_only = true,
        }
        if base != 10 {
            i += 2;
            if s.get(i) == Some(&b'_') {
                i += 1;
            }
        }
    }
    let mut digits = Vec::new();
    let mut after_underscore = true;
    while let Some(&c) = s.get(i) {
        if c == b'_' {
            if after_underscore {
                return invalid();
            }
            after_underscore = true;
        } else if (c as char).is_digit(base) {
            digits.push(c);
            after_underscore = false;
        } else {
            break;
        }
        i += 1;
    }
    if digits.is_empty() || after_underscore {
        return invalid();
    }
    while i < s.len() && is_space(s[i]) {
        i += 1;
    }
    if i != s.len() {
        return invalid();
    }
    if base == 10 && digits.len() > 4300 {
        return Err(TOO_MANY_DIGITS.into());
    }
    let Some(n) = BigInt::parse_bytes(&digits, base) else {
        return invalid();
    };
    if zero_only && !n.is_zero() {
        return invalid();
    }
    Ok(if negative { -n } else { n })
}

/// Whether pickle.py reads an INT (`with_bool`) or LONG line: Python's `int(line, 0)`, which
/// takes no NUL and no C-style octal (the C unpickler takes both).
pub(crate) fn python_int(l: &[u8], with_bool: bool) -> bool {
    !l.contains(&0)
        && if with_bool {
            python_int_value(l).is_ok()
        } else {
            long(l, true).is_ok()
        }
}

/// Whether pickle.py reads a PUT or GET index: `int(line)`, which takes no NUL.
pub(crate) fn python_index(l: &[u8]) -> bool {
    !l.contains(&0) && memo_index(l).is_some()
}

/// PUT and GET: a base-10 index CPython takes as a non-negative Py_ssize_t.
pub(crate) fn memo_index(l: &[u8]) -> Option<u64> {
    let n = long(l, false).ok()?;
    n.to_i64().and_then(|i| u64::try_from(i).ok())
}

/// FLOAT as the C unpickler reads it: `PyOS_string_to_double` (up to a NUL, no whitespace,
/// `1e500` refused as too large). Rust's parser accepts the same forms (digits, `inf`,
/// `infinity`, `nan`, any case) and rounds the same way.
pub(crate) fn c_float(l: &[u8]) -> Result<f64, String> {
    let text = std::str::from_utf8(c_str(l)).map_err(|_| "not a number")?;
    let f: f64 = text.parse().map_err(|_| "not a number")?;
    let word = text.trim_start_matches(['+', '-']).to_ascii_lowercase();
    if f.is_infinite() && word != "inf" && word != "infinity" {
        return Err("out of a double's range (CPython raises OverflowError)".into());
    }
    Ok(f)
}

/// FLOAT as pickle.py (which dill uses) reads it: Python's `float(bytes)` (surrounding
/// whitespace, underscores between digits, `1e500` is inf, no NUL).
pub(crate) fn python_float(l: &[u8]) -> Option<f64> {
    if l.contains(&0) {
        return None;
    }
    let text = std::str::from_utf8(l)
        .ok()?
        .trim_matches(|c: char| is_space(c as u8) && c.is_ascii());
    // Underscores only between digits.
    let b = text.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'_'
            && !(i > 0 && b[i - 1].is_ascii_digit() && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            return None;
        }
    }
    text.replace('_', "").parse().ok()
}

/// raw-unicode-escape: `\uXXXX` and `\UXXXXXXXX` (surrogates included), a backslash before
/// anything else kept with it, every other byte Latin-1.
pub(crate) fn raw_unicode_escape(l: &[u8]) -> Option<Vec<u32>> {
    let mut out = Vec::with_capacity(l.len());
    let mut i = 0;
    while i < l.len() {
        let c = l[i];
        if c != b'\\' || i + 1 == l.len() {
            out.push(c as u32);
            i += 1;
            continue;
        }
        let width = match l[i + 1] {
            b'u' => 4,
            b'U' => 8,
            other => {
                // The pair is consumed: in `\\u0041` the second backslash escapes nothing.
                out.push(b'\\' as u32);
                out.push(other as u32);
                i += 2;
                continue;
            }
        };
        let hex = l.get(i + 2..i + 2 + width)?;
        if !hex.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let v = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
        if v > 0x10_FFFF {
            return None;
        }
        out.push(v);
        i += 2 + width;
    }
    Some(out)
}

/// UTF-8 with the surrogatepass error handler: surrogates encoded in three bytes are code
/// points like any other; any other invalid sequence fails.
pub(crate) fn utf8_surrogatepass(mut b: &[u8]) -> Option<Vec<u32>> {
    let mut out = Vec::with_capacity(b.len());
    loop {
        match std::str::from_utf8(b) {
            Ok(s) => {
                out.extend(s.chars().map(|c| c as u32));
                return Some(out);
            }
            Err(e) => {
                let (good, rest) = b.split_at(e.valid_up_to());
                // Valid up to here.
                out.extend(std::str::from_utf8(good).ok()?.chars().map(|c| c as u32));
                match rest {
                    [0xED, b1 @ 0xA0..=0xBF, b2 @ 0x80..=0xBF, ..] => {
                        out.push(0xD000 | ((*b1 as u32 & 0x3F) << 6) | (*b2 as u32 & 0x3F));
                        b = &rest[3..];
                    }
                    _ => return None,
                }
            }
        }
    }
}
