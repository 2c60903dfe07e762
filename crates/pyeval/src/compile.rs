//! From ruff's syntax tree to our own: refuses everything that is not a
//! literal expression, and folds constants the way CPython 3.11's AST
//! optimizer does (that decides how a set display is built, and so the
//! order the set prints in).

use num_bigint::BigInt;
use num_traits::{Num as _, Signed, ToPrimitive, Zero};
use ruff_python_ast::{self as ast, Expr, Number};
use ruff_text_size::Ranged;

use crate::budget::Budget;
use crate::error::{Error, ErrorKind, Result};
use crate::num::Arith;
use crate::ops::{binary, subscript, unary, Cmp, Unary};
use crate::value::Value;

#[derive(Debug)]
pub(crate) enum Node {
    Const(Value),
    List(Vec<Node>),
    Tuple(Vec<Node>),
    Set(Vec<Node>),
    Dict(Vec<(Node, Node)>),
    Unary(Unary, Box<Node>),
    Binary(Arith, Box<Node>, Box<Node>),
    And(Vec<Node>),
    Or(Vec<Node>),
    Compare(Box<Node>, Vec<(Cmp, Node)>),
    If(Box<Node>, Box<Node>, Box<Node>),
    Subscript(Box<Node>, Box<Node>),
    Slice(Option<Box<Node>>, Option<Box<Node>>, Option<Box<Node>>),
}

impl Node {
    fn constant(&self) -> Option<&Value> {
        match self {
            Node::Const(v) => Some(v),
            _ => None,
        }
    }
}

pub(crate) struct Compiler<'a> {
    pub(crate) source: &'a str,
    pub(crate) budget: &'a mut Budget,
}

fn refuse(what: &str, source: &str, node: &Expr) -> Error {
    let range = node.range();
    let text = &source[range.start().to_usize()..range.end().to_usize()];
    let snippet: String = text.chars().take(40).collect();
    let more = if snippet.len() < text.len() {
        "..."
    } else {
        ""
    };
    Error::new(
        ErrorKind::NotAllowedError,
        format!(
            "{what} not allowed: `{snippet}{more}` at offset {}; only literals and operators are evaluated",
            range.start().to_usize()
        ),
    )
}

impl Compiler<'_> {
    pub(crate) fn expr(&mut self, e: &Expr) -> Result<Node> {
        stacker::maybe_grow(64 << 10, 1 << 20, || self.expr_inner(e))
    }

    fn exprs(&mut self, items: &[Expr]) -> Result<Vec<Node>> {
        items.iter().map(|e| self.expr(e)).collect()
    }

    fn expr_inner(&mut self, e: &Expr) -> Result<Node> {
        self.budget.tick()?;
        let src = self.source;
        Ok(match e {
            Expr::NumberLiteral(n) => Node::Const(self.number(n)?),
            Expr::StringLiteral(s) => {
                for part in s.value.iter() {
                    let raw = ast::StringFlags::prefix(part.flags).is_raw();
                    let range = part.range();
                    let code = &src[range.start().to_usize()..range.end().to_usize()];
                    if !raw && escapes_a_surrogate(code) {
                        return Err(refuse("lone surrogates (\\ud800-\\udfff) are", src, e));
                    }
                    if !raw && names_an_unknown_character(code) {
                        return Err(Error::new(
                            ErrorKind::SyntaxError,
                            "(unicode error) 'unicodeescape' codec can't decode bytes: \
                             unknown Unicode character name",
                        ));
                    }
                }
                let text = s.value.to_str();
                self.budget.alloc(text.len())?;
                Node::Const(Value::Str(text.into()))
            }
            Expr::BytesLiteral(b) => {
                let bytes: Vec<u8> = b.value.bytes().collect();
                self.budget.alloc(bytes.len())?;
                Node::Const(Value::Bytes(bytes.into()))
            }
            Expr::BooleanLiteral(b) => Node::Const(Value::Bool(b.value)),
            Expr::NoneLiteral(_) => Node::Const(Value::None),
            Expr::EllipsisLiteral(_) => Node::Const(Value::Ellipsis),
            Expr::List(l) => Node::List(self.starless(&l.elts)?),
            Expr::Set(s) => Node::Set(self.starless(&s.elts)?),
            Expr::Tuple(t) => {
                let items = self.starless(&t.elts)?;
                // fold_tuple: a tuple of constants is a constant.
                if items.iter().all(|n| n.constant().is_some()) {
                    let values: Vec<Value> = items
                        .into_iter()
                        .filter_map(|n| match n {
                            Node::Const(v) => Some(v),
                            _ => None,
                        })
                        .collect();
                    self.budget.alloc(Value::cost_of_items(values.len()))?;
                    Node::Const(Value::Tuple(values.into()))
                } else {
                    Node::Tuple(items)
                }
            }
            Expr::Dict(d) => {
                let mut items = Vec::with_capacity(d.items.len());
                for item in &d.items {
                    let Some(key) = &item.key else {
                        return Err(refuse("dict unpacking (**) is", src, &item.value));
                    };
                    items.push((self.expr(key)?, self.expr(&item.value)?));
                }
                Node::Dict(items)
            }
            Expr::UnaryOp(u) => {
                let op = match u.op {
                    ast::UnaryOp::USub => Unary::Neg,
                    ast::UnaryOp::UAdd => Unary::Pos,
                    ast::UnaryOp::Invert => Unary::Invert,
                    ast::UnaryOp::Not => Unary::Not,
                };
                let operand = self.expr(&u.operand)?;
                if let Some(v) = operand.constant() {
                    if let Some(folded) = fold(unary(op, v, self.budget))? {
                        return Ok(Node::Const(folded));
                    }
                }
                Node::Unary(op, Box::new(operand))
            }
            Expr::BinOp(b) => {
                let op = match b.op {
                    ast::Operator::Add => Arith::Add,
                    ast::Operator::Sub => Arith::Sub,
                    ast::Operator::Mult => Arith::Mul,
                    ast::Operator::MatMult => Arith::MatMul,
                    ast::Operator::Div => Arith::Div,
                    ast::Operator::Mod => Arith::Mod,
                    ast::Operator::Pow => Arith::Pow,
                    ast::Operator::LShift => Arith::LShift,
                    ast::Operator::RShift => Arith::RShift,
                    ast::Operator::BitOr => Arith::Or,
                    ast::Operator::BitXor => Arith::Xor,
                    ast::Operator::BitAnd => Arith::And,
                    ast::Operator::FloorDiv => Arith::FloorDiv,
                };
                let left = self.expr(&b.left)?;
                let right = self.expr(&b.right)?;
                if let (Some(l), Some(r)) = (left.constant(), right.constant()) {
                    if safe_to_fold(op, l, r) {
                        if let Some(folded) = fold(binary(op, l, r, self.budget))? {
                            return Ok(Node::Const(folded));
                        }
                    }
                }
                Node::Binary(op, Box::new(left), Box::new(right))
            }
            Expr::BoolOp(b) => {
                let values = self.exprs(&b.values)?;
                match b.op {
                    ast::BoolOp::And => Node::And(values),
                    ast::BoolOp::Or => Node::Or(values),
                }
            }
            Expr::Compare(c) => {
                let left = self.expr(&c.left)?;
                let mut rest = Vec::with_capacity(c.ops.len());
                for (op, right) in c.ops.iter().zip(c.comparators.iter()) {
                    let op = match op {
                        ast::CmpOp::Eq => Cmp::Eq,
                        ast::CmpOp::NotEq => Cmp::Ne,
                        ast::CmpOp::Lt => Cmp::Lt,
                        ast::CmpOp::LtE => Cmp::Le,
                        ast::CmpOp::Gt => Cmp::Gt,
                        ast::CmpOp::GtE => Cmp::Ge,
                        ast::CmpOp::In => Cmp::In,
                        ast::CmpOp::NotIn => Cmp::NotIn,
                        ast::CmpOp::Is | ast::CmpOp::IsNot => {
                            return Err(refuse("identity comparison (`is`) is", src, e))
                        }
                    };
                    rest.push((op, self.expr(right)?));
                }
                Node::Compare(Box::new(left), rest)
            }
            Expr::If(i) => Node::If(
                Box::new(self.expr(&i.test)?),
                Box::new(self.expr(&i.body)?),
                Box::new(self.expr(&i.orelse)?),
            ),
            Expr::Subscript(s) => {
                let value = self.expr(&s.value)?;
                let index = self.expr(&s.slice)?;
                if let (Some(v), Some(i)) = (value.constant(), index.constant()) {
                    if let Some(folded) = fold(subscript(v, i, self.budget))? {
                        return Ok(Node::Const(folded));
                    }
                }
                Node::Subscript(Box::new(value), Box::new(index))
            }
            Expr::Slice(s) => {
                let part = |c: &mut Self, p: &Option<Box<Expr>>| -> Result<Option<Box<Node>>> {
                    p.as_ref().map(|e| c.expr(e).map(Box::new)).transpose()
                };
                Node::Slice(
                    part(self, &s.lower)?,
                    part(self, &s.upper)?,
                    part(self, &s.step)?,
                )
            }
            Expr::Name(_) => return Err(refuse("names are", src, e)),
            Expr::Call(_) => return Err(refuse("calls are", src, e)),
            Expr::Attribute(_) => return Err(refuse("attribute access is", src, e)),
            Expr::Lambda(_) => return Err(refuse("lambda is", src, e)),
            Expr::ListComp(_) | Expr::SetComp(_) | Expr::DictComp(_) | Expr::Generator(_) => {
                return Err(refuse("comprehensions are", src, e))
            }
            Expr::FString(_) | Expr::TString(_) => return Err(refuse("f-strings are", src, e)),
            Expr::Named(_) => return Err(refuse("assignment expressions (:=) are", src, e)),
            Expr::Starred(_) => return Err(refuse("starred expressions are", src, e)),
            Expr::Await(_) | Expr::Yield(_) | Expr::YieldFrom(_) => {
                return Err(refuse("await and yield are", src, e))
            }
            Expr::IpyEscapeCommand(_) => return Err(refuse("IPython escapes are", src, e)),
        })
    }

    fn starless(&mut self, items: &[Expr]) -> Result<Vec<Node>> {
        if let Some(star) = items.iter().find(|e| e.is_starred_expr()) {
            return Err(refuse("starred expressions are", self.source, star));
        }
        self.exprs(items)
    }

    fn number(&mut self, n: &ast::ExprNumberLiteral) -> Result<Value> {
        Ok(match &n.value {
            Number::Float(f) => Value::Float(*f),
            Number::Complex { real, imag } => Value::Complex(*real, *imag),
            Number::Int(i) => match i.as_u64() {
                Some(small) => Value::int(BigInt::from(small)),
                None => {
                    let text =
                        &self.source[n.range().start().to_usize()..n.range().end().to_usize()];
                    Value::int(self.big_literal(text)?)
                }
            },
        })
    }

    fn big_literal(&mut self, text: &str) -> Result<BigInt> {
        let clean: String = text.chars().filter(|c| *c != '_').collect();
        let lower = clean.to_ascii_lowercase();
        let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
            (16, d)
        } else if let Some(d) = lower.strip_prefix("0o") {
            (8, d)
        } else if let Some(d) = lower.strip_prefix("0b") {
            (2, d)
        } else {
            (10, lower.as_str())
        };
        if radix == 10 && digits.len() > crate::repr::INT_MAX_STR_DIGITS {
            return Err(Error::new(
                ErrorKind::SyntaxError,
                format!(
                    "Exceeds the limit (4300 digits) for integer string conversion: value has {} digits; \
                     a decimal literal has at most 4300 digits here (CPython's default, which an \
                     expression cannot change); a hexadecimal literal has no such limit",
                    digits.len()
                ),
            ));
        }
        let bits = (digits.len() as u64).saturating_mul(match radix {
            16 => 4,
            8 => 3,
            2 => 1,
            _ => 4,
        });
        self.budget.int_bits(bits)?;
        BigInt::from_str_radix(digits, radix).map_err(|_| {
            Error::new(
                ErrorKind::SyntaxError,
                format!("invalid integer literal: {text}"),
            )
        })
    }
}

const MAX_INT_SIZE: u64 = 128;
const MAX_COLLECTION_SIZE: i64 = 256;
const MAX_STR_SIZE: i64 = 4096;
const MAX_TOTAL_ITEMS: i64 = 1024;

fn int_of(v: &Value) -> Option<BigInt> {
    v.as_index()
}

fn check_complexity(v: &Value, mut limit: i64) -> i64 {
    if let Value::Tuple(items) = v {
        limit -= items.len() as i64;
        for item in items.iter() {
            if limit < 0 {
                break;
            }
            limit = check_complexity(item, limit);
        }
    }
    limit
}

/// The size guards of CPython's fold_binop (safe_multiply, safe_power,
/// safe_lshift, safe_mod): when they say no, the expression is left to run
/// time. Only the decision matters here; the value is the same either way.
fn safe_to_fold(op: Arith, l: &Value, r: &Value) -> bool {
    match op {
        Arith::MatMul => false,
        Arith::Mul => safe_multiply(l, r),
        Arith::Pow => match (int_of(l), int_of(r)) {
            (Some(v), Some(w)) if !v.is_zero() && w.is_positive() => match w.to_u64() {
                Some(wbits) => v.bits() <= MAX_INT_SIZE / wbits,
                None => false,
            },
            _ => true,
        },
        Arith::LShift => match (int_of(l), int_of(r)) {
            (Some(v), Some(w)) if !v.is_zero() && !w.is_zero() => match w.to_u64() {
                Some(wbits) if !w.is_negative() => {
                    !(wbits > MAX_INT_SIZE || v.bits() > MAX_INT_SIZE - wbits)
                }
                _ => false,
            },
            _ => true,
        },
        Arith::Mod => !matches!(l, Value::Str(_) | Value::Bytes(_)),
        _ => true,
    }
}

fn safe_multiply(v: &Value, w: &Value) -> bool {
    match (int_of(v), w) {
        (Some(a), _) if int_of(w).is_some() => {
            let b = int_of(w).unwrap_or_default();
            if a.is_zero() || b.is_zero() {
                return true;
            }
            a.bits() + b.bits() <= MAX_INT_SIZE
        }
        (Some(a), Value::Tuple(items)) => {
            let size = items.len() as i64;
            if size == 0 {
                return true;
            }
            let Some(n) = a.to_i64() else {
                return false;
            };
            if n < 0 || n > MAX_COLLECTION_SIZE / size {
                return false;
            }
            n == 0 || check_complexity(w, MAX_TOTAL_ITEMS / n) >= 0
        }
        (Some(a), Value::Str(_) | Value::Bytes(_)) => {
            let size = match w {
                Value::Str(s) => s.chars().count(),
                Value::Bytes(b) => b.len(),
                _ => 0,
            } as i64;
            if size == 0 {
                return true;
            }
            let Some(n) = a.to_i64() else {
                return false;
            };
            !(n < 0 || n > MAX_STR_SIZE / size)
        }
        (None, _)
            if int_of(w).is_some()
                && matches!(v, Value::Tuple(_) | Value::Str(_) | Value::Bytes(_)) =>
        {
            safe_multiply(w, v)
        }
        _ => true,
    }
}

/// make_const: a fold that raised is simply not folded (the error comes back
/// at run time, in order), but our own limits stop at once.
fn fold(r: Result<Value>) -> Result<Option<Value>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.limit => Err(e),
        Err(_) => Ok(None),
    }
}

/// Whether a (non-raw) string literal's source has a `\uXXXX` or `\UXXXXXXXX`
/// escape for a surrogate, which Python keeps as a lone code point and the
/// parser would replace with U+FFFD.
fn escapes_a_surrogate(code: &str) -> bool {
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        let width = match b.get(i + 1) {
            Some(b'u') => 4,
            Some(b'U') => 8,
            _ => {
                i += 2; // any other escape, `\\` included
                continue;
            }
        };
        let hex = code.get(i + 2..i + 2 + width).unwrap_or("");
        if let Ok(v) = u32::from_str_radix(hex, 16) {
            if (0xD800..=0xDFFF).contains(&v) {
                return true;
            }
        }
        i += 2;
    }
    false
}

/// Whether a (non-raw) string literal's source has a `\N{...}` escape that
/// CPython 3.11 cannot resolve although the parser did: a character assigned
/// after Unicode 14.0, or an algorithmic name (Hangul syllables, CJK
/// ideographs) not spelled all in capitals, which CPython's lookup refuses.
fn names_an_unknown_character(code: &str) -> bool {
    let mut rest = code;
    while let Some(at) = rest.find('\\') {
        let after = &rest[at + 1..];
        let Some(next) = after.chars().next() else {
            return false;
        };
        if next != 'N' {
            rest = &after[next.len_utf8()..];
            continue;
        }
        let Some(body) = after.strip_prefix("N{") else {
            rest = &after[1..];
            continue;
        };
        let Some(end) = body.find('}') else {
            return false;
        };
        let name = &body[..end];
        rest = &body[end..];
        let upper = name.to_ascii_uppercase();
        let algorithmic = ["HANGUL SYLLABLE ", "CJK UNIFIED IDEOGRAPH-"]
            .iter()
            .any(|p| upper.starts_with(p));
        if algorithmic && upper != name {
            return true;
        }
        match unicode_names2::character(name) {
            Some(c) if !crate::repr::is_assigned(c) => return true,
            _ => {}
        }
    }
    false
}
