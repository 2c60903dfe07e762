//! Evaluates the tree in CPython's order: left to right, short-circuiting
//! `and`/`or`/`if`/chained comparisons, and building displays the way the
//! 3.11 compiler's bytecode builds them.

use std::rc::Rc;

use crate::budget::Budget;
use crate::compile::Node;
use crate::error::Result;
use crate::ops::{binary, compare, subscript, unary};
use crate::value::{Dict, Set, Value};

/// Above this many elements the compiler adds each set element as it is
/// evaluated, instead of evaluating them all first (STACK_USE_GUIDELINE).
const STACK_USE_GUIDELINE: usize = 30;
/// Dict displays are built in chunks of this many pairs.
const DICT_CHUNK: usize = STACK_USE_GUIDELINE / 2 + 2;

#[derive(Default)]
pub(crate) struct Evaluator {
    /// Constant frozensets already made, as the compiler's constant cache
    /// keeps them: an equal display later reuses the first one's layout.
    frozensets: Vec<(Vec<Value>, Rc<Set>)>,
}

impl Evaluator {
    pub(crate) fn eval(&mut self, node: &Node, budget: &mut Budget) -> Result<Value> {
        stacker::maybe_grow(64 << 10, 1 << 20, || self.eval_inner(node, budget))
    }

    fn eval_inner(&mut self, node: &Node, budget: &mut Budget) -> Result<Value> {
        budget.tick()?;
        Ok(match node {
            Node::Const(v) => v.clone(),
            Node::List(items) | Node::Tuple(items) => {
                budget.alloc(Value::cost_of_items(items.len()))?;
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    out.push(self.eval(item, budget)?);
                }
                if let Node::List(_) = node {
                    Value::List(out.into())
                } else {
                    Value::Tuple(out.into())
                }
            }
            Node::Set(items) => Value::Set(Rc::new(self.set_display(items, budget)?)),
            Node::Dict(pairs) => {
                let mut dict = Dict::default();
                for chunk in pairs.chunks(DICT_CHUNK) {
                    // compiler_subdict: a chunk of 16 or more pairs adds each pair as it
                    // is evaluated (MAP_ADD); a smaller one evaluates all, then builds.
                    if chunk.len() * 2 > STACK_USE_GUIDELINE {
                        for (k, v) in chunk {
                            let k = self.eval(k, budget)?;
                            let v = self.eval(v, budget)?;
                            dict.insert(k, v, budget)?;
                        }
                        continue;
                    }
                    let mut evaluated = Vec::with_capacity(chunk.len());
                    for (k, v) in chunk {
                        let k = self.eval(k, budget)?;
                        let v = self.eval(v, budget)?;
                        evaluated.push((k, v));
                    }
                    for (k, v) in evaluated {
                        dict.insert(k, v, budget)?;
                    }
                }
                Value::Dict(Rc::new(dict))
            }
            Node::Unary(op, operand) => {
                let v = self.eval(operand, budget)?;
                unary(*op, &v, budget)?
            }
            Node::Binary(op, l, r) => {
                let a = self.eval(l, budget)?;
                let b = self.eval(r, budget)?;
                binary(*op, &a, &b, budget)?
            }
            Node::And(values) | Node::Or(values) => {
                let want = matches!(node, Node::Or(_));
                let mut last = Value::None;
                for (i, v) in values.iter().enumerate() {
                    last = self.eval(v, budget)?;
                    if i + 1 < values.len() && last.truthy() == want {
                        break;
                    }
                }
                last
            }
            Node::Compare(first, rest) => {
                let mut left = self.eval(first, budget)?;
                let mut result = true;
                for (op, right) in rest {
                    let right = self.eval(right, budget)?;
                    result = compare(*op, &left, &right, budget)?;
                    if !result {
                        break;
                    }
                    left = right;
                }
                Value::Bool(result)
            }
            Node::If(test, body, orelse) => {
                if self.eval(test, budget)?.truthy() {
                    self.eval(body, budget)?
                } else {
                    self.eval(orelse, budget)?
                }
            }
            Node::Subscript(value, index) => {
                let v = self.eval(value, budget)?;
                let i = self.eval(index, budget)?;
                subscript(&v, &i, budget)?
            }
            Node::Slice(lower, upper, step) => {
                let mut part = |p: &Option<Box<Node>>| -> Result<Value> {
                    match p {
                        Some(n) => self.eval(n, budget),
                        None => Ok(Value::None),
                    }
                };
                let parts = [part(lower)?, part(upper)?, part(step)?];
                Value::Slice(Rc::new(parts))
            }
        })
    }

    fn set_display(&mut self, items: &[Node], budget: &mut Budget) -> Result<Set> {
        let consts: Option<Vec<&Value>> = items
            .iter()
            .map(|n| match n {
                Node::Const(v) => Some(v),
                _ => None,
            })
            .collect();
        match consts {
            // More than two constants: the compiler makes a frozenset
            // constant and the set is an empty set updated from it.
            Some(values) if values.len() > 2 => {
                let frozen = self.frozenset(values, budget)?;
                let mut set = Set::default();
                set.merge(&frozen, budget)?;
                Ok(set)
            }
            _ if items.len() > STACK_USE_GUIDELINE => {
                let mut set = Set::default();
                for item in items {
                    let v = self.eval(item, budget)?;
                    set.add(v, budget)?;
                }
                Ok(set)
            }
            _ => {
                let mut values = Vec::with_capacity(items.len());
                for item in items {
                    values.push(self.eval(item, budget)?);
                }
                let mut set = Set::default();
                for v in values {
                    set.add(v, budget)?;
                }
                Ok(set)
            }
        }
    }

    fn frozenset(&mut self, values: Vec<&Value>, budget: &mut Budget) -> Result<Rc<Set>> {
        let mut first = Set::default();
        for v in values {
            first.add(v.clone(), budget)?;
        }
        let members: Vec<Value> = first.iter().map(|(_, v)| v.clone()).collect();
        for (seen, set) in &self.frozensets {
            if same_constant_members(seen, &members, budget)? {
                return Ok(set.clone());
            }
        }
        // The constant cache rebuilds a new frozenset from the first one's
        // order; interning its strings rebuilds it once more when interning
        // replaced one (an identifier-like string of two or more characters
        // that the process had interned before: we assume it had).
        let mut frozen = rebuild(&members, budget)?;
        if frozen.iter().any(|(_, v)| replaced_by_interning(v)) {
            let order: Vec<Value> = frozen.iter().map(|(_, v)| v.clone()).collect();
            frozen = rebuild(&order, budget)?;
        }
        let frozen = Rc::new(frozen);
        self.frozensets.push((members, frozen.clone()));
        Ok(frozen)
    }
}

fn rebuild(order: &[Value], budget: &mut Budget) -> Result<Set> {
    let mut set = Set::default();
    for v in order {
        set.add(v.clone(), budget)?;
    }
    Ok(set)
}

/// One-character identifiers that Debian's CPython 3.11 has interned at
/// start-up as objects other than its cached one-character strings (names
/// in its frozen modules): interning replaces exactly these. The test
/// `single_characters_interned_at_startup_are_cpythons` checks the list.
pub const INTERNED_AT_STARTUP: &str = "abcdefhijklmnopqrstvwxyBCLST_";

/// Whether intern_string_constants replaces this member: identifier-like
/// strings (ASCII letters, digits, `_`) of two or more characters, taken
/// to have been interned before, and the one-character ones above.
fn replaced_by_interning(v: &Value) -> bool {
    match v {
        Value::Str(s) => {
            let ident = s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            match s.len() {
                0 => false,
                1 => INTERNED_AT_STARTUP.contains(&**s),
                _ => ident,
            }
        }
        _ => false,
    }
}

/// Whether two frozenset constants are the same constant for the compiler's
/// cache: the same members by type and value (1, 1.0 and True differ, and
/// so do 0.0 and -0.0).
fn same_constant_members(a: &[Value], b: &[Value], budget: &mut Budget) -> Result<bool> {
    if a.len() != b.len() {
        return Ok(false);
    }
    for x in a {
        budget.ticks(b.len() as u64)?;
        if !b.iter().any(|y| strictly_equal(x, y)) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn strictly_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::None, Value::None) | (Value::Ellipsis, Value::Ellipsis) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits() && !x.is_nan(),
        (Value::Complex(a1, b1), Value::Complex(a2, b2)) => {
            a1.to_bits() == a2.to_bits()
                && b1.to_bits() == b2.to_bits()
                && !a1.is_nan()
                && !b1.is_nan()
        }
        (Value::Str(x), Value::Str(y)) => x == y,
        (Value::Bytes(x), Value::Bytes(y)) => x == y,
        (Value::Tuple(x), Value::Tuple(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| strictly_equal(p, q))
        }
        _ => false,
    }
}
