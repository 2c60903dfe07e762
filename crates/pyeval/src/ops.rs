//! Python's operators on values: what `+`, `*`, `<`, `in`, `x[i]` do for
//! each pair of types, with CPython's error messages.

use std::cmp::Ordering;
use std::rc::Rc;

use num_bigint::BigInt;
use num_traits::{Signed, ToPrimitive};

use crate::budget::Budget;
use crate::error::{overflow, type_error, value_error, Error, ErrorKind, Result};
use crate::num::{arith, num_cmp, Arith, Num};
use crate::repr::repr;
use crate::value::{equal, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unary {
    Neg,
    Pos,
    Invert,
    Not,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    NotIn,
}

impl Cmp {
    fn symbol(self) -> &'static str {
        match self {
            Cmp::Eq => "==",
            Cmp::Ne => "!=",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
            Cmp::In => "in",
            Cmp::NotIn => "not in",
        }
    }

    fn holds(self, o: Ordering) -> bool {
        match self {
            Cmp::Eq => o == Ordering::Equal,
            Cmp::Ne => o != Ordering::Equal,
            Cmp::Lt => o == Ordering::Less,
            Cmp::Le => o != Ordering::Greater,
            Cmp::Gt => o == Ordering::Greater,
            Cmp::Ge => o != Ordering::Less,
            Cmp::In | Cmp::NotIn => false,
        }
    }
}

pub(crate) fn unary(op: Unary, v: &Value, budget: &mut Budget) -> Result<Value> {
    budget.tick()?;
    if op == Unary::Not {
        return Ok(Value::Bool(!v.truthy()));
    }
    let bad = || {
        let sym = match op {
            Unary::Neg => "-",
            Unary::Pos => "+",
            _ => "~",
        };
        type_error(format!(
            "bad operand type for unary {sym}: '{}'",
            v.type_name()
        ))
    };
    let Some(n) = Num::of(v) else {
        return Err(bad());
    };
    Ok(match (op, n) {
        (Unary::Neg, Num::Int(i)) => Value::int(-i),
        (Unary::Pos, Num::Int(i)) => Value::int(i),
        (Unary::Invert, Num::Int(i)) => Value::int(-(i + BigInt::from(1))),
        (Unary::Neg, Num::Float(f)) => Value::Float(-f),
        (Unary::Pos, Num::Float(f)) => Value::Float(f),
        (Unary::Neg, Num::Complex(re, im)) => Value::Complex(-re, -im),
        (Unary::Pos, Num::Complex(re, im)) => Value::Complex(re, im),
        _ => return Err(bad()),
    })
}

fn unsupported(op: Arith, a: &Value, b: &Value) -> Error {
    type_error(format!(
        "unsupported operand type(s) for {}: '{}' and '{}'",
        op.symbol(),
        a.type_name(),
        b.type_name()
    ))
}

/// A repeat count (`seq * n`): `Ok(None)` when `n` is not an integer.
fn repeat_count(n: &Value) -> Result<Option<usize>> {
    let Some(i) = n.as_index() else {
        return Ok(None);
    };
    match i.to_i64() {
        Some(k) => Ok(Some(k.max(0) as usize)),
        None => Err(overflow("cannot fit 'int' into an index-sized integer")),
    }
}

fn repeat(seq: &Value, n: &Value, budget: &mut Budget) -> Result<Value> {
    let Some(times) = repeat_count(n)? else {
        return Err(type_error(format!(
            "can't multiply sequence by non-int of type '{}'",
            n.type_name()
        )));
    };
    let unit = match seq {
        Value::Str(s) => s.len(),
        Value::Bytes(b) => b.len(),
        Value::List(v) | Value::Tuple(v) => Value::cost_of_items(v.len()),
        _ => 0,
    };
    budget.alloc(unit.saturating_mul(times))?;
    Ok(match seq {
        Value::Str(s) => Value::Str(s.repeat(times).into()),
        Value::Bytes(b) => Value::Bytes(b.repeat(times).into()),
        Value::List(v) => Value::List(repeat_items(v, times)),
        Value::Tuple(v) => Value::Tuple(repeat_items(v, times)),
        _ => return Err(type_error("not a sequence")),
    })
}

fn repeat_items(items: &[Value], times: usize) -> Rc<[Value]> {
    if items.is_empty() {
        // `[] * 2**62` is empty, at once.
        return Rc::new([]);
    }
    let mut out = Vec::with_capacity(items.len() * times);
    for _ in 0..times {
        out.extend_from_slice(items);
    }
    out.into()
}

fn concat(a: &[Value], b: &[Value], budget: &mut Budget) -> Result<Rc<[Value]>> {
    budget.alloc(Value::cost_of_items(a.len() + b.len()))?;
    let mut out = Vec::with_capacity(a.len() + b.len());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    Ok(out.into())
}

pub(crate) fn binary(op: Arith, a: &Value, b: &Value, budget: &mut Budget) -> Result<Value> {
    budget.tick()?;
    // Numbers first (nb_* slots), then the sequence and container protocols.
    if let (Some(x), Some(y)) = (Num::of(a), Num::of(b)) {
        if let (Value::Bool(p), Value::Bool(q)) = (a, b) {
            match op {
                Arith::And => return Ok(Value::Bool(p & q)),
                Arith::Or => return Ok(Value::Bool(p | q)),
                Arith::Xor => return Ok(Value::Bool(p ^ q)),
                _ => {}
            }
        }
        return arith(op, x, y, budget)?.ok_or_else(|| unsupported(op, a, b));
    }
    use Value::{Bytes, Dict, List, Set, Str, Tuple};
    match (op, a, b) {
        (Arith::Add, Str(x), Str(y)) => {
            budget.alloc(x.len() + y.len())?;
            Ok(Str(format!("{x}{y}").into()))
        }
        (Arith::Add, Str(_), _) => Err(type_error(format!(
            "can only concatenate str (not \"{}\") to str",
            b.type_name()
        ))),
        (Arith::Add, Bytes(x), Bytes(y)) => {
            budget.alloc(x.len() + y.len())?;
            Ok(Bytes([&x[..], &y[..]].concat().into()))
        }
        (Arith::Add, Bytes(_), _) => Err(type_error(format!(
            "can't concat {} to bytes",
            b.type_name()
        ))),
        (Arith::Add, List(x), List(y)) => Ok(List(concat(x, y, budget)?)),
        (Arith::Add, List(_), _) => Err(type_error(format!(
            "can only concatenate list (not \"{}\") to list",
            b.type_name()
        ))),
        (Arith::Add, Tuple(x), Tuple(y)) => Ok(Tuple(concat(x, y, budget)?)),
        (Arith::Add, Tuple(_), _) => Err(type_error(format!(
            "can only concatenate tuple (not \"{}\") to tuple",
            b.type_name()
        ))),
        (Arith::Mul, Str(_) | Bytes(_) | List(_) | Tuple(_), _) => repeat(a, b, budget),
        (Arith::Mul, _, Str(_) | Bytes(_) | List(_) | Tuple(_)) => repeat(b, a, budget),
        (Arith::Mod, Str(_) | Bytes(_), _) => Err(Error::new(
            ErrorKind::NotAllowedError,
            "printf-style formatting ('%' on str or bytes) is not supported",
        )),
        (Arith::Or, Set(x), Set(y)) => {
            let mut r = x.copy(budget)?;
            r.merge(y, budget)?;
            Ok(Set(Rc::new(r)))
        }
        (Arith::And, Set(x), Set(y)) => {
            Ok(Set(Rc::new(crate::value::Set::intersection(x, y, budget)?)))
        }
        (Arith::Sub, Set(x), Set(y)) => {
            Ok(Set(Rc::new(crate::value::Set::difference(x, y, budget)?)))
        }
        (Arith::Xor, Set(x), Set(y)) => Ok(Set(Rc::new(crate::value::Set::symmetric_difference(
            x, y, budget,
        )?))),
        (Arith::Or, Dict(x), Dict(y)) => {
            let mut d = crate::value::Dict::default();
            for (h, k, v) in x.entries().chain(y.entries()) {
                d.insert_hashed(k.clone(), *h, v.clone(), budget)?;
            }
            Ok(Dict(Rc::new(d)))
        }
        _ => Err(unsupported(op, a, b)),
    }
}

fn not_supported(op: Cmp, a: &Value, b: &Value) -> Error {
    type_error(format!(
        "'{}' not supported between instances of '{}' and '{}'",
        op.symbol(),
        a.type_name(),
        b.type_name()
    ))
}

/// `a op b` for the six rich comparisons.
pub(crate) fn compare(op: Cmp, a: &Value, b: &Value, budget: &mut Budget) -> Result<bool> {
    budget.tick()?;
    match op {
        Cmp::Eq => return equal(a, b, budget),
        Cmp::Ne => return Ok(!equal(a, b, budget)?),
        Cmp::In => return contains(b, a, budget),
        Cmp::NotIn => return Ok(!contains(b, a, budget)?),
        _ => {}
    }
    use Value::{Bytes, List, Set, Str, Tuple};
    match (a, b) {
        (Str(x), Str(y)) => {
            budget.ticks(x.len().min(y.len()) as u64 / 64)?;
            Ok(op.holds(x.cmp(y)))
        }
        (Bytes(x), Bytes(y)) => {
            budget.ticks(x.len().min(y.len()) as u64 / 64)?;
            Ok(op.holds(x.cmp(y)))
        }
        (List(x), List(y)) | (Tuple(x), Tuple(y)) => {
            for (p, q) in x.iter().zip(y.iter()) {
                if !equal(p, q, budget)? {
                    return stacker::maybe_grow(64 << 10, 1 << 20, || compare(op, p, q, budget));
                }
            }
            Ok(op.holds(x.len().cmp(&y.len())))
        }
        (Set(x), Set(y)) => match op {
            Cmp::Le => x.is_subset(y, budget),
            Cmp::Ge => y.is_subset(x, budget),
            Cmp::Lt => Ok(x.len() < y.len() && x.is_subset(y, budget)?),
            _ => Ok(x.len() > y.len() && y.is_subset(x, budget)?),
        },
        _ => match (Num::of(a), Num::of(b)) {
            (Some(p), Some(q))
                if !matches!(p, Num::Complex(..)) && !matches!(q, Num::Complex(..)) =>
            {
                Ok(num_cmp(&p, &q).is_some_and(|o| op.holds(o)))
            }
            _ => Err(not_supported(op, a, b)),
        },
    }
}

/// `item in container`.
pub(crate) fn contains(container: &Value, item: &Value, budget: &mut Budget) -> Result<bool> {
    use Value::{Bool, Bytes, Dict, Int, List, Set, Str, Tuple};
    match container {
        List(items) | Tuple(items) => {
            for x in items.iter() {
                if equal(x, item, budget)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Str(s) => match item {
            Str(sub) => {
                budget.ticks(s.len() as u64 / 16)?;
                Ok(s.contains(&**sub))
            }
            _ => Err(type_error(format!(
                "'in <string>' requires string as left operand, not {}",
                item.type_name()
            ))),
        },
        Bytes(b) => match item {
            Bytes(sub) => {
                budget.ticks(b.len() as u64 / 16)?;
                // Linear time whatever the pattern (naive search is quadratic).
                Ok(memchr::memmem::find(b, sub).is_some())
            }
            Int(_) | Bool(_) => {
                let n = item.as_index().unwrap_or_default();
                match n.to_u8() {
                    Some(byte) => Ok(b.contains(&byte)),
                    None => Err(value_error("byte must be in range(0, 256)")),
                }
            }
            _ => Err(type_error(format!(
                "a bytes-like object is required, not '{}'",
                item.type_name()
            ))),
        },
        Dict(d) => d.contains(item, budget),
        Set(s) => {
            // set_contains retries a set key as a frozenset; no frozenset can
            // be a member here, so such a key is simply absent.
            if let Set(_) = item {
                return Ok(false);
            }
            let h = item.hash(budget)?;
            s.contains_hashed(item, h, budget)
        }
        _ => Err(type_error(format!(
            "argument of type '{}' is not iterable",
            container.type_name()
        ))),
    }
}

fn index_of(len: usize, i: &BigInt, what: &str) -> Result<usize> {
    let Some(mut k) = i.to_i64() else {
        return Err(Error::new(
            ErrorKind::IndexError,
            "cannot fit 'int' into an index-sized integer",
        ));
    };
    if k < 0 {
        k += len as i64;
    }
    if k < 0 || k >= len as i64 {
        let message = if what.is_empty() {
            "index out of range".to_string()
        } else {
            format!("{what} index out of range")
        };
        return Err(Error::new(ErrorKind::IndexError, message));
    }
    Ok(k as usize)
}

/// PySlice_Unpack + PySlice_AdjustIndices: where a slice starts, its step and
/// how many items it selects (computed, never enumerated).
fn slice_indices(parts: &[Value; 3], len: usize) -> Result<(i64, i64, usize)> {
    let clamp = |v: &Value| -> Result<Option<i64>> {
        match v {
            Value::None => Ok(None),
            other => match other.as_index() {
                Some(n) => Ok(Some(n.to_i64().unwrap_or(if n.is_negative() {
                    i64::MIN
                } else {
                    i64::MAX
                }))),
                None => Err(type_error(
                    "slice indices must be integers or None or have an __index__ method",
                )),
            },
        }
    };
    let step = match clamp(&parts[2])? {
        None => 1,
        Some(0) => return Err(value_error("slice step cannot be zero")),
        Some(s) => s.max(-i64::MAX),
    };
    let mut start = clamp(&parts[0])?.unwrap_or(if step < 0 { i64::MAX } else { 0 });
    let mut stop = clamp(&parts[1])?.unwrap_or(if step < 0 { i64::MIN } else { i64::MAX });
    let len = len as i64;
    let adjust = |x: &mut i64| {
        if *x < 0 {
            *x = x.saturating_add(len);
            if *x < 0 {
                *x = if step < 0 { -1 } else { 0 };
            }
        } else if *x >= len {
            *x = if step < 0 { len - 1 } else { len };
        }
    };
    adjust(&mut start);
    adjust(&mut stop);
    let count = if step < 0 {
        if stop < start {
            (start - stop - 1) / (-step) + 1
        } else {
            0
        }
    } else if start < stop {
        (stop - start - 1) / step + 1
    } else {
        0
    };
    Ok((start, step, count as usize))
}

/// The positions a slice selects, in order.
fn positions(start: i64, step: i64, count: usize) -> impl Iterator<Item = usize> {
    (0..count as i64).map(move |k| (start + k * step) as usize)
}

/// `v[index]`.
pub(crate) fn subscript(v: &Value, index: &Value, budget: &mut Budget) -> Result<Value> {
    budget.tick()?;
    use Value::{Bytes, Dict, List, Slice, Str, Tuple};
    match v {
        List(items) | Tuple(items) => {
            let (what, list) = if let List(_) = v {
                ("list", true)
            } else {
                ("tuple", false)
            };
            match index {
                Slice(parts) => {
                    let (start, step, count) = slice_indices(parts, items.len())?;
                    budget.alloc(Value::cost_of_items(count))?;
                    let out: Rc<[Value]> = positions(start, step, count)
                        .map(|i| items[i].clone())
                        .collect();
                    Ok(if list { List(out) } else { Tuple(out) })
                }
                _ => match index.as_index() {
                    Some(i) => Ok(items[index_of(items.len(), &i, what)?].clone()),
                    None => Err(type_error(format!(
                        "{what} indices must be integers or slices, not {}",
                        index.type_name()
                    ))),
                },
            }
        }
        Str(s) => match index {
            Slice(parts) => {
                if s.is_ascii() {
                    let (start, step, count) = slice_indices(parts, s.len())?;
                    budget.alloc(count)?;
                    let b = s.as_bytes();
                    let out: String = positions(start, step, count)
                        .map(|i| b[i] as char)
                        .collect();
                    return Ok(Str(out.into()));
                }
                // Characters need indexing: the working copy counts too.
                budget.alloc(s.len() * 4)?;
                let chars: Vec<char> = s.chars().collect();
                let (start, step, count) = slice_indices(parts, chars.len())?;
                budget.alloc(count * 4)?;
                let out: String = positions(start, step, count).map(|i| chars[i]).collect();
                Ok(Str(out.into()))
            }
            _ => match index.as_index() {
                Some(i) => {
                    budget.ticks(s.len() as u64 / 64)?;
                    let len = if s.is_ascii() {
                        s.len()
                    } else {
                        s.chars().count()
                    };
                    let k = index_of(len, &i, "string")?;
                    let c = if s.is_ascii() {
                        s.as_bytes()[k] as char
                    } else {
                        s.chars().nth(k).unwrap_or('\0')
                    };
                    Ok(Str(c.to_string().into()))
                }
                None => Err(type_error(format!(
                    "string indices must be integers, not '{}'",
                    index.type_name()
                ))),
            },
        },
        Bytes(b) => match index {
            Slice(parts) => {
                let (start, step, count) = slice_indices(parts, b.len())?;
                budget.alloc(count)?;
                let out: Vec<u8> = positions(start, step, count).map(|i| b[i]).collect();
                Ok(Bytes(out.into()))
            }
            _ => match index.as_index() {
                Some(i) => Ok(Value::int(BigInt::from(b[index_of(b.len(), &i, "")?]))),
                None => Err(type_error(format!(
                    "byte indices must be integers or slices, not {}",
                    index.type_name()
                ))),
            },
        },
        Dict(d) => match d.get(index, budget)? {
            Some(v) => Ok(v.clone()),
            None => Err(Error::new(ErrorKind::KeyError, repr(index, budget)?)),
        },
        _ => Err(type_error(format!(
            "'{}' object is not subscriptable",
            v.type_name()
        ))),
    }
}
