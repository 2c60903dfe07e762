//! The runner's request, in Python's `marshal` format.
//!
//! The host builds the request, so it is trusted data; `marshal` decodes it in C with nothing
//! to import, where `json` would pull in `re` and compile its patterns in every sandbox (about
//! as much work as starting the interpreter). Only the types below are written, each in the
//! form every marshal version since 3.4 reads; file contents travel as raw bytes.

/// A value of the request.
#[derive(Debug)]
pub(crate) enum Value<'a> {
    Bool(bool),
    Int(i32),
    Str(&'a str),
    Bytes(&'a [u8]),
    List(Vec<Value<'a>>),
    Dict(Vec<(&'a str, Value<'a>)>),
    None,
    /// Plain data from the caller (an entrypoint's inputs), as a dict of null, booleans,
    /// integers of any size serde_json holds, floats, strings, lists and dicts; nothing with
    /// behaviour.
    Object(&'a serde_json::Map<String, serde_json::Value>),
    /// Any plain data, as `Object`'s values are.
    Json(&'a serde_json::Value),
}

/// One object is at most this long (marshal's lengths are signed 32-bit).
const MAX_LEN: usize = i32::MAX as usize;

pub(crate) fn encode(value: &Value<'_>) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    write(value, &mut out)?;
    Ok(out)
}

fn write_len(n: usize, out: &mut Vec<u8>) -> Result<(), String> {
    if n > MAX_LEN {
        return Err(format!("{n} is too large for the runner's request"));
    }
    out.extend_from_slice(&(n as u32).to_le_bytes());
    Ok(())
}

fn write_str(s: &str, out: &mut Vec<u8>) -> Result<(), String> {
    out.push(b'u');
    write_len(s.len(), out)?;
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn write(value: &Value<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    match value {
        Value::Bool(true) => out.push(b'T'),
        Value::Bool(false) => out.push(b'F'),
        Value::Int(i) => {
            out.push(b'i');
            out.extend_from_slice(&i.to_le_bytes());
        }
        Value::Str(s) => write_str(s, out)?,
        Value::Bytes(b) => {
            out.push(b's');
            write_len(b.len(), out)?;
            out.extend_from_slice(b);
        }
        Value::List(items) => {
            out.push(b'[');
            write_len(items.len(), out)?;
            for item in items {
                write(item, out)?;
            }
        }
        Value::Dict(entries) => {
            out.push(b'{');
            for (key, item) in entries {
                write_str(key, out)?;
                write(item, out)?;
            }
            out.push(b'0');
        }
        Value::None => out.push(b'N'),
        Value::Object(map) => write_object(map, out)?,
        Value::Json(v) => write_json(v, out)?,
    }
    Ok(())
}

fn write_json(value: &serde_json::Value, out: &mut Vec<u8>) -> Result<(), String> {
    use serde_json::Value as J;
    match value {
        J::Null => out.push(b'N'),
        J::Bool(b) => out.push(if *b { b'T' } else { b'F' }),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                write_int(i128::from(i), out);
            } else if let Some(u) = n.as_u64() {
                write_int(i128::from(u), out);
            } else {
                // Binary float ('g'): every f64 exactly.
                out.push(b'g');
                out.extend_from_slice(&n.as_f64().unwrap_or(f64::NAN).to_le_bytes());
            }
        }
        J::String(s) => write_str(s, out)?,
        J::Array(items) => {
            out.push(b'[');
            write_len(items.len(), out)?;
            for item in items {
                write_json(item, out)?;
            }
        }
        J::Object(map) => write_object(map, out)?,
    }
    Ok(())
}

fn write_object(
    map: &serde_json::Map<String, serde_json::Value>,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    out.push(b'{');
    for (key, item) in map {
        write_str(key, out)?;
        write_json(item, out)?;
    }
    out.push(b'0');
    Ok(())
}

/// An integer: 32-bit ('i') when it fits, else marshal's long ('l'): a signed count of
/// 15-bit digits, least significant first.
fn write_int(n: i128, out: &mut Vec<u8>) {
    if let Ok(small) = i32::try_from(n) {
        out.push(b'i');
        out.extend_from_slice(&small.to_le_bytes());
        return;
    }
    let mut magnitude = n.unsigned_abs();
    let mut digits = Vec::new();
    while magnitude > 0 {
        digits.push((magnitude & 0x7fff) as u16);
        magnitude >>= 15;
    }
    let count = digits.len() as i32;
    out.push(b'l');
    out.extend_from_slice(&(if n < 0 { -count } else { count }).to_le_bytes());
    for d in digits {
        out.extend_from_slice(&d.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    /// What Debian's Python makes of `bytes`, as JSON (bytes shown as lists of numbers).
    fn python_reads(bytes: &[u8]) -> serde_json::Value {
        let script = "import json, marshal, sys\n\
                      def plain(v):\n\
                      \x20   if isinstance(v, bytes): return {'bytes': list(v)}\n\
                      \x20   if isinstance(v, list): return [plain(x) for x in v]\n\
                      \x20   if isinstance(v, dict): return {k: plain(x) for k, x in v.items()}\n\
                      \x20   return v\n\
                      print(json.dumps(plain(marshal.loads(sys.stdin.buffer.read()))))";
        let mut child = Command::new("/usr/bin/python3")
            .args(["-I", "-S", "-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("/usr/bin/python3 is required by the test suite");
        child.stdin.take().unwrap().write_all(bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    }

    #[test]
    fn python_reads_what_is_written() {
        let long = "é".repeat(70_000);
        let inputs = serde_json::json!({
            "null": null, "t": true, "f": false, "small": -5, "i32": 2147483647,
            "past_i32": 2147483648i64, "min_i64": i64::MIN, "max_u64": u64::MAX,
            "float": 0.1, "tiny": 5e-324, "big": 1.7976931348623157e308, "neg_zero": -0.0,
            "s": "x\u{0}é", "list": [1, [2, {"k": []}]], "obj": {"a": {"b": null}}
        });
        let value = Value::Dict(vec![
            ("code", Value::Str("print('hi')\n\u{1F600} \0 end")),
            ("empty", Value::Str("")),
            ("long", Value::Str(&long)),
            ("n", Value::Int(1 << 20)),
            ("negative", Value::Int(-7)),
            ("yes", Value::Bool(true)),
            ("no", Value::Bool(false)),
            (
                "files",
                Value::List(vec![Value::Dict(vec![
                    ("path", Value::Str("a/b.bin")),
                    ("data", Value::Bytes(&[0, 255, 10, 13])),
                ])]),
            ),
            ("none", Value::List(Vec::new())),
            ("env", Value::Dict(Vec::new())),
            ("nothing", Value::None),
            ("inputs", Value::Object(inputs.as_object().unwrap())),
        ]);
        let read = python_reads(&encode(&value).unwrap());
        assert_eq!(
            read,
            serde_json::json!({
                "code": "print('hi')\n\u{1F600} \0 end",
                "empty": "",
                "long": long,
                "n": 1 << 20,
                "negative": -7,
                "yes": true,
                "no": false,
                "files": [{"path": "a/b.bin", "data": {"bytes": [0, 255, 10, 13]}}],
                "none": [],
                "env": {},
                "nothing": null,
                "inputs": inputs,
            })
        );
    }
}
