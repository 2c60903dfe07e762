//! The symbolic pickle machine: the opcodes of protocols 0-5, a stack of descriptions, marks
//! and a memo. Every length is checked against the bytes that are really there before
//! anything is read or allocated.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use num_bigint::BigInt;
use num_traits::ToPrimitive;
use serde_json::Value as Json;

use crate::{text, CallSite, DecodeError, Global, Options, Report, Verdict};

/// The opcodes, by their names in CPython's `pickletools`.
mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const PERSID: u8 = b'P';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const INST: u8 = b'i';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const OBJ: u8 = b'o';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    pub const BYTEARRAY8: u8 = 0x96;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

pub(crate) type Shared<T> = Rc<RefCell<T>>;

/// What a value on the stack is known to be.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(Rc<BigInt>),
    Float(f64),
    Complex(f64, f64),
    Str(Rc<str>),
    /// A str holding lone surrogates, which Rust's strings cannot: its code points.
    Wide(Rc<[u32]>),
    Bytes(Rc<[u8]>),
    ByteArray(Shared<Vec<u8>>),
    List(Shared<Vec<Value>>),
    Tuple(Rc<Vec<Value>>),
    Dict(Shared<Vec<(Value, Value)>>),
    Set(Shared<Vec<Value>>),
    FrozenSet(Rc<Vec<Value>>),
    /// A global that was named; `allowed` says whether the allow-list has it.
    Global(Arc<str>, bool),
    /// An allow-listed global outside the built-in forms, called with these arguments.
    Call(Arc<str>, Rc<Vec<Value>>),
    /// The result of something that is not allowed: loading would run code.
    Opaque,
}

/// Values are freed without recursion: a pickle can nest 1 000 000 tuples in a few bytes,
/// and drop glue would overflow the stack on them (the last owner of a container moves its
/// items into a work list instead).
impl Drop for Value {
    fn drop(&mut self) {
        let mut work = Vec::new();
        take_children(self, &mut work, false);
        while let Some(mut v) = work.pop() {
            take_children(&mut v, &mut work, false);
        }
    }
}

/// Moves a container's items into `work` when this is its last owner — or, with
/// `even_shared`, always (mutable containers only: emptying them breaks cycles).
fn take_children(v: &mut Value, work: &mut Vec<Value>, even_shared: bool) {
    match v {
        Value::List(l) | Value::Set(l) if even_shared || Rc::strong_count(l) == 1 => {
            work.append(&mut l.borrow_mut());
        }
        Value::Dict(d) if even_shared || Rc::strong_count(d) == 1 => {
            for (k, x) in std::mem::take(&mut *d.borrow_mut()) {
                work.push(k);
                work.push(x);
            }
        }
        Value::Tuple(t) | Value::FrozenSet(t) | Value::Call(_, t) => {
            if let Some(items) = Rc::get_mut(t) {
                work.append(items);
            }
        }
        _ => {}
    }
}

struct Malformed(usize, String);

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    op_at: usize,
    opts: &'a Options,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Memo,
    report: Report,
    /// The protocol the current pickle declared (0 until a PROTO opcode), which decides how
    /// CPython resolves globals.
    proto: u8,
    reasons: Vec<String>,
    seen_reasons: std::collections::HashSet<String>,
    /// Items copied so far (a set built from a memoized list copies it); bounded so that a
    /// small pickle cannot ask for quadratic work.
    work: u64,
    /// Where the current FRAME ends: what is read must not cross it, since CPython reading a
    /// file and CPython reading bytes would then part ways.
    frame_end: Option<usize>,
    /// The first value that loads only with a reader's setting (an `encoding=` for a STRING
    /// that is not ASCII, a raised integer digit limit), and what it is: the scan goes on past
    /// it, and the pickle cannot be safe.
    reader_dependent: Option<(usize, &'static str)>,
    /// The scan stopped on one of its own limits, not on the stream: what follows is unknown.
    limit_hit: bool,
    /// Whether CPython's C unpickler, and pickle.py's (which dill uses), still read this
    /// pickle: they differ on a few text arguments and frames, and the scan reads on while
    /// either does (values are the C one's while it reads).
    c_reads: bool,
    py_reads: bool,
    /// An INT was given the C unpickler's value where pickle.py's differs ("+1": True for
    /// the one, 1 for the other) while both read; wrong if the C one stops reading later.
    c_valued: bool,
    /// INT values as pickle.py gives them: the first pickle is run again this way when only
    /// pickle.py reads it to its end and an INT took the C value.
    py_values: bool,
    /// NaNs made so far. Each NaN object gets its own payload: CPython compares keys by
    /// identity first, so one NaN reused through the memo is one key, two NaNs are two.
    nans: u64,
}

/// The memo: a vector for the indices written in order (MEMOIZE's, and most PUTs'), a map
/// for the others, so that a pickle memoizing at every byte holds one value per entry
/// rather than a hash table's.
#[derive(Default)]
struct Memo {
    dense: Vec<Option<Value>>,
    sparse: HashMap<u64, Value>,
    /// Entries stored, as CPython counts them: MEMOIZE's next index.
    len: usize,
}

impl Memo {
    fn get(&self, idx: u64) -> Option<&Value> {
        match usize::try_from(idx) {
            Ok(i) if i < self.dense.len() => self.dense[i].as_ref(),
            _ => self.sparse.get(&idx),
        }
    }

    fn insert(&mut self, idx: u64, v: Value) {
        let new = match usize::try_from(idx) {
            Ok(i) if i < self.dense.len() => self.dense[i].replace(v).is_none(),
            Ok(i) if i == self.dense.len() => {
                // An index stored out of order before is now the vector's.
                let old = self.sparse.remove(&idx);
                self.dense.push(Some(v));
                old.is_none()
            }
            _ => self.sparse.insert(idx, v).is_none(),
        };
        self.len += new as usize;
    }

    fn drain(&mut self) -> impl Iterator<Item = Value> + '_ {
        self.len = 0;
        self.dense
            .drain(..)
            .flatten()
            .chain(self.sparse.drain().map(|(_, v)| v))
    }
}

fn bad<T>(at: usize, why: impl Into<String>) -> Result<T, Malformed> {
    Err(Malformed(at, why.into()))
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8], Malformed> {
        let left = (self.data.len() - self.pos) as u64;
        if n > left {
            return bad(
                self.op_at,
                format!("declares {n} bytes but only {left} are left"),
            );
        }
        self.within_frame(self.pos + n as usize)?;
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    /// One read up to `end` must not begin inside the current frame and end past it:
    /// pickle.py refuses that, CPython's C unpickler reading a file goes on with the bytes
    /// after the frame, and reading bytes it goes on in the frame.
    fn within_frame(&mut self, end: usize) -> Result<(), Malformed> {
        match self.frame_end {
            // Read up to its end: what follows is read from the file as it is.
            Some(f) if self.pos >= f => {
                self.frame_end = None;
                Ok(())
            }
            Some(f) if end > f => bad(
                self.op_at,
                format!("an opcode crosses the end of its FRAME at offset {f}"),
            ),
            _ => Ok(()),
        }
    }

    fn uint(&mut self, n: u64) -> Result<u64, Malformed> {
        let b = self.take(n)?;
        let mut v = 0u64;
        for (i, byte) in b.iter().enumerate() {
            v |= (*byte as u64) << (8 * i);
        }
        Ok(v)
    }

    fn int4(&mut self) -> Result<i64, Malformed> {
        Ok(self.uint(4)? as u32 as i32 as i64)
    }

    fn line(&mut self) -> Result<&'a [u8], Malformed> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                self.within_frame(self.pos + i + 1)?;
                self.pos += i + 1;
                Ok(&rest[..i])
            }
            // At the end without one, both unpicklers take what is left, less its last byte,
            // as the line (a GLOBAL there is still imported); the next read then fails.
            None => {
                self.within_frame(self.data.len())?;
                self.pos = self.data.len();
                Ok(&rest[..rest.len().saturating_sub(1)])
            }
        }
    }

    fn text_line(&mut self) -> Result<String, Malformed> {
        let l = self.line()?;
        match std::str::from_utf8(l) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => bad(self.op_at, "a text argument is not UTF-8"),
        }
    }

    fn pop(&mut self) -> Result<Value, Malformed> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return bad(self.op_at, "stack underflow");
        }
        Ok(self.stack.pop().unwrap_or(Value::Opaque))
    }

    fn top(&mut self) -> Result<&mut Value, Malformed> {
        let at = self.op_at;
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return bad(at, "stack underflow");
        }
        match self.stack.last_mut() {
            Some(v) => Ok(v),
            None => bad(at, "stack underflow"),
        }
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, Malformed> {
        match self.marks.pop() {
            Some(m) => Ok(self.stack.split_off(m)),
            None => bad(self.op_at, "no MARK to pop to"),
        }
    }

    fn unsafe_(&mut self, why: String) {
        // At most 100 reasons are kept; the report's globals and calls list everything.
        if self.reasons.len() < 100 && self.seen_reasons.insert(why.clone()) {
            self.reasons.push(why);
        }
    }

    /// The report keeps the first `MAX_RECORDS` call sites and counts the others.
    fn call_site(&mut self, opcode: &'static str, target: Option<Arc<str>>) {
        if self.report.calls.len() >= crate::MAX_RECORDS {
            self.report.calls_omitted += 1;
            return;
        }
        self.report.calls.push(CallSite {
            opcode,
            offset: self.op_at,
            target,
        });
    }

    /// A global is checked under the name CPython imports: below protocol 3 its unpickler
    /// maps Python 2 names to Python 3 ones (`__builtin__.set` loads `builtins.set`).
    fn global(&mut self, module: String, name: String) -> Result<Value, Malformed> {
        // Names are copied (the report, the qualified name): a memoized long string named
        // again and again would otherwise cost its length each time.
        self.work += 2 * (module.len() + name.len()) as u64;
        if self.work > work_limit(self.data.len()) {
            return self.over_limit("asks for more work than its size allows");
        }
        let written = format!("{module}.{name}");
        let (module, name) = if self.proto < 3 {
            compat(module, name)
        } else {
            (module, name)
        };
        let q = format!("{module}.{name}");
        let allowed = self.opts.allow.contains(&q);
        if !allowed {
            self.unsafe_(format!("global {} is not allowed", crate::shown(&q)));
        }
        if self.report.globals.len() < crate::MAX_RECORDS {
            // Kept cut: the report holds up to MAX_RECORDS of them.
            self.report.globals.push(Global {
                written: (written != q).then(|| crate::cut(&written)),
                module: crate::cut(&module),
                name: crate::cut(&name),
                offset: self.op_at,
                allowed,
            });
        } else {
            self.report.globals_omitted += 1;
        }
        Ok(Value::Global(q.into(), allowed))
    }

    fn memo_get(&mut self, idx: u64) -> Result<Value, Malformed> {
        match self.memo.get(idx) {
            Some(v) => Ok(v.clone()),
            None => bad(self.op_at, format!("memo {idx} was never stored")),
        }
    }

    fn memo_put(&mut self, idx: u64) -> Result<(), Malformed> {
        let v = self.top()?.clone();
        self.memo.insert(idx, v);
        Ok(())
    }

    fn run(&mut self) -> Result<Value, Malformed> {
        self.proto = 0;
        (self.c_reads, self.py_reads) = (true, true);
        self.c_valued = false;
        self.frame_end = None;
        loop {
            if self.pos >= self.data.len() {
                return bad(self.data.len(), "the pickle ends without STOP");
            }
            self.op_at = self.pos;
            if self.frame_end == Some(self.pos) {
                self.frame_end = None;
            }
            let op = self.data[self.pos];
            self.pos += 1;
            self.report.opcodes += 1;
            match op {
                op::STOP => {
                    // A frame that goes on past STOP: a file reader's next load() would
                    // start after the frame, not after STOP.
                    if self.frame_end.is_some_and(|f| f != self.pos) {
                        return bad(self.op_at, "the FRAME goes on past STOP");
                    }
                    return self.pop();
                }
                op::PROTO => {
                    let p = self.uint(1)? as u8;
                    if p > 5 {
                        return bad(self.op_at, format!("unsupported protocol {p}"));
                    }
                    self.report.protocol = Some(p);
                    self.proto = p;
                }
                op::FRAME => {
                    // FRAME: the opcodes follow inline, and must fit it exactly.
                    let n = self.uint(8)?;
                    if self.frame_end.is_some_and(|f| f != self.pos) {
                        return bad(self.op_at, "a FRAME begins before the previous one ends");
                    }
                    // A frame longer than what is left: the C unpickler refuses it ("pickle
                    // data was truncated"), pickle.py reading bytes takes what there is, and
                    // one reading a file asks the file for all of it (a buffered file
                    // allocates that much first). Readers differ, so it is malformed.
                    let left = (self.data.len() - self.pos) as u64;
                    if n > left {
                        return bad(
                            self.op_at,
                            format!("a FRAME of {n} bytes where {left} are left"),
                        );
                    }
                    self.frame_end = Some(self.pos + n as usize);
                }
                op::NONE => self.stack.push(Value::None),
                op::NEWTRUE => self.stack.push(Value::Bool(true)),
                op::NEWFALSE => self.stack.push(Value::Bool(false)),
                op::INT => {
                    let l = self.line()?;
                    self.readers(true, text::python_int(l, true))?;
                    let c = text::int(l);
                    let value = if !self.c_reads || self.py_values {
                        text::python_int_value(l)
                    } else {
                        let bool_to_c =
                            |v: &Result<text::Int, String>| matches!(v, Ok(text::Int::Bool(_)));
                        if self.py_reads && bool_to_c(&c) && !bool_to_c(&text::python_int_value(l))
                        {
                            self.c_valued = true;
                        }
                        c
                    };
                    match value {
                        Ok(text::Int::Bool(b)) => self.stack.push(Value::Bool(b)),
                        Ok(text::Int::Int(n)) => self.stack.push(Value::Int(Rc::new(n))),
                        Err(why) if why == text::TOO_MANY_DIGITS => self.too_many_digits(),
                        Err(why) => return bad(self.op_at, format!("INT: {why}")),
                    }
                }
                op::LONG => {
                    let l = self.line()?;
                    // CPython drops one 'L' before the end of the line (Python 2 wrote it).
                    let l = l.strip_suffix(b"L").unwrap_or(l);
                    self.readers(true, text::python_int(l, false))?;
                    match text::long(l, true) {
                        Ok(n) => self.stack.push(Value::Int(Rc::new(n))),
                        Err(why) if why == text::TOO_MANY_DIGITS => self.too_many_digits(),
                        Err(why) => return bad(self.op_at, format!("LONG: {why}")),
                    }
                }
                op::BININT => {
                    let n = self.int4()?;
                    self.stack.push(Value::Int(Rc::new(n.into())));
                }
                op::BININT1 => {
                    let n = self.uint(1)?;
                    self.stack.push(Value::Int(Rc::new(n.into())));
                }
                op::BININT2 => {
                    let n = self.uint(2)?;
                    self.stack.push(Value::Int(Rc::new(n.into())));
                }
                op::LONG1 | op::LONG4 => {
                    let n = if op == op::LONG1 {
                        self.uint(1)? as i64
                    } else {
                        self.int4()?
                    };
                    if n < 0 {
                        return bad(self.op_at, "LONG4 with a negative length");
                    }
                    let b = self.take(n as u64)?;
                    let v = if b.is_empty() {
                        BigInt::from(0)
                    } else {
                        BigInt::from_signed_bytes_le(b)
                    };
                    self.stack.push(Value::Int(Rc::new(v)));
                }
                op::FLOAT => {
                    let l = self.line()?;
                    let (c, py) = (text::c_float(l), text::python_float(l));
                    if let (Err(why), None) = (&c, py) {
                        return bad(self.op_at, format!("FLOAT: {why}"));
                    }
                    self.readers(c.is_ok(), py.is_some())?;
                    let f = if self.c_reads { c.ok() } else { py };
                    let f = self.float(f.unwrap_or_default());
                    self.stack.push(Value::Float(f));
                }
                op::BINFLOAT => {
                    let b = self.take(8)?;
                    let f = self.float(f64::from_be_bytes(b.try_into().unwrap_or([0; 8])));
                    self.stack.push(Value::Float(f));
                }
                op::STRING => {
                    let l = self.line()?.to_vec();
                    let bytes = match unquote(&l) {
                        Some(b) => b,
                        None => return bad(self.op_at, "STRING is not a quoted string"),
                    };
                    self.push_ascii(bytes);
                }
                op::BINSTRING | op::SHORT_BINSTRING => {
                    let n = if op == op::BINSTRING {
                        self.int4()?
                    } else {
                        self.uint(1)? as i64
                    };
                    if n < 0 {
                        return bad(self.op_at, "BINSTRING with a negative length");
                    }
                    let b = self.take(n as u64)?.to_vec();
                    self.push_ascii(b);
                }
                op::UNICODE => {
                    let l = self.line()?;
                    match text::raw_unicode_escape(l) {
                        Some(points) => self.stack.push(string(points)),
                        None => return bad(self.op_at, "UNICODE has a bad escape"),
                    }
                }
                op::BINUNICODE | op::SHORT_BINUNICODE | op::BINUNICODE8 => {
                    let n = match op {
                        op::BINUNICODE => self.uint(4)?,
                        op::SHORT_BINUNICODE => self.uint(1)?,
                        _ => self.uint(8)?,
                    };
                    let b = self.take(n)?;
                    let v = match std::str::from_utf8(b) {
                        Ok(s) => Value::Str(s.into()),
                        // CPython decodes with surrogatepass: lone surrogates are data.
                        Err(_) => match text::utf8_surrogatepass(b) {
                            Some(points) => string(points),
                            None => return bad(self.op_at, "BINUNICODE is not UTF-8"),
                        },
                    };
                    self.stack.push(v);
                }
                op::BINBYTES | op::SHORT_BINBYTES | op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = match op {
                        op::BINBYTES => self.uint(4)?,
                        op::SHORT_BINBYTES => self.uint(1)?,
                        _ => self.uint(8)?,
                    };
                    let b = self.take(n)?;
                    self.stack.push(if op == op::BYTEARRAY8 {
                        Value::ByteArray(Rc::new(RefCell::new(b.to_vec())))
                    } else {
                        Value::Bytes(b.into())
                    });
                }
                op::EMPTY_TUPLE => self.stack.push(Value::Tuple(Rc::default())),
                op::EMPTY_LIST => self.stack.push(Value::List(Rc::default())),
                op::EMPTY_DICT => self.stack.push(Value::Dict(Rc::default())),
                op::EMPTY_SET => self.stack.push(Value::Set(Rc::default())),
                op::MARK => self.marks.push(self.stack.len()),
                op::TUPLE => {
                    let items = self.pop_mark()?;
                    self.stack.push(Value::Tuple(Rc::new(items)));
                }
                op::TUPLE1..=op::TUPLE3 => {
                    let n = (op - op::TUPLE1 + 1) as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.stack.push(Value::Tuple(Rc::new(items)));
                }
                op::LIST => {
                    let items = self.pop_mark()?;
                    self.stack.push(Value::List(Rc::new(RefCell::new(items))));
                }
                op::DICT => {
                    let items = self.pop_mark()?;
                    if items.len() % 2 != 0 {
                        return bad(self.op_at, "DICT with an odd number of items");
                    }
                    let pairs = pairs(items);
                    for (k, _) in &pairs {
                        self.check_hashable(k, "a dict key")?;
                    }
                    self.stack.push(Value::Dict(Rc::new(RefCell::new(pairs))));
                }
                op::FROZENSET => {
                    let items = self.pop_mark()?;
                    for x in &items {
                        self.check_hashable(x, "a frozenset item")?;
                    }
                    self.stack.push(Value::FrozenSet(Rc::new(items)));
                }
                op::APPEND => {
                    let item = self.pop()?;
                    self.append(vec![item])?;
                }
                op::APPENDS => {
                    let items = self.pop_mark()?;
                    self.append(items)?;
                }
                op::SETITEM => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    self.set_items(vec![(key, value)])?;
                }
                op::SETITEMS => {
                    let items = self.pop_mark()?;
                    if items.len() % 2 != 0 {
                        return bad(self.op_at, "SETITEMS with an odd number of items");
                    }
                    self.set_items(pairs(items))?;
                }
                op::ADDITEMS => {
                    let items = self.pop_mark()?;
                    self.add_items(items)?;
                }
                op::POP => {
                    // CPython's POP takes a MARK when one is on top.
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop()?;
                    }
                }
                op::POP_MARK => {
                    self.pop_mark()?;
                }
                op::DUP => {
                    let v = self.top()?.clone();
                    self.stack.push(v);
                }
                op::PUT => {
                    let l = self.line()?;
                    self.readers(true, text::python_index(l))?;
                    match text::memo_index(l) {
                        Some(i) => self.memo_put(i)?,
                        None => return bad(self.op_at, "PUT index is not a number"),
                    }
                }
                op::BINPUT => {
                    let i = self.uint(1)?;
                    self.memo_put(i)?;
                }
                op::LONG_BINPUT => {
                    let i = self.uint(4)?;
                    self.memo_put(i)?;
                }
                op::MEMOIZE => {
                    let i = self.memo.len as u64;
                    self.memo_put(i)?;
                }
                op::GET => {
                    let l = self.line()?;
                    self.readers(true, text::python_index(l))?;
                    let v = match text::memo_index(l) {
                        Some(i) => self.memo_get(i)?,
                        None => return bad(self.op_at, "GET index is not a number"),
                    };
                    self.stack.push(v);
                }
                op::BINGET | op::LONG_BINGET => {
                    let i = if op == op::BINGET {
                        self.uint(1)?
                    } else {
                        self.uint(4)?
                    };
                    let v = self.memo_get(i)?;
                    self.stack.push(v);
                }
                op::GLOBAL => {
                    let module = self.text_line()?;
                    let name = self.text_line()?;
                    let g = self.global(module, name)?;
                    self.stack.push(g);
                }
                op::STACK_GLOBAL => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (&module, &name) {
                        (Value::Str(m), Value::Str(n)) => {
                            let g = self.global(m.to_string(), n.to_string())?;
                            self.stack.push(g);
                        }
                        _ => {
                            self.unsafe_(
                                "STACK_GLOBAL with operands that are not plain strings".into(),
                            );
                            self.call_site("STACK_GLOBAL", None);
                            self.stack.push(Value::Opaque);
                        }
                    }
                }
                op::INST => {
                    let module = self.text_line()?;
                    let name = self.text_line()?;
                    // pickle.py imports the class before it looks for the MARK.
                    let g = self.global(module, name)?;
                    let _ = self.pop_mark()?;
                    let target = global_name(&g);
                    self.call_site("INST", target.clone());
                    self.unsafe_(format!(
                        "INST instantiates {}",
                        crate::shown(&target.unwrap_or_default())
                    ));
                    self.stack.push(Value::Opaque);
                }
                op::OBJ => {
                    let mut items = self.pop_mark()?;
                    if items.is_empty() {
                        return bad(self.op_at, "OBJ without a class");
                    }
                    let cls = items.remove(0);
                    self.instantiate("OBJ", &cls);
                }
                op::NEWOBJ => {
                    let _args = self.pop()?;
                    let cls = self.pop()?;
                    self.instantiate("NEWOBJ", &cls);
                }
                op::NEWOBJ_EX => {
                    let _kwargs = self.pop()?;
                    let _args = self.pop()?;
                    let cls = self.pop()?;
                    self.instantiate("NEWOBJ_EX", &cls);
                }
                op::REDUCE => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = self.reduce(callable, args)?;
                    self.stack.push(v);
                }
                op::BUILD => {
                    let _state = self.pop()?;
                    let target = global_name(self.top()?);
                    self.call_site("BUILD", None);
                    let _ = target;
                    self.unsafe_(
                        "BUILD sets an object's state (__setstate__ or attributes)".into(),
                    );
                    *self.top()? = Value::Opaque;
                }
                op::EXT1..=op::EXT4 => {
                    let code = match op {
                        op::EXT1 => self.uint(1)? as i64,
                        op::EXT2 => self.uint(2)? as i64,
                        _ => self.int4()?,
                    };
                    let name = ["EXT1", "EXT2", "EXT4"][(op - op::EXT1) as usize];
                    self.call_site(name, None);
                    self.unsafe_(format!(
                        "{name} looks up extension code {code} in copyreg's registry"
                    ));
                    self.stack.push(Value::Opaque);
                }
                op::PERSID => {
                    self.line()?;
                    self.call_site("PERSID", None);
                    self.unsafe_("PERSID asks the loader's persistent_load".into());
                    self.stack.push(Value::Opaque);
                }
                op::BINPERSID => {
                    self.pop()?;
                    self.call_site("BINPERSID", None);
                    self.unsafe_("BINPERSID asks the loader's persistent_load".into());
                    self.stack.push(Value::Opaque);
                }
                op::NEXT_BUFFER => {
                    self.call_site("NEXT_BUFFER", None);
                    self.unsafe_("NEXT_BUFFER takes an out-of-band buffer".into());
                    self.stack.push(Value::Opaque);
                }
                op::READONLY_BUFFER => {
                    self.top()?;
                    self.call_site("READONLY_BUFFER", None);
                    self.unsafe_("READONLY_BUFFER wraps an out-of-band buffer".into());
                }
                other => return bad(self.op_at, format!("unknown opcode 0x{other:02x}")),
            }
        }
    }

    /// Python 3 reads protocol 0-2 strings as ASCII by default. One that is not loads only
    /// with another encoding (torch.load passes utf-8, pandas retries with latin1) as a value
    /// that depends on it: the scan goes on past it, and the pickle cannot be safe.
    fn push_ascii(&mut self, bytes: Vec<u8>) {
        match String::from_utf8(bytes) {
            Ok(s) if s.is_ascii() => self.stack.push(Value::Str(s.into())),
            _ => self.depends_on_reader(
                "a STRING is not ASCII: Python 3 loads it only when told an encoding, and its \
                 value depends on which",
            ),
        }
    }

    /// Whether each unpickler accepts this opcode: once neither reads the pickle, it is
    /// malformed here.
    fn readers(&mut self, c: bool, py: bool) -> Result<(), Malformed> {
        self.c_reads &= c;
        self.py_reads &= py;
        if !self.c_reads && !self.py_reads {
            return bad(
                self.op_at,
                "neither CPython's C unpickler nor pickle.py reads this pickle to here",
            );
        }
        Ok(())
    }

    fn too_many_digits(&mut self) {
        self.depends_on_reader(
            "an integer of more than 4300 digits: CPython refuses it unless \
             sys.set_int_max_str_digits raised the limit",
        );
    }

    /// A value that loads only with a reader's setting: unknown, and the pickle not safe.
    fn depends_on_reader(&mut self, why: &'static str) {
        self.reader_dependent.get_or_insert((self.op_at, why));
        self.stack.push(Value::Opaque);
    }

    /// An error of the scan's own limits.
    fn over_limit<T>(&mut self, why: &str) -> Result<T, Malformed> {
        self.limit_hit = true;
        bad(self.op_at, why)
    }

    /// APPEND(S): CPython extends a list, and calls `extend` (or `append`) of anything else.
    fn append(&mut self, items: Vec<Value>) -> Result<(), Malformed> {
        let at = self.op_at;
        let target = self.top()?;
        if items.is_empty() {
            // The C unpickler does nothing; pickle.py still looks the method up.
            let has = matches!(
                target,
                Value::List(_)
                    | Value::ByteArray(_)
                    | Value::Opaque
                    | Value::Global(..)
                    | Value::Call(..)
            );
            return self.readers(true, has);
        }
        let why = match target {
            Value::List(l) => {
                l.borrow_mut().extend(items);
                None
            }
            Value::ByteArray(b) => {
                let bytes: Option<Vec<u8>> = items.iter().map(byte_value).collect();
                match bytes {
                    Some(bytes) => b.borrow_mut().extend(bytes),
                    None => return bad(at, "APPEND to a bytearray of something not a byte"),
                }
                None
            }
            other => call_on(other, "APPEND", "extend or append", at)?,
        };
        if let Some(why) = why {
            self.unsafe_(why);
        }
        Ok(())
    }

    /// SETITEM(S): a dict's items, or `__setitem__` of anything else.
    fn set_items(&mut self, items: Vec<(Value, Value)>) -> Result<(), Malformed> {
        let at = self.op_at;
        if items.is_empty() {
            self.top()?;
            return Ok(());
        }
        if matches!(self.top()?, Value::Dict(_)) {
            for (k, _) in &items {
                self.check_hashable(k, "a dict key")?;
            }
        }
        let target = self.top()?;
        let why = match target {
            Value::Dict(d) => {
                d.borrow_mut().extend(items);
                None
            }
            Value::List(l) => {
                let mut l = l.borrow_mut();
                for (k, v) in items {
                    match index(&k, l.len()) {
                        Some(i) => l[i] = v,
                        None => return bad(at, "SETITEM on a list with a bad index"),
                    }
                }
                None
            }
            Value::ByteArray(b) => {
                let mut b = b.borrow_mut();
                for (k, v) in items {
                    match (index(&k, b.len()), byte_value(&v)) {
                        (Some(i), Some(v)) => b[i] = v,
                        _ => return bad(at, "SETITEM on a bytearray with a bad index or byte"),
                    }
                }
                None
            }
            other => call_on(other, "SETITEM", "__setitem__", at)?,
        };
        if let Some(why) = why {
            self.unsafe_(why);
        }
        Ok(())
    }

    /// ADDITEMS: a set's items, or `add` of anything else.
    fn add_items(&mut self, items: Vec<Value>) -> Result<(), Malformed> {
        let at = self.op_at;
        if items.is_empty() {
            // The C unpickler does nothing; pickle.py still looks `add` up.
            let has = matches!(
                self.top()?,
                Value::Set(_) | Value::Opaque | Value::Global(..) | Value::Call(..)
            );
            return self.readers(true, has);
        }
        if matches!(self.top()?, Value::Set(_)) {
            for x in &items {
                self.check_hashable(x, "a set item")?;
            }
        }
        let target = self.top()?;
        let why = match target {
            Value::Set(s) => {
                s.borrow_mut().extend(items);
                None
            }
            other => call_on(other, "ADDITEMS", "add", at)?,
        };
        if let Some(why) = why {
            self.unsafe_(why);
        }
        Ok(())
    }

    /// CPython hashes dict keys and set items as it loads them: a list among them fails the
    /// load. Tuples are looked into (without recursion); the work counts against the budget.
    fn check_hashable(&mut self, v: &Value, role: &str) -> Result<(), Malformed> {
        let mut todo = vec![v];
        while let Some(x) = todo.pop() {
            self.work += 1;
            if self.work > work_limit(self.data.len()) {
                return self.over_limit("asks for more work than its size allows");
            }
            match x {
                Value::List(_) | Value::Dict(_) | Value::Set(_) | Value::ByteArray(_) => {
                    return bad(
                        self.op_at,
                        format!(
                            "{role} is unhashable ({}): CPython fails to load it",
                            describe(x)
                        ),
                    );
                }
                // A frozenset's items were checked when it was built.
                Value::Tuple(t) => todo.extend(t.iter()),
                _ => {}
            }
        }
        Ok(())
    }

    /// A float object: a NaN gets a payload no other NaN object has (its bits are its
    /// identity, as far as keys go; nothing shows them).
    fn float(&mut self, f: f64) -> f64 {
        if !f.is_nan() {
            return f;
        }
        self.nans += 1;
        f64::from_bits(0x7ff8_0000_0000_0000 | (self.nans & 0x0007_ffff_ffff_ffff))
    }

    /// A complex object: a NaN part gets a new payload, since the complex is not the float
    /// it was made from.
    fn complex(&mut self, re: f64, im: f64) -> Value {
        if re.is_nan() || im.is_nan() {
            let nan = self.float(f64::NAN);
            let tag = |x: f64| if x.is_nan() { nan } else { x };
            return Value::Complex(tag(re), tag(im));
        }
        Value::Complex(re, im)
    }

    fn instantiate(&mut self, opcode: &'static str, cls: &Value) {
        let target = global_name(cls);
        self.call_site(opcode, target.clone());
        self.unsafe_(format!(
            "{opcode} instantiates {}",
            target.map_or_else(|| "an unknown class".into(), |t| crate::shown(&t))
        ));
        self.stack.push(Value::Opaque);
    }

    /// REDUCE: only allow-listed globals, and for the built-in forms only the argument
    /// shapes CPython writes for plain data.
    fn reduce(&mut self, callable: Value, args: Value) -> Result<Value, Malformed> {
        let name = global_name(&callable);
        self.call_site("REDUCE", name.clone());
        let (q, allowed) = match &callable {
            Value::Global(q, allowed) => (q.clone(), *allowed),
            _ => {
                self.unsafe_("REDUCE calls something that is not a named global".into());
                return Ok(Value::Opaque);
            }
        };
        if !allowed {
            // The global itself was already reported.
            return Ok(Value::Opaque);
        }
        let Value::Tuple(args) = &args else {
            self.unsafe_(format!(
                "REDUCE calls {} with arguments that are not a tuple",
                crate::shown(&q)
            ));
            return Ok(Value::Opaque);
        };
        let short = q.strip_prefix("builtins.").unwrap_or(&q);
        // What building the value copies: a list's items, a string's or bytes' bytes.
        let copied: u64 = args
            .iter()
            .map(|a| match a {
                Value::List(l) => l.borrow().len() as u64,
                Value::Str(s) => s.len() as u64,
                Value::Bytes(b) => b.len() as u64,
                _ => 0,
            })
            .sum();
        self.work += copied;
        if self.work > work_limit(self.data.len()) {
            return self.over_limit("asks for more copying than its size allows");
        }
        if let ("set" | "frozenset", [Value::List(l)]) = (short, &args[..]) {
            for x in l.borrow().iter() {
                self.check_hashable(x, "a set item")?;
            }
        }
        let bytearray = |b: Vec<u8>| Value::ByteArray(Rc::new(RefCell::new(b)));
        let built = match (short, &args[..]) {
            ("set", []) => Some(Value::Set(Rc::default())),
            ("set", [Value::List(l)]) => {
                Some(Value::Set(Rc::new(RefCell::new(l.borrow().clone()))))
            }
            ("frozenset", []) => Some(Value::FrozenSet(Rc::default())),
            ("frozenset", [Value::List(l)]) => Some(Value::FrozenSet(Rc::new(l.borrow().clone()))),
            ("bytearray", []) => Some(bytearray(Vec::new())),
            ("bytearray", [Value::Bytes(b)]) => Some(bytearray(b.to_vec())),
            ("bytearray", [Value::Str(s), Value::Str(enc)]) if is_latin1(enc) => {
                latin1(s).map(bytearray)
            }
            ("bytes", []) => Some(Value::Bytes(Rc::new([]))),
            ("_codecs.encode", [Value::Str(s), Value::Str(enc)]) if is_latin1(enc) => {
                latin1(s).map(|b| Value::Bytes(b.into()))
            }
            ("complex", [Value::Float(re), Value::Float(im)]) => Some(self.complex(*re, *im)),
            ("complex", [Value::Float(re)]) => Some(self.complex(*re, 0.0)),
            ("collections.OrderedDict", []) => Some(Value::Dict(Rc::default())),
            // A new object, told apart from any other call by its own allocation (keys
            // compare by identity first).
            (_, _) if !crate::DEFAULT_ALLOW.contains(&&*q) => {
                Some(Value::Call(q.clone(), Rc::new(args.to_vec())))
            }
            _ => None,
        };
        match built {
            Some(v) => Ok(v),
            None => {
                self.unsafe_(format!(
                    "{} is called with arguments plain data never has",
                    crate::shown(&q)
                ));
                Ok(Value::Opaque)
            }
        }
    }
}

/// Items a pickle of `len` bytes may have copied, and bytes it may decode to: generous for
/// data, far below what sharing could multiply, and never more than 2**30 (seconds of work).
fn work_limit(len: usize) -> u64 {
    (64 * (len as u64).max(1 << 16)).min(1 << 30)
}

fn pairs(items: Vec<Value>) -> Vec<(Value, Value)> {
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    out
}

/// A str from its code points.
fn string(points: Vec<u32>) -> Value {
    match points
        .iter()
        .map(|&p| char::from_u32(p))
        .collect::<Option<String>>()
    {
        Some(s) => Value::Str(s.into()),
        None => Value::Wide(points.into()),
    }
}

/// CPython's name for what a value is, in messages.
fn describe(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(_) => "a bool".into(),
        Value::Int(_) => "an int".into(),
        Value::Float(_) => "a float".into(),
        Value::Complex(..) => "a complex".into(),
        Value::Str(_) | Value::Wide(_) => "a str".into(),
        Value::Bytes(_) => "bytes".into(),
        Value::ByteArray(_) => "a bytearray".into(),
        Value::List(_) => "a list".into(),
        Value::Tuple(_) => "a tuple".into(),
        Value::Dict(_) => "a dict".into(),
        Value::Set(_) => "a set".into(),
        Value::FrozenSet(_) => "a frozenset".into(),
        Value::Global(q, _) => crate::shown(q),
        Value::Call(q, _) => format!("what {} returned", crate::shown(q)),
        Value::Opaque => "an unknown object".into(),
    }
}

/// A target that APPEND, SETITEM or ADDITEMS does not fill by itself: CPython calls its
/// `method` — code, for an allowed global or what one returned (then unknown; the reason is
/// returned) — and fails on a value that has no such method.
fn call_on(
    target: &mut Value,
    opcode: &str,
    method: &str,
    at: usize,
) -> Result<Option<String>, Malformed> {
    match target {
        Value::Opaque => Ok(None),
        Value::Global(..) | Value::Call(..) => {
            let name = describe(target);
            *target = Value::Opaque;
            Ok(Some(format!("{opcode} calls {method} of {name}")))
        }
        other => bad(
            at,
            format!("{opcode} on {}, which has no {method}", describe(other)),
        ),
    }
}

/// An int (or bool) as a Python index into a sequence of `len` items.
fn index(k: &Value, len: usize) -> Option<usize> {
    let i = match k {
        Value::Bool(b) => *b as i64,
        Value::Int(n) => n.to_i64()?,
        _ => return None,
    };
    let i = if i < 0 { i.checked_add(len as i64)? } else { i };
    usize::try_from(i).ok().filter(|&i| i < len)
}

/// An int (or bool) that fits a byte, as bytearray's item assignment takes it.
fn byte_value(v: &Value) -> Option<u8> {
    match v {
        Value::Bool(b) => Some(*b as u8),
        Value::Int(n) => n.to_u8(),
        _ => None,
    }
}

/// `_compat_pickle`'s mapping of a Python 2 name, as CPython applies it below protocol 3.
fn compat(module: String, name: String) -> (String, String) {
    if let Some((_, (m, n))) = crate::compat::NAME_MAPPING
        .iter()
        .find(|((m, n), _)| *m == module && *n == name)
    {
        return (m.to_string(), n.to_string());
    }
    match crate::compat::IMPORT_MAPPING
        .iter()
        .find(|(m, _)| *m == module)
    {
        Some((_, m)) => (m.to_string(), name),
        None => (module, name),
    }
}

fn global_name(v: &Value) -> Option<Arc<str>> {
    match v {
        Value::Global(q, _) => Some(q.clone()),
        _ => None,
    }
}

fn is_latin1(enc: &str) -> bool {
    matches!(enc, "latin1" | "latin-1" | "latin_1" | "iso-8859-1")
}

fn latin1(s: &str) -> Option<Vec<u8>> {
    s.chars().map(|c| u8::try_from(c as u32).ok()).collect()
}

/// A protocol-0 STRING argument: a Python bytes repr in quotes.
fn unquote(l: &[u8]) -> Option<Vec<u8>> {
    let (&q, rest) = l.split_first()?;
    if (q != b'\'' && q != b'"') || rest.last() != Some(&q) {
        return None;
    }
    let body = &rest[..rest.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        let e = *body.get(i + 1)?;
        i += 2;
        match e {
            b'\\' | b'\'' | b'"' => out.push(e),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'\n' => {}
            b'x' => {
                let h = std::str::from_utf8(body.get(i..i + 2)?).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                let mut k = 0;
                while k < 2 && i < body.len() && (b'0'..=b'7').contains(&body[i]) {
                    v = v * 8 + (body[i] - b'0') as u32;
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Some(out)
}

fn machine<'a>(data: &'a [u8], opts: &'a Options) -> Machine<'a> {
    Machine {
        data,
        pos: 0,
        op_at: 0,
        opts,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
        report: Report::new(data.len()),
        proto: 0,
        frame_end: None,
        reader_dependent: None,
        limit_hit: false,
        c_reads: true,
        py_reads: true,
        c_valued: false,
        py_values: false,
        nans: 0,
        reasons: Vec::new(),
        seen_reasons: std::collections::HashSet::new(),
        work: 0,
    }
}

/// Takes values apart without recursion: a pickle can nest containers 100 000 deep (drop glue
/// would overflow the stack) or make one contain itself (reference counts would never free
/// it). Mutable containers are emptied even when shared, which breaks every cycle.
fn dismantle(values: impl IntoIterator<Item = Value>) {
    let mut work = Vec::new();
    for v in values {
        work.push(v);
        while let Some(mut v) = work.pop() {
            take_children(&mut v, &mut work, true);
        }
    }
}

/// Runs the machine over the first pickle, hands `snapshot` its value before anything else
/// can change it, then goes on with the pickles that follow; takes everything apart at the
/// end.
fn execute<T>(
    data: &[u8],
    opts: &Options,
    snapshot: impl FnOnce(&Value) -> T,
) -> (Report, Option<T>) {
    let mut m = machine(data, opts);
    if data.len() > opts.max_bytes {
        m.report.verdict = Verdict::Malformed {
            offset: 0,
            reason: format!(
                "{} bytes, more than the {} accepted",
                data.len(),
                opts.max_bytes
            ),
        };
        return (m.report, None);
    }
    let mut first = m.run();
    if first.is_ok() && m.c_valued && !m.c_reads {
        // Only pickle.py reads this pickle to its end: its INT values, from the start.
        dismantle(std::mem::take(&mut m.stack));
        dismantle(m.memo.drain());
        dismantle(first.ok());
        m = machine(data, opts);
        m.py_values = true;
        first = m.run();
    }
    let taken = first.as_ref().ok().map(snapshot);
    // pickle.loads ignores what follows STOP, but a file can hold pickles one after another
    // (load() called again, torch's legacy format): each that follows is scanned, with the
    // memo kept (one Unpickler's load() called again keeps it; a new Unpickler would reach
    // no further). Bytes whose very first opcode fails are no pickle, and left alone as
    // CPython leaves them; a pickle that breaks later hides what a reader would do next.
    let mut done = Vec::new();
    let mut broken = first
        .as_ref()
        .err()
        .map(|Malformed(at, why)| (*at, why.clone()));
    if first.is_ok() {
        m.report.pickles = 1;
        while m.pos < data.len() {
            let start = m.pos;
            done.append(&mut m.stack);
            m.marks.clear();
            match m.run() {
                Ok(v) => {
                    m.report.pickles += 1;
                    done.push(v);
                }
                // No opcode at all, or one every reader refuses: no pickle. A stop on the
                // scan's own limits is not the stream's.
                Err(Malformed(at, _)) if at == start && !m.limit_hit => {
                    m.report.trailing_bytes = data.len() - start;
                    break;
                }
                Err(Malformed(at, why)) => {
                    broken = Some((
                        at,
                        format!("the pickle that follows at offset {start} breaks: {why}"),
                    ));
                    break;
                }
            }
        }
    }
    let mut report = std::mem::replace(&mut m.report, Report::new(0));
    report.verdict = match (broken, m.reasons.is_empty()) {
        // What ran before the stream broke would have run in CPython too.
        (Some((offset, reason)), false) => {
            let mut reasons = std::mem::take(&mut m.reasons);
            reasons.push(format!(
                "and then the stream is malformed at offset {offset}: {reason}"
            ));
            Verdict::Unsafe { reasons }
        }
        (Some((offset, reason)), true) => Verdict::Malformed { offset, reason },
        (None, false) => Verdict::Unsafe {
            reasons: std::mem::take(&mut m.reasons),
        },
        (None, true) => match m.reader_dependent {
            Some((offset, why)) => Verdict::Malformed {
                offset,
                reason: why.into(),
            },
            None => Verdict::Safe,
        },
    };
    // Each part on its own: one vector of them all would copy every value once more.
    dismantle(std::mem::take(&mut m.stack));
    dismantle(done);
    dismantle(m.memo.drain());
    dismantle(first.ok());
    (report, taken)
}

/// Scans a pickle: its globals, its call sites, and the verdict.
pub fn scan(data: &[u8], opts: &Options) -> Report {
    execute(data, opts, |_| ()).0
}

/// The JSON form of a `safe` pickle; anything else is refused.
pub fn decode(data: &[u8], opts: &Options) -> Result<Json, DecodeError> {
    // Converted before the pickles that follow run: they could change it through the memo,
    // and pickle.loads returns it as it was.
    let (report, json) = execute(data, opts, |v| {
        crate::json::to_json(v, opts.max_depth, work_limit(data.len()))
    });
    match report.verdict {
        Verdict::Safe => json.unwrap_or_else(|| Err(DecodeError::Unsafe(vec!["no value".into()]))),
        Verdict::Unsafe { reasons } => Err(DecodeError::Unsafe(reasons)),
        Verdict::Malformed { offset, reason } => Err(DecodeError::Malformed { offset, reason }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memo counts and finds entries as CPython's dict does, whichever part holds them.
    #[test]
    fn the_memo_is_one_dict_in_two_parts() {
        let mut memo = Memo::default();
        let int = |n: i64| Value::Int(Rc::new(n.into()));
        let at = |m: &Memo, i: u64| match m.get(i) {
            Some(Value::Int(n)) => Some(i64::try_from(&**n).unwrap()),
            Some(_) => panic!("not an int"),
            None => None,
        };
        memo.insert(2, int(20)); // out of order: the map
        memo.insert(0, int(0));
        memo.insert(0, int(1)); // replaced, not counted again
        assert_eq!(
            (memo.len, at(&memo, 0), at(&memo, 2)),
            (2, Some(1), Some(20))
        );
        memo.insert(1, int(10));
        memo.insert(2, int(21)); // the vector reaches 2: the map's entry is replaced
        assert_eq!((memo.len, at(&memo, 2), at(&memo, 3)), (3, Some(21), None));
        memo.insert(u64::MAX, int(7));
        assert_eq!((memo.len, at(&memo, u64::MAX)), (4, Some(7)));
        assert_eq!(memo.drain().count(), 4);
        assert_eq!((memo.len, at(&memo, 0)), (0, None));
    }

    /// A list that contains itself is freed once taken apart (reference counts alone would
    /// keep it forever).
    #[test]
    fn dismantling_frees_cycles() {
        let list: Shared<Vec<Value>> = Rc::default();
        list.borrow_mut().push(Value::List(list.clone()));
        let dict: Shared<Vec<(Value, Value)>> = Rc::default();
        dict.borrow_mut()
            .push((Value::None, Value::Dict(dict.clone())));
        let (weak_list, weak_dict) = (Rc::downgrade(&list), Rc::downgrade(&dict));
        dismantle(vec![
            Value::List(list),
            Value::Tuple(Rc::new(vec![Value::Dict(dict)])),
        ]);
        assert!(weak_list.upgrade().is_none() && weak_dict.upgrade().is_none());
    }
}
