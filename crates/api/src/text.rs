//! [`Text`]: a program's captured output, held as the bytes it wrote and sent as a JSON string.
//!
//! Decoding and escaping are done as the text is written out, never ahead: an answer holds
//! the captured bytes only, not a decoded copy (each invalid byte would take three) or an
//! escaped one (each control byte takes six as `\u00XX`). [`write_deferring_texts`] lets a
//! server write everything around the texts first and stream the texts themselves in pieces.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Captured output: the bytes as written, cut at a character boundary where the capture was
/// cut. It is sent as a UTF-8 string where each invalid sequence becomes U+FFFD (as
/// [`String::from_utf8_lossy`] decodes).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Text(bytes::Bytes);

impl Text {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, shared (no copy).
    pub fn bytes(&self) -> bytes::Bytes {
        self.0.clone()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The text as it is sent.
    pub fn to_string_lossy(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.0)
    }

    /// Whether the text as sent contains `needle`.
    pub fn contains(&self, needle: &str) -> bool {
        self.to_string_lossy().contains(needle)
    }

    /// Bytes of the JSON string, quotes included.
    pub fn json_len(&self) -> u64 {
        let mut n = 2u64;
        for chunk in self.0.utf8_chunks() {
            n += chunk.valid().bytes().map(escaped_len).sum::<u64>();
            if !chunk.invalid().is_empty() {
                n += REPLACEMENT.len() as u64;
            }
        }
        n
    }

    /// Appends the escaped form of the bytes from `from` on (no quotes), stopping at the
    /// first character boundary at or after `from + at_least` bytes (or the end). Returns
    /// where it stopped: the next call goes on from there and the pieces join into exactly
    /// what one call over the whole would write.
    pub fn escape_from(&self, from: usize, at_least: usize, out: &mut Vec<u8>) -> usize {
        let rest = &self.0[from..];
        let want = at_least.max(1);
        let mut used = 0;
        for chunk in rest.utf8_chunks() {
            let valid = chunk.valid();
            if used + valid.len() > want {
                // Stop inside this run, at a character boundary.
                let mut cut = want - used;
                while !valid.is_char_boundary(cut) {
                    cut += 1;
                }
                escape_str(&valid[..cut], out);
                return from + used + cut;
            }
            escape_str(valid, out);
            used += valid.len();
            if !chunk.invalid().is_empty() {
                out.extend_from_slice(REPLACEMENT.as_bytes());
                used += chunk.invalid().len();
            }
            if used >= want {
                break;
            }
        }
        from + used
    }
}

const REPLACEMENT: &str = "\u{fffd}";

/// Bytes `b` takes in a JSON string, as serde_json escapes it.
fn escaped_len(b: u8) -> u64 {
    match b {
        b'"' | b'\\' | 0x08 | 0x09 | 0x0a | 0x0c | 0x0d => 2,
        0..=0x1f => 6,
        _ => 1,
    }
}

/// Escapes as serde_json does: `\"`, `\\`, the short forms of backspace, tab, newline, form
/// feed and carriage return, `\u00XX` (lower-case hex) for the other control characters.
fn escape_str(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if escaped_len(b) == 1 {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0a => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            0x0d => out.extend_from_slice(b"\\r"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            f.write_str(chunk.valid())?;
            if !chunk.invalid().is_empty() {
                f.write_str(REPLACEMENT)?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string_lossy(), f)
    }
}

impl From<Vec<u8>> for Text {
    fn from(mut v: Vec<u8>) -> Self {
        // What the capture grew beyond its length is not held on to.
        v.shrink_to_fit();
        Text(bytes::Bytes::from(v))
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Text::from(s.into_bytes())
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Text(bytes::Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.to_string_lossy() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.to_string_lossy() == *other
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let deferred = DEFERRED.with_borrow_mut(|d| match d {
            Some(d) => {
                d.texts.push((d.json.len(), self.clone()));
                true
            }
            None => false,
        });
        if deferred {
            // A place holder, replaced by the text when the answer is written.
            serializer.serialize_str("")
        } else {
            // serde_json escapes a Display as it goes, with no decoded copy.
            serializer.collect_str(self)
        }
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Text::from)
    }
}

impl JsonSchema for Text {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        String::schema_name()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        String::json_schema(generator)
    }
}

/// JSON with each [`Text`] left out: `json` holds `""` where each was, at the offsets given
/// with it in `texts` (in order).
#[derive(Debug, Default)]
pub struct Deferred {
    pub json: Vec<u8>,
    pub texts: Vec<(usize, Text)>,
}

thread_local! {
    static DEFERRED: RefCell<Option<Deferred>> = const { RefCell::new(None) };
}

/// Writes into `DEFERRED.json`, so that a [`Text`] being serialized knows where it goes.
struct DeferredWriter;

impl std::io::Write for DeferredWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        DEFERRED.with_borrow_mut(|d| match d {
            Some(d) => {
                d.json.extend_from_slice(buf);
                Ok(buf.len())
            }
            None => Err(std::io::Error::other("no deferred serialization under way")),
        })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Ends the deferred serialization of this thread, also when serializing panicked.
struct Reset;

impl Drop for Reset {
    fn drop(&mut self) {
        DEFERRED.with_borrow_mut(|d| *d = None);
    }
}

/// Serializes `value` as compact JSON (as [`serde_json::to_vec`] would) with every [`Text`]
/// left out and noted, so that the caller can write the texts as they are sent.
pub fn write_deferring_texts<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Deferred> {
    use serde::ser::Error as _;
    let already = DEFERRED.with_borrow_mut(|d| {
        if d.is_some() {
            return true;
        }
        *d = Some(Deferred::default());
        false
    });
    if already {
        return Err(serde_json::Error::custom(
            "a deferred serialization is already under way on this thread",
        ));
    }
    let reset = Reset;
    serde_json::to_writer(DeferredWriter, value)?;
    let done = DEFERRED.with_borrow_mut(Option::take).unwrap_or_default();
    drop(reset);
    // Every place holder must be where it was noted (nothing else wrote in between).
    for (at, _) in &done.texts {
        if done.json.get(*at..*at + 2) != Some(b"\"\"") {
            return Err(serde_json::Error::custom(
                "a text was not serialized where it was noted",
            ));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte value in every position around character boundaries, and random runs.
    fn samples() -> Vec<Vec<u8>> {
        let mut all: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"plain".to_vec(),
            b"quote \" backslash \\ slash / del \x7f".to_vec(),
            (0u8..=255).collect(),
            "é€😀 mixed".as_bytes().to_vec(),
            b"\xf0\x9f\x98".to_vec(),               // a character cut short
            b"a\xe2\x82b\xff\xfe\xc0\x80".to_vec(), // invalid sequences of each kind
            b"\xed\xa0\x80 surrogate".to_vec(),
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in [1usize, 2, 3, 7, 64, 1000, 5000] {
            for _ in 0..20 {
                let v: Vec<u8> = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        // Mostly characters that need care.
                        match seed % 6 {
                            0 => (seed >> 8) as u8 & 0x1f,
                            1 => 0x80 | ((seed >> 8) as u8 & 0x7f),
                            2 => 0xe0 | ((seed >> 8) as u8 & 0x1f),
                            3 => b'"',
                            _ => (seed >> 8) as u8,
                        }
                    })
                    .collect();
                all.push(v);
            }
        }
        all
    }

    #[test]
    fn serializes_as_serde_json_serializes_the_lossy_string() {
        for bytes in samples() {
            let text = Text::from(bytes.clone());
            let expected = serde_json::to_vec(&String::from_utf8_lossy(&bytes)).unwrap();
            assert_eq!(serde_json::to_vec(&text).unwrap(), expected, "{bytes:?}");
            assert_eq!(text.json_len(), expected.len() as u64, "{bytes:?}");
            // In pieces of every size, from anywhere the last piece stopped.
            for step in [1, 2, 3, 5, 64, 4096] {
                let mut out = b"\"".to_vec();
                let mut at = 0;
                while at < text.len() {
                    let next = text.escape_from(at, step, &mut out);
                    assert!(next > at, "no progress at {at} with step {step}");
                    at = next;
                }
                out.push(b'"');
                assert_eq!(out, expected, "step {step}: {bytes:?}");
            }
        }
    }

    #[test]
    fn a_round_trip_through_json_gives_the_lossy_text() {
        let text = Text::from(b"ok \xff end".to_vec());
        let back: Text = serde_json::from_slice(&serde_json::to_vec(&text).unwrap()).unwrap();
        assert_eq!(back, "ok \u{fffd} end");
        assert_eq!(text.to_string(), "ok \u{fffd} end");
    }

    #[derive(Serialize)]
    struct Answer {
        before: String,
        out: Text,
        nested: Vec<Text>,
        value: serde_json::Value,
        err: Text,
    }

    #[test]
    fn deferred_serialization_marks_where_each_text_goes() {
        let answer = Answer {
            before: "\"\"".into(), // looks like a place holder, and is not one
            out: Text::from(b"out \x01\xff".to_vec()),
            nested: vec![Text::from("a"), Text::default()],
            value: serde_json::json!({"out": "\"\""}),
            err: Text::from("err"),
        };
        let d = write_deferring_texts(&answer).unwrap();
        assert_eq!(d.texts.len(), 4);
        let mut joined = Vec::new();
        let mut at = 0;
        for (offset, text) in &d.texts {
            joined.extend_from_slice(&d.json[at..*offset]);
            joined.extend_from_slice(&serde_json::to_vec(text).unwrap());
            at = offset + 2;
        }
        joined.extend_from_slice(&d.json[at..]);
        assert_eq!(joined, serde_json::to_vec(&answer).unwrap());
        // And the thread is back to plain serialization.
        assert_eq!(serde_json::to_string(&answer.err).unwrap(), "\"err\"");
    }
}
