//! Values, and the containers that must behave exactly like CPython's:
//! dicts keep insertion order, sets keep CPython's hash-table layout (which
//! decides the order they print in).

use std::rc::Rc;

use num_bigint::BigInt;
use num_traits::Zero;

use crate::budget::Budget;
use crate::error::{type_error, Result};
use crate::hash;

/// A Python value. Containers are shared, never mutated after they are
/// built: no expression can mutate one, so sharing is exactly CPython's
/// aliasing (`[[0]] * 3` holds one inner list three times).
#[derive(Debug, Clone)]
pub(crate) enum Value {
    None,
    Ellipsis,
    Bool(bool),
    Int(Rc<BigInt>),
    Float(f64),
    Complex(f64, f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    List(Rc<[Value]>),
    Tuple(Rc<[Value]>),
    Dict(Rc<Dict>),
    Set(Rc<Set>),
    /// Only ever an index (`x[1:2]`, `x[1:2, 3]`).
    Slice(Rc<[Value; 3]>),
}

impl Value {
    pub(crate) fn int(n: BigInt) -> Value {
        Value::Int(Rc::new(n))
    }

    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::None => "NoneType",
            Value::Ellipsis => "ellipsis",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Complex(..) => "complex",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
            Value::Slice(_) => "slice",
        }
    }

    pub(crate) fn truthy(&self) -> bool {
        match self {
            Value::None => false,
            Value::Ellipsis => true,
            Value::Bool(b) => *b,
            Value::Int(n) => !n.is_zero(),
            Value::Float(f) => *f != 0.0,
            Value::Complex(re, im) => *re != 0.0 || *im != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::Bytes(b) => !b.is_empty(),
            Value::List(v) | Value::Tuple(v) => !v.is_empty(),
            Value::Dict(d) => d.len() != 0,
            Value::Set(s) => s.len() != 0,
            Value::Slice(_) => true,
        }
    }

    /// The integer an int or bool stands for (`__index__`).
    pub(crate) fn as_index(&self) -> Option<BigInt> {
        match self {
            Value::Bool(b) => Some(BigInt::from(*b as u8)),
            Value::Int(n) => Some((**n).clone()),
            _ => None,
        }
    }

    /// Approximate size in bytes, for the memory budget.
    pub(crate) fn cost_of_items(n: usize) -> usize {
        n.saturating_mul(std::mem::size_of::<Value>())
    }

    pub(crate) fn hash(&self, budget: &mut Budget) -> Result<i64> {
        budget.tick()?;
        Ok(match self {
            Value::None | Value::Ellipsis => hash::BY_ADDRESS,
            Value::Bool(b) => *b as i64,
            Value::Int(n) => hash::int(n),
            Value::Float(f) => hash::float(*f),
            Value::Complex(re, im) => hash::complex(*re, *im),
            Value::Str(s) => {
                budget.ticks(s.len() as u64 / 64)?;
                hash::str(s)
            }
            Value::Bytes(b) => {
                budget.ticks(b.len() as u64 / 64)?;
                hash::bytes(b)
            }
            Value::Tuple(items) => {
                let mut hashes = Vec::with_capacity(items.len());
                for item in items.iter() {
                    hashes.push(stacker::maybe_grow(64 << 10, 1 << 20, || {
                        item.hash(budget)
                    })?);
                }
                hash::tuple(hashes.into_iter())
            }
            Value::List(_) | Value::Dict(_) | Value::Set(_) | Value::Slice(_) => {
                return Err(type_error(format!(
                    "unhashable type: '{}'",
                    self.type_name()
                )))
            }
        })
    }
}

/// Python `==` (never raises for these types, but costs time).
pub(crate) fn equal(a: &Value, b: &Value, budget: &mut Budget) -> Result<bool> {
    budget.tick()?;
    use Value::*;
    Ok(match (a, b) {
        (None, None) | (Ellipsis, Ellipsis) => true,
        (Str(x), Str(y)) => {
            budget.ticks(x.len().min(y.len()) as u64 / 64)?;
            x == y
        }
        (Bytes(x), Bytes(y)) => {
            budget.ticks(x.len().min(y.len()) as u64 / 64)?;
            x == y
        }
        (List(x), List(y)) | (Tuple(x), Tuple(y)) => {
            if Rc::ptr_eq(x, y) {
                return Ok(true);
            }
            if x.len() != y.len() {
                return Ok(false);
            }
            for (p, q) in x.iter().zip(y.iter()) {
                if !stacker::maybe_grow(64 << 10, 1 << 20, || equal(p, q, budget))? {
                    return Ok(false);
                }
            }
            true
        }
        (Dict(x), Dict(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (h, k, v) in x.entries() {
                match y.get_hashed(k, *h, budget)? {
                    Some(w) => {
                        if !stacker::maybe_grow(64 << 10, 1 << 20, || equal(v, w, budget))? {
                            return Ok(false);
                        }
                    }
                    Option::None => return Ok(false),
                }
            }
            true
        }
        (Set(x), Set(y)) => x.len() == y.len() && x.is_subset(y, budget)?,
        _ => match (crate::num::Num::of(a), crate::num::Num::of(b)) {
            (Some(p), Some(q)) => crate::num::num_eq(&p, &q),
            _ => false,
        },
    })
}

/// An insertion-ordered dict. Small dicts are searched linearly; the hash of
/// every key is kept so lookups compare hashes first, like CPython.
#[derive(Debug, Default)]
pub(crate) struct Dict {
    entries: Vec<(i64, Value, Value)>,
    index: std::collections::HashMap<i64, Vec<u32>>,
}

const DICT_LINEAR: usize = 8;

impl Dict {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = &(i64, Value, Value)> {
        self.entries.iter()
    }

    fn find(&self, key: &Value, hash: i64, budget: &mut Budget) -> Result<Option<usize>> {
        if self.entries.len() <= DICT_LINEAR {
            for (i, (h, k, _)) in self.entries.iter().enumerate() {
                if *h == hash && equal(k, key, budget)? {
                    return Ok(Some(i));
                }
            }
            return Ok(None);
        }
        if let Some(slots) = self.index.get(&hash) {
            for &i in slots {
                if equal(&self.entries[i as usize].1, key, budget)? {
                    return Ok(Some(i as usize));
                }
            }
        }
        Ok(None)
    }

    pub(crate) fn get_hashed(
        &self,
        key: &Value,
        hash: i64,
        budget: &mut Budget,
    ) -> Result<Option<&Value>> {
        Ok(self.find(key, hash, budget)?.map(|i| &self.entries[i].2))
    }

    pub(crate) fn get(&self, key: &Value, budget: &mut Budget) -> Result<Option<&Value>> {
        let hash = key.hash(budget)?;
        self.get_hashed(key, hash, budget)
    }

    /// `d[key] = value`: a key already present keeps its place and its
    /// original key object, and takes the new value.
    pub(crate) fn insert_hashed(
        &mut self,
        key: Value,
        hash: i64,
        value: Value,
        budget: &mut Budget,
    ) -> Result<()> {
        if let Some(i) = self.find(&key, hash, budget)? {
            self.entries[i].2 = value;
            return Ok(());
        }
        budget.alloc(Value::cost_of_items(3))?;
        let i = self.entries.len() as u32;
        self.entries.push((hash, key, value));
        if self.entries.len() > DICT_LINEAR {
            if self.index.is_empty() {
                for (j, (h, _, _)) in self.entries.iter().enumerate() {
                    self.index.entry(*h).or_default().push(j as u32);
                }
            } else {
                self.index.entry(hash).or_default().push(i);
            }
        }
        Ok(())
    }

    pub(crate) fn insert(&mut self, key: Value, value: Value, budget: &mut Budget) -> Result<()> {
        let hash = key.hash(budget)?;
        self.insert_hashed(key, hash, value, budget)
    }

    pub(crate) fn contains(&self, key: &Value, budget: &mut Budget) -> Result<bool> {
        Ok(self.get(key, budget)?.is_some())
    }
}

#[derive(Debug, Clone)]
enum Slot {
    Empty,
    Dummy,
    Full(i64, Value),
}

/// CPython 3.11's set table, step for step: linear probes of 9, perturbed
/// probing, resizing at 60% fill, dummies left by discards. Iterating the
/// table in slot order is the order CPython prints.
#[derive(Debug, Clone)]
pub(crate) struct Set {
    table: Vec<Slot>,
    fill: usize,
    used: usize,
}

const LINEAR_PROBES: usize = 9;
const PERTURB_SHIFT: u32 = 5;
const MINSIZE: usize = 8;

/// The next slot to look at once a run of linear probes is used up (the
/// perturbed recurrence of setobject.c).
fn next_probe(i: usize, perturb: &mut u64, mask: usize) -> usize {
    *perturb >>= PERTURB_SHIFT;
    (i.wrapping_mul(5)
        .wrapping_add(1)
        .wrapping_add(*perturb as usize))
        & mask
}

impl Default for Set {
    fn default() -> Set {
        Set {
            table: vec![Slot::Empty; MINSIZE],
            fill: 0,
            used: 0,
        }
    }
}

pub(crate) enum Found {
    Active(usize),
    Absent,
}

impl Set {
    pub(crate) fn len(&self) -> usize {
        self.used
    }

    fn mask(&self) -> usize {
        self.table.len() - 1
    }

    /// Members in table order, with their hashes.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (i64, &Value)> {
        self.table.iter().filter_map(|s| match s {
            Slot::Full(h, v) => Some((*h, v)),
            _ => None,
        })
    }

    fn lookup(&self, key: &Value, hash: i64, budget: &mut Budget) -> Result<Found> {
        let mask = self.mask();
        let mut perturb = hash as u64;
        let mut i = (hash as u64 as usize) & mask;
        loop {
            let probes = if i + LINEAR_PROBES <= mask {
                LINEAR_PROBES
            } else {
                0
            };
            for j in i..=i + probes {
                match &self.table[j] {
                    Slot::Empty => return Ok(Found::Absent),
                    Slot::Full(h, k) if *h == hash && equal(k, key, budget)? => {
                        return Ok(Found::Active(j));
                    }
                    _ => {}
                }
            }
            budget.tick()?;
            i = next_probe(i, &mut perturb, mask);
        }
    }

    pub(crate) fn contains_hashed(
        &self,
        key: &Value,
        hash: i64,
        budget: &mut Budget,
    ) -> Result<bool> {
        Ok(matches!(self.lookup(key, hash, budget)?, Found::Active(_)))
    }

    pub(crate) fn add(&mut self, key: Value, budget: &mut Budget) -> Result<()> {
        let hash = key.hash(budget)?;
        self.add_hashed(key, hash, budget)
    }

    /// set_add_entry.
    pub(crate) fn add_hashed(&mut self, key: Value, hash: i64, budget: &mut Budget) -> Result<()> {
        let mask = self.mask();
        let mut perturb = hash as u64;
        let mut i = (hash as u64 as usize) & mask;
        let mut freeslot = None;
        let target = 'probe: loop {
            let probes = if i + LINEAR_PROBES <= mask {
                LINEAR_PROBES
            } else {
                0
            };
            for j in i..=i + probes {
                match &self.table[j] {
                    Slot::Empty => break 'probe j,
                    Slot::Full(h, k) if *h == hash => {
                        if equal(k, &key, budget)? {
                            return Ok(());
                        }
                    }
                    Slot::Dummy => freeslot = Some(j),
                    Slot::Full(..) => {}
                }
            }
            budget.tick()?;
            i = next_probe(i, &mut perturb, mask);
        };
        budget.alloc(Value::cost_of_items(1) + 8)?;
        if let Some(free) = freeslot {
            self.used += 1;
            self.table[free] = Slot::Full(hash, key);
            return Ok(());
        }
        self.fill += 1;
        self.used += 1;
        self.table[target] = Slot::Full(hash, key);
        if self.fill * 5 < mask * 3 {
            return Ok(());
        }
        let minused = if self.used > 50_000 {
            self.used * 2
        } else {
            self.used * 4
        };
        self.resize(minused, budget)
    }

    fn insert_clean(table: &mut [Slot], hash: i64, key: Value) {
        let mask = table.len() - 1;
        let mut perturb = hash as u64;
        let mut i = (hash as u64 as usize) & mask;
        loop {
            if matches!(table[i], Slot::Empty) {
                table[i] = Slot::Full(hash, key);
                return;
            }
            if i + LINEAR_PROBES <= mask {
                let run = &mut table[i + 1..=i + LINEAR_PROBES];
                if let Some(slot) = run.iter_mut().find(|s| matches!(s, Slot::Empty)) {
                    *slot = Slot::Full(hash, key);
                    return;
                }
            }
            i = next_probe(i, &mut perturb, mask);
        }
    }

    /// set_table_resize.
    fn resize(&mut self, minused: usize, budget: &mut Budget) -> Result<()> {
        let mut newsize = MINSIZE;
        while newsize <= minused {
            newsize <<= 1;
        }
        if newsize == MINSIZE && self.table.len() == MINSIZE && self.fill == self.used {
            return Ok(());
        }
        budget.alloc(newsize * std::mem::size_of::<Slot>())?;
        let old = std::mem::replace(&mut self.table, vec![Slot::Empty; newsize]);
        self.fill = self.used;
        for slot in old {
            if let Slot::Full(h, k) = slot {
                Self::insert_clean(&mut self.table, h, k);
            }
        }
        Ok(())
    }

    /// set_discard_entry: leaves a dummy behind.
    fn discard_hashed(&mut self, key: &Value, hash: i64, budget: &mut Budget) -> Result<bool> {
        match self.lookup(key, hash, budget)? {
            Found::Active(j) => {
                self.table[j] = Slot::Dummy;
                self.used -= 1;
                Ok(true)
            }
            Found::Absent => Ok(false),
        }
    }

    /// set_merge (also what `set(other)` and `a | b` start from).
    pub(crate) fn merge(&mut self, other: &Set, budget: &mut Budget) -> Result<()> {
        if other.used == 0 {
            return Ok(());
        }
        if (self.fill + other.used) * 5 >= self.mask() * 3 {
            self.resize((self.used + other.used) * 2, budget)?;
        }
        if self.fill == 0 && self.mask() == other.mask() && other.fill == other.used {
            budget.alloc(Value::cost_of_items(other.table.len()))?;
            self.table = other.table.clone();
            self.fill = other.fill;
            self.used = other.used;
            return Ok(());
        }
        if self.fill == 0 {
            self.fill = other.used;
            self.used = other.used;
            for (h, k) in other.iter() {
                budget.tick()?;
                Self::insert_clean(&mut self.table, h, k.clone());
            }
            return Ok(());
        }
        for (h, k) in other.iter() {
            self.add_hashed(k.clone(), h, budget)?;
        }
        Ok(())
    }

    pub(crate) fn copy(&self, budget: &mut Budget) -> Result<Set> {
        let mut s = Set::default();
        s.merge(self, budget)?;
        Ok(s)
    }

    pub(crate) fn is_subset(&self, other: &Set, budget: &mut Budget) -> Result<bool> {
        if self.len() > other.len() {
            return Ok(false);
        }
        for (h, k) in self.iter() {
            if !other.contains_hashed(k, h, budget)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// set_intersection: walks the smaller set, keeps its members.
    pub(crate) fn intersection(a: &Set, b: &Set, budget: &mut Budget) -> Result<Set> {
        let (so, other) = if b.len() > a.len() { (b, a) } else { (a, b) };
        let mut result = Set::default();
        for (h, k) in other.iter() {
            if so.contains_hashed(k, h, budget)? {
                result.add_hashed(k.clone(), h, budget)?;
            }
        }
        Ok(result)
    }

    /// set_difference.
    pub(crate) fn difference(a: &Set, b: &Set, budget: &mut Budget) -> Result<Set> {
        if (a.len() >> 2) > b.len() {
            // set_copy_and_difference: copy, then discard what b holds.
            let mut result = a.copy(budget)?;
            let owned;
            let other = if (b.len() >> 3) > result.len() {
                owned = Set::intersection(&result, b, budget)?;
                &owned
            } else {
                b
            };
            for (h, k) in other.iter() {
                result.discard_hashed(k, h, budget)?;
            }
            // "If more than 1/4th are dummies, then resize them away."
            if result.fill - result.used > result.mask() / 4 {
                let minused = if result.used > 50_000 {
                    result.used * 2
                } else {
                    result.used * 4
                };
                result.resize(minused, budget)?;
            }
            return Ok(result);
        }
        let mut result = Set::default();
        for (h, k) in a.iter() {
            if !b.contains_hashed(k, h, budget)? {
                result.add_hashed(k.clone(), h, budget)?;
            }
        }
        Ok(result)
    }

    /// set_symmetric_difference: a copy of b, then a's members toggled in.
    pub(crate) fn symmetric_difference(a: &Set, b: &Set, budget: &mut Budget) -> Result<Set> {
        let mut result = b.copy(budget)?;
        for (h, k) in a.iter() {
            if !result.discard_hashed(k, h, budget)? {
                result.add_hashed(k.clone(), h, budget)?;
            }
        }
        Ok(result)
    }
}
