//! The JSON form of a value the machine proved safe. Dicts keep their order; keys and set
//! items that Python deems equal (1, 1.0, True) are one, as when CPython loads them.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use base64::Engine as _;
use num_bigint::BigInt;
use num_traits::{FromPrimitive, ToPrimitive};
use serde_json::{json, Value as Json};

use crate::vm::Value;
use crate::DecodeError;

/// What one conversion may still do.
struct Cx {
    /// Containers being converted, by address: a pickle can describe a list that contains
    /// itself, which JSON cannot hold.
    path: Vec<usize>,
    /// Bytes the output may still have: shared parts print once per reference, so a small
    /// pickle could otherwise describe an exponentially large value.
    left: u64,
}

pub(crate) fn to_json(v: &Value, max_depth: usize, budget: u64) -> Result<Json, DecodeError> {
    let mut cx = Cx {
        path: Vec::new(),
        left: budget,
    };
    convert(v, max_depth, &mut cx)
}

fn too_deep() -> DecodeError {
    DecodeError::Unrepresentable("nested too deeply".into())
}

fn charge(cx: &mut Cx, cost: u64) -> Result<(), DecodeError> {
    if cx.left < cost {
        return Err(DecodeError::Unrepresentable(
            "the value repeats shared parts more often than its size allows".into(),
        ));
    }
    cx.left -= cost;
    Ok(())
}

fn enter(cx: &mut Cx, addr: usize) -> Result<(), DecodeError> {
    if cx.path.contains(&addr) {
        return Err(DecodeError::Unrepresentable(
            "a container contains itself".into(),
        ));
    }
    cx.path.push(addr);
    Ok(())
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The key of airlock's forms for values JSON has no type for, shared with execution results
/// (README "What comes back"); the decoder's own `$` tags are for what results never carry.
const MARK: &str = "$airlock";
/// Digits of the largest int written in decimal: CPython's default limit on converting an int
/// to text (`sys.int_info.default_max_str_digits`), past which conversion is quadratic.
const INT_DIGITS: usize = 4300;
/// The repr of an int past [`INT_DIGITS`] is cut to this many characters, as a result's is.
const REPR_CAP: usize = 4096;

fn float_json(f: f64) -> Json {
    if f.is_finite() {
        json!(f)
    } else {
        let value = if f.is_nan() {
            "nan"
        } else if f > 0.0 {
            "inf"
        } else {
            "-inf"
        };
        json!({MARK: "float", "value": value})
    }
}

/// An int within 64 bits as a JSON number; else `{"$airlock": "int", "value": digits}` up to
/// [`INT_DIGITS`] digits, and past that the marked repr of its hexadecimal digits, cut.
fn int_json(n: &BigInt) -> Json {
    if let Some(i) = n.to_i64() {
        return json!(i);
    }
    if let Some(u) = n.to_u64() {
        return json!(u);
    }
    // log10(2) < 0.30103: more bits than this can hold no fewer digits than the limit allows.
    let bits = n.bits();
    if bits <= (INT_DIGITS as u64) * 10 / 3 && n.magnitude() < &ten_to_digits() {
        return json!({MARK: "int", "value": n.to_string()});
    }
    let sign = if n.sign() == num_bigint::Sign::Minus {
        "-"
    } else {
        ""
    };
    let hex = format!("{sign}0x{:x}", n.magnitude());
    json!({
        MARK: "repr",
        "type": "int",
        "repr": &hex[..hex.len().min(REPR_CAP)],
        "truncated": hex.len() > REPR_CAP,
        "why": format!("an integer of more than {INT_DIGITS} digits"),
    })
}

fn ten_to_digits() -> num_bigint::BigUint {
    num_bigint::BigUint::from(10u32).pow(INT_DIGITS as u32)
}

/// What printing (or hashing) a value costs, in bytes: each item its size, shared ones once
/// per reference.
fn cost(v: &Value) -> u64 {
    16 + match v {
        Value::Str(s) => s.len() as u64,
        Value::Wide(w) => w.len() as u64 * 8,
        Value::Bytes(b) => b.len() as u64 * 4 / 3,
        Value::ByteArray(b) => b.borrow().len() as u64 * 4 / 3,
        Value::Int(n) => n.bits() / 3,
        _ => 0,
    }
}

/// Recursion is bounded by `max_depth`; the stack grows as needed, whatever the thread's size
/// and however large the frames of an unoptimized build.
fn convert(v: &Value, depth: usize, cx: &mut Cx) -> Result<Json, DecodeError> {
    stacker::maybe_grow(64 << 10, 1 << 20, || convert_here(v, depth, cx))
}

fn convert_here(v: &Value, depth: usize, cx: &mut Cx) -> Result<Json, DecodeError> {
    if depth == 0 {
        return Err(too_deep());
    }
    charge(cx, cost(v))?;
    let many = |items: &[Value], cx: &mut Cx| -> Result<Vec<Json>, DecodeError> {
        items.iter().map(|x| convert(x, depth - 1, cx)).collect()
    };
    Ok(match v {
        Value::None => Json::Null,
        Value::Bool(b) => json!(b),
        Value::Int(n) => int_json(n),
        Value::Float(f) => float_json(*f),
        Value::Complex(re, im) => json!({"$complex": [float_json(*re), float_json(*im)]}),
        Value::Str(s) => json!(&**s),
        Value::Wide(w) => json!({"$str": &**w}),
        Value::Bytes(b) => json!({"$bytes": b64(b)}),
        Value::ByteArray(b) => json!({"$bytearray": b64(&b.borrow())}),
        Value::List(l) => {
            enter(cx, Rc::as_ptr(l) as usize)?;
            let out = many(&l.borrow(), cx)?;
            cx.path.pop();
            Json::Array(out)
        }
        Value::Tuple(t) => json!({"$tuple": many(t, cx)?}),
        Value::Set(s) => {
            enter(cx, Rc::as_ptr(s) as usize)?;
            let out = distinct(&s.borrow(), depth, cx)?;
            cx.path.pop();
            json!({"$set": out})
        }
        Value::FrozenSet(s) => json!({"$frozenset": distinct(s, depth, cx)?}),
        Value::Dict(d) => {
            enter(cx, Rc::as_ptr(d) as usize)?;
            let out = dict(&d.borrow(), depth, cx)?;
            cx.path.pop();
            out
        }
        Value::Call(name, args) => json!({"$call": &**name, "args": many(args, cx)?}),
        Value::Global(name, _) => json!({"$global": &**name}),
        Value::Opaque => return Err(DecodeError::Unsafe(vec!["an unsafe value".into()])),
    })
}

/// A set's items, each once, first come first kept (as `set.add` keeps them).
fn distinct(items: &[Value], depth: usize, cx: &mut Cx) -> Result<Vec<Json>, DecodeError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for x in items {
        if seen.insert(key(x, depth - 1, cx)?) {
            out.push(convert(x, depth - 1, cx)?);
        }
    }
    Ok(out)
}

/// A dict in its order: a key seen again keeps its first place and takes the last value. With
/// only string keys it is a JSON object; otherwise `{"$dict": [[key, value], ...]}`.
fn dict(pairs: &[(Value, Value)], depth: usize, cx: &mut Cx) -> Result<Json, DecodeError> {
    let plain = pairs
        .iter()
        .all(|(k, _)| matches!(k, Value::Str(s) if !s.starts_with('$')));
    if plain {
        let mut map = serde_json::Map::new();
        for (k, val) in pairs {
            // Hashing the key reads all of it.
            charge(cx, cost(k))?;
            if let Value::Str(k) = k {
                // Insertion order is kept (serde_json's preserve_order), and inserting a
                // key again replaces its value in place.
                map.insert(k.to_string(), convert(val, depth - 1, cx)?);
            }
        }
        return Ok(Json::Object(map));
    }
    let mut at: HashMap<Key, usize> = HashMap::new();
    let mut out: Vec<Json> = Vec::new();
    for (k, val) in pairs {
        let value = convert(val, depth - 1, cx)?;
        match at.entry(key(k, depth - 1, cx)?) {
            Entry::Occupied(e) => out[*e.get()][1] = value,
            Entry::Vacant(e) => {
                e.insert(out.len());
                out.push(json!([convert(k, depth - 1, cx)?, value]));
            }
        }
    }
    Ok(json!({"$dict": out}))
}

/// A dict key or set item under Python's equality: numbers that are equal are one key
/// whatever their type, a frozenset equals any other with the same items, and a NaN or a
/// call's result equals only itself (the same object, reused through the memo).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    None,
    Int(BigInt),
    /// A float that is not an integer, by its bits.
    Float(u64),
    Complex(u64, u64),
    Str(Rc<str>),
    Wide(Rc<[u32]>),
    Bytes(Rc<[u8]>),
    Tuple(Vec<Key>),
    /// Sorted, without repeats.
    FrozenSet(Vec<Key>),
    Global(std::sync::Arc<str>),
    /// An object whose equality is its identity: here, its allocation.
    Object(usize),
}

fn key(v: &Value, depth: usize, cx: &mut Cx) -> Result<Key, DecodeError> {
    stacker::maybe_grow(64 << 10, 1 << 20, || key_here(v, depth, cx))
}

fn key_here(v: &Value, depth: usize, cx: &mut Cx) -> Result<Key, DecodeError> {
    if depth == 0 {
        return Err(too_deep());
    }
    // Hashing and comparing a key reads all of it.
    charge(cx, cost(v))?;
    Ok(match v {
        Value::None => Key::None,
        Value::Bool(b) => Key::Int((*b as u8).into()),
        Value::Int(n) => Key::Int((**n).clone()),
        Value::Float(f) => float_key(*f),
        Value::Complex(re, im) if *im == 0.0 => float_key(*re),
        // The machine gave each NaN object its own payload: its bits are its identity.
        Value::Complex(re, im) if re.is_nan() || im.is_nan() => {
            Key::Complex(re.to_bits(), im.to_bits())
        }
        Value::Complex(re, im) => Key::Complex((re + 0.0).to_bits(), im.to_bits()),
        Value::Str(s) => Key::Str(s.clone()),
        Value::Wide(w) => Key::Wide(w.clone()),
        Value::Bytes(b) => Key::Bytes(b.clone()),
        Value::Tuple(t) => Key::Tuple(
            t.iter()
                .map(|x| key(x, depth - 1, cx))
                .collect::<Result<_, _>>()?,
        ),
        Value::FrozenSet(s) => {
            let mut items = s
                .iter()
                .map(|x| key(x, depth - 1, cx))
                .collect::<Result<Vec<_>, _>>()?;
            items.sort();
            items.dedup();
            Key::FrozenSet(items)
        }
        Value::Global(name, _) => Key::Global(name.clone()),
        // What an allowed constructor returned: its equality is its own.
        Value::Call(_, args) => Key::Object(Rc::as_ptr(args) as usize),
        // The machine refuses unhashable keys; unsafe values never reach here.
        Value::List(_) | Value::Dict(_) | Value::Set(_) | Value::ByteArray(_) | Value::Opaque => {
            return Err(DecodeError::Unrepresentable("an unhashable key".into()))
        }
    })
}

fn float_key(f: f64) -> Key {
    if f.is_nan() {
        // Its own payload, given by the machine: the same object, the same key.
        Key::Float(f.to_bits())
    } else if f.fract() == 0.0 {
        // Finite and integral: equal to the int (-0.0 is 0).
        Key::Int(BigInt::from_f64(f).unwrap_or_default())
    } else {
        Key::Float(f.to_bits())
    }
}
