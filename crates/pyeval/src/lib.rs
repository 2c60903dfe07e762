//! A native evaluator for Python literal expressions: the answers CPython
//! 3.11 gives, without an interpreter, a process or unbounded work.
//!
//! ```
//! let limits = airlock_pyeval::Limits::default();
//! let v = airlock_pyeval::evaluate("{3, 1, 2} | {0}", &limits).unwrap();
//! assert_eq!(v.repr, "{0, 1, 2, 3}");
//! let e = airlock_pyeval::evaluate("1/0", &limits).unwrap_err();
//! assert_eq!(e.to_string(), "ZeroDivisionError: division by zero");
//! ```
//!
//! The expression is parsed by ruff's Python parser; names, calls,
//! attributes, lambdas, comprehensions, f-strings, `:=`, `is`, starred
//! expressions and `await`/`yield` are refused before anything is evaluated.
//! Work is bounded by [`Limits`]: input length, memory, integer width,
//! result size and time. Nothing recurses without the stack to do it.

mod budget;
mod compile;
mod error;
mod eval;
mod hash;
mod num;
mod ops;
mod printable;
mod repr;
mod value;

use ruff_text_size::Ranged;
use serde_json::json;

pub use budget::Limits;
pub use error::{Error, ErrorKind};
/// For the test that checks it against the installed CPython.
#[doc(hidden)]
pub use eval::INTERNED_AT_STARTUP;
/// What airlock says where CPython advises `sys.set_int_max_str_digits()` (the differential
/// test reads CPython's message with it).
pub use repr::INT_DIGITS_LIMIT;

use budget::Budget;
use value::Value;

/// A successful evaluation, already printed.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluated {
    /// The value's type, as `type(v).__name__`.
    pub type_name: &'static str,
    /// `repr(v)`.
    pub repr: String,
    /// `str(v)`.
    pub str: String,
    /// The value as JSON, when JSON holds it exactly: None, bools, ints of
    /// 64 bits, finite floats, str, and lists, tuples and str-keyed dicts of
    /// those.
    pub value: Option<serde_json::Value>,
}

/// CPython's limit on nested brackets ("too many nested parentheses").
const MAX_PAREN_LEVEL: usize = 200;

/// Stack the deepest input of `len` bytes may need for dropping syntax trees
/// (drop glue recurses; everything else grows the stack on demand).
fn stack_for(len: usize) -> usize {
    (256 << 10) + len * 2048
}

/// Evaluates one expression (`<expr>` or `result = <expr>`).
pub fn evaluate(source: &str, limits: &Limits) -> Result<Evaluated, Error> {
    with_value(source, limits, |outcome| {
        let (value, repr) = outcome?;
        let str = match &value {
            Value::Str(s) => s.to_string(),
            _ => repr.clone(),
        };
        Ok(Evaluated {
            type_name: value.type_name(),
            value: to_json(&value),
            repr,
            str,
        })
    })
}

/// Evaluates one expression and writes [`outcome_json`]'s object for it, byte for byte,
/// without building it: no `str()` copied from the `repr()`, no JSON tree. What
/// `airlock eval --json` writes, line after line. Returns whether the evaluation succeeded
/// (known even when writing fails) and whether writing did.
pub fn evaluate_json(
    source: &str,
    limits: &Limits,
    out: &mut (impl std::io::Write + ?Sized),
) -> (bool, std::io::Result<()>) {
    with_value(source, limits, |outcome| match outcome {
        Ok((value, repr)) => (true, write_value_object(out, &value, &repr)),
        Err(e) => (false, write_error_json(out, &e)),
    })
}

/// Hands the value and its `repr()` to `finish`, on a stack deep enough for what the input
/// may nest: the value's JSON and its drop recurse as deep as its syntax did.
fn with_value<R>(
    source: &str,
    limits: &Limits,
    finish: impl FnOnce(Result<(Value, String), Error>) -> R,
) -> R {
    let cap = limits.max_input_bytes.min(Limits::MAX_INPUT);
    if source.len() > cap {
        return finish(Err(Error::limit(
            ErrorKind::NotAllowedError,
            format!(
                "expression too long: {} bytes, the limit is {cap}",
                source.len()
            ),
        )));
    }
    let needed = stack_for(source.len());
    if stacker::remaining_stack().is_some_and(|left| left >= needed) {
        finish(evaluate_here(source, limits))
    } else {
        stacker::grow(needed, || finish(evaluate_here(source, limits)))
    }
}

fn write_value_object(
    out: &mut (impl std::io::Write + ?Sized),
    value: &Value,
    repr: &str,
) -> std::io::Result<()> {
    let str = match value {
        Value::Str(s) => s,
        _ => repr,
    };
    write_ok_json(out, value.type_name(), repr, str)?;
    if json_exact(value) {
        out.write_all(b",\"value\":")?;
        write_value_json(out, value)?;
    }
    out.write_all(b"}")
}

fn evaluate_here(source: &str, limits: &Limits) -> Result<(Value, String), Error> {
    let mut budget = Budget::new(limits);
    if source.contains('\0') {
        return Err(Error::new(
            ErrorKind::ValueError,
            "source code string cannot contain null bytes",
        ));
    }
    // CPython's tokenizer reads \r\n and \r as \n (inside triple-quoted strings too).
    let normalized;
    let source = if source.contains('\r') {
        normalized = source.replace("\r\n", "\n").replace('\r', "\n");
        normalized.as_str()
    } else {
        source
    };
    let expr = strip_result_assignment(source.trim_start_matches([' ', '\t', '\x0c']));
    let parsed = ruff_python_parser::parse_expression(expr).map_err(|e| {
        Error::new(
            ErrorKind::SyntaxError,
            format!(
                "{} (at offset {}); {ACCEPTED}",
                e.error,
                e.location.start().to_usize()
            ),
        )
    })?;
    // The parser takes U+FEFF for whitespace; CPython refuses it outside a string.
    for (at, _) in expr.match_indices('\u{feff}') {
        let in_string = parsed.tokens().iter().any(|t| {
            t.kind() == ruff_python_ast::token::TokenKind::String
                && t.range().start().to_usize() <= at
                && at < t.range().end().to_usize()
        });
        if !in_string {
            return Err(Error::new(
                ErrorKind::SyntaxError,
                format!("invalid non-printable character U+FEFF (at offset {at})"),
            ));
        }
    }
    let mut depth = 0usize;
    for token in parsed.tokens().iter() {
        use ruff_python_ast::token::TokenKind as T;
        match token.kind() {
            T::Lpar | T::Lsqb | T::Lbrace => {
                depth += 1;
                if depth > MAX_PAREN_LEVEL {
                    return Err(Error::new(
                        ErrorKind::SyntaxError,
                        "too many nested parentheses",
                    ));
                }
            }
            T::Rpar | T::Rsqb | T::Rbrace => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    let node = compile::Compiler {
        source: expr,
        budget: &mut budget,
    }
    .expr(parsed.expr())?;
    drop(parsed);
    let value = eval::Evaluator::default().eval(&node, &mut budget)?;
    drop(node);
    let repr = repr::repr(&value, &mut budget)?;
    Ok((value, repr))
}

/// What a syntax error says is accepted: a statement (an assignment to another name, an
/// import) is not an expression.
const ACCEPTED: &str = "one expression is evaluated, or `result = <expression>`";

/// `result = <expr>` is accepted as `<expr>` (the form seed 001's fix used).
fn strip_result_assignment(source: &str) -> &str {
    if let Some(rest) = source.strip_prefix("result") {
        let rest = rest.trim_start_matches([' ', '\t']);
        if let Some(expr) = rest.strip_prefix('=') {
            if !expr.starts_with('=') {
                return expr.trim_start_matches([' ', '\t']);
            }
        }
    }
    source
}

/// The key that marks a form JSON has no type for (airlock's results: README "What comes
/// back"): a dict holding it is no exact value here.
const MARK: &str = "$airlock";

/// An int within 64 bits as a JSON number, else airlock's `{"$airlock": "int", "value":
/// digits}` (a successful evaluation's ints have at most 4300 digits: its repr had them).
fn int_json(n: &num_bigint::BigInt) -> serde_json::Value {
    use num_traits::ToPrimitive;
    match (n.to_i64(), n.to_u64()) {
        (Some(i), _) => json!(i),
        (None, Some(u)) => json!(u),
        _ => json!({ MARK: "int", "value": n.to_string() }),
    }
}

/// A finite float as a JSON number, else `{"$airlock": "float", "value": "nan" | "inf" |
/// "-inf"}`.
fn float_json(f: f64) -> serde_json::Value {
    match f {
        f if f.is_nan() => json!({ MARK: "float", "value": "nan" }),
        f if f.is_infinite() => {
            json!({ MARK: "float", "value": if f > 0.0 { "inf" } else { "-inf" } })
        }
        f => json!(f),
    }
}

fn to_json(v: &Value) -> Option<serde_json::Value> {
    Some(match v {
        Value::None => serde_json::Value::Null,
        Value::Bool(b) => json!(b),
        Value::Int(n) => int_json(n),
        Value::Float(f) => float_json(*f),
        Value::Str(s) => json!(&**s),
        Value::List(items) | Value::Tuple(items) => {
            serde_json::Value::Array(items.iter().map(to_json).collect::<Option<_>>()?)
        }
        Value::Dict(d) => {
            let mut map = serde_json::Map::new();
            for (_, k, v) in d.entries() {
                let Value::Str(k) = k else { return None };
                if &**k == MARK {
                    return None;
                }
                map.insert(k.to_string(), to_json(v)?);
            }
            serde_json::Value::Object(map)
        }
        _ => return None,
    })
}

/// Whether [`to_json`] holds the value (checked before anything of it is written).
fn json_exact(v: &Value) -> bool {
    match v {
        Value::None | Value::Bool(_) | Value::Str(_) | Value::Int(_) | Value::Float(_) => true,
        Value::List(items) | Value::Tuple(items) => items.iter().all(json_exact),
        Value::Dict(d) => d
            .entries()
            .all(|(_, k, v)| matches!(k, Value::Str(k) if &**k != MARK) && json_exact(v)),
        _ => false,
    }
}

/// [`to_json`]'s value as serde_json writes it, without the tree; only for a value
/// [`json_exact`] accepts.
fn write_value_json(out: &mut (impl std::io::Write + ?Sized), v: &Value) -> std::io::Result<()> {
    match v {
        Value::None => out.write_all(b"null"),
        Value::Bool(true) => out.write_all(b"true"),
        Value::Bool(false) => out.write_all(b"false"),
        Value::Int(n) => serde_json::to_writer(out, &int_json(n)).map_err(std::io::Error::from),
        Value::Float(f) => {
            serde_json::to_writer(out, &float_json(*f)).map_err(std::io::Error::from)
        }
        Value::Str(s) => write_string_json(out, s),
        Value::List(items) | Value::Tuple(items) => {
            out.write_all(b"[")?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write_value_json(out, item)?;
            }
            out.write_all(b"]")
        }
        Value::Dict(d) => {
            out.write_all(b"{")?;
            for (i, (_, k, v)) in d.entries().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write_value_json(out, k)?;
                out.write_all(b":")?;
                write_value_json(out, v)?;
            }
            out.write_all(b"}")
        }
        _ => Ok(()),
    }
}

impl Evaluated {
    /// `{"ok": true, "type", "repr", "str", "value"?}`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut out = json!({
            "ok": true,
            "type": self.type_name,
            "repr": self.repr,
            "str": self.str,
        });
        if let Some(v) = &self.value {
            out["value"] = v.clone();
        }
        out
    }
}

impl Error {
    /// `{"ok": false, "error": {"type", "message", "limit"?}}`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut error = json!({ "type": self.kind.as_str(), "message": self.message });
        if self.limit {
            error["limit"] = json!(true);
        }
        json!({ "ok": false, "error": error })
    }
}

/// Writes [`outcome_json`]'s object, byte for byte, without building it first: a batch of
/// expressions then allocates nothing per line but the evaluation's own values.
pub fn write_outcome_json(
    out: &mut (impl std::io::Write + ?Sized),
    outcome: &Result<Evaluated, Error>,
) -> std::io::Result<()> {
    match outcome {
        Ok(v) => {
            write_ok_json(out, v.type_name, &v.repr, &v.str)?;
            if let Some(value) = &v.value {
                out.write_all(b",\"value\":")?;
                serde_json::to_writer(&mut *out, value).map_err(std::io::Error::from)?;
            }
            out.write_all(b"}")
        }
        Err(e) => write_error_json(out, e),
    }
}

fn write_string_json(out: &mut (impl std::io::Write + ?Sized), s: &str) -> std::io::Result<()> {
    serde_json::to_writer(out, s).map_err(std::io::Error::from)
}

/// A success's object up to its value, left open.
fn write_ok_json(
    out: &mut (impl std::io::Write + ?Sized),
    type_name: &str,
    repr: &str,
    str: &str,
) -> std::io::Result<()> {
    out.write_all(b"{\"ok\":true,\"type\":")?;
    write_string_json(out, type_name)?;
    out.write_all(b",\"repr\":")?;
    write_string_json(out, repr)?;
    out.write_all(b",\"str\":")?;
    write_string_json(out, str)
}

fn write_error_json(out: &mut (impl std::io::Write + ?Sized), e: &Error) -> std::io::Result<()> {
    out.write_all(b"{\"ok\":false,\"error\":{\"type\":")?;
    write_string_json(out, e.kind.as_str())?;
    out.write_all(b",\"message\":")?;
    write_string_json(out, &e.message)?;
    if e.limit {
        out.write_all(b",\"limit\":true")?;
    }
    out.write_all(b"}}")
}

/// The JSON object for either outcome.
pub fn outcome_json(outcome: &Result<Evaluated, Error>) -> serde_json::Value {
    match outcome {
        Ok(v) => v.to_json(),
        Err(e) => e.to_json(),
    }
}
