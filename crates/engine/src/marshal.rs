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
    }
    Ok(())
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
            })
        );
    }
}
